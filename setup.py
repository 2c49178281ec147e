"""Build of byteps_thc: the Python package and its extension byteps_thc._C.

The extension holds the codec cores (csrc/thc and csrc/lhc, plain C++17, with the headers they
share in csrc/common) and their thin binding (csrc/python).
SIMD kernels are compiled per file with their own -m flags and chosen at run time; nothing is built
with -march=native. When nvcc is found, the CUDA twins (csrc/thc/cuda) are compiled and linked too
(THC_WITH_CUDA=1); THC_CUDA=0 in the environment skips them, THC_CUDA=1 requires them.

The BytePS fork is built separately (`make byteps`, scripts/build_byteps.sh).
"""
import os
import shutil
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
CORE = ROOT / "csrc" / "thc"
CORES = (CORE, ROOT / "csrc" / "lhc")  # THC's codec core and LHC's

# Flags every file gets. -ffp-contract=off: the kernels must not fuse a*b+c (docs/ALGORITHM.md).
COMMON = ["-std=c++17", "-O3", "-fPIC", "-ffp-contract=off", "-fno-math-errno",
          "-fvisibility=hidden", "-Wall", "-Wextra", "-Wno-unused-parameter"]
# Extra flags for the files of one instruction set (x86-64 only; other machines get the portable
# kernels alone). A file's ISA is the suffix of its stem: kernels_avx2.cc, kernels_avx512.cc.
ISA_FLAGS = {
    "avx2": ["-mavx2", "-mbmi2"],
    "avx512": ["-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mbmi2"],
}


def is_x86():
    import platform
    return platform.machine().lower() in ("x86_64", "amd64")


def core_sources():
    srcs = []
    for p in sorted(q for core in CORES for q in core.glob("*.cc")):
        isa = p.stem.rsplit("_", 1)[-1]
        if isa in ISA_FLAGS and not is_x86():
            continue
        srcs.append(str(p.relative_to(ROOT)))
    return srcs + ["csrc/python/binding.cc", "csrc/python/binding_lhc.cc"]


def find_nvcc():
    if os.environ.get("THC_CUDA") == "0":
        return None
    nvcc = shutil.which("nvcc")
    if not nvcc:
        cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
        cand = Path(cuda_home) / "bin" / "nvcc"
        nvcc = str(cand) if cand.exists() else None
    if not nvcc and os.environ.get("THC_CUDA") == "1":
        sys.exit("THC_CUDA=1 but nvcc was not found: set CUDA_HOME or put nvcc on PATH")
    return nvcc


class BuildExt(build_ext):
    """Per-file ISA flags, and the CUDA objects when nvcc is there."""

    def build_extensions(self):
        original = self.compiler._compile

        def compile_one(obj, src, ext, cc_args, extra_postargs, pp_opts):
            isa = Path(src).stem.rsplit("_", 1)[-1]
            extra = list(extra_postargs) + ISA_FLAGS.get(isa, [])
            return original(obj, src, ext, cc_args, extra, pp_opts)

        self.compiler._compile = compile_one
        nvcc = find_nvcc()
        if nvcc:
            import importlib.util
            spec = importlib.util.spec_from_file_location("thc_cuda_build",
                                                          CORE / "cuda" / "build.py")
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            # (nvcc, build_temp, root) -> (objects, link_args, macros)
            cuda_objects = mod.cuda_objects
            for e in self.extensions:
                objs, link_args, macros = cuda_objects(nvcc, Path(self.build_temp), ROOT)
                e.extra_objects = list(e.extra_objects or []) + objs
                e.depends = list(e.depends or []) + [str(o) for o in objs]  # relink on CUDA changes
                e.extra_link_args = list(e.extra_link_args or []) + link_args
                e.define_macros = list(e.define_macros or []) + macros
        # An extension built as the other variant (THC_CUDA=0 against nvcc found, or the reverse)
        # is rebuilt whole: no source is newer than it, but its macros and objects differ.
        variant = "cuda" if nvcc else "cpu"
        marker = Path(self.build_temp) / "thc_variant"
        if not marker.exists() or marker.read_text() != variant:
            self.force = True
        super().build_extensions()
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(variant)


def extension():
    import pybind11
    return Extension(
        "byteps_thc._C",
        sources=core_sources(),
        include_dirs=[str(ROOT / "csrc"), pybind11.get_include()],
        # headers and CUDA sources: a change to any of them rebuilds the extension
        depends=sorted(str(p.relative_to(ROOT)) for pat in ("*.h", "*.cuh", "*.cu")
                       for p in (ROOT / "csrc").rglob(pat) if "byteps" not in p.parts),
        extra_compile_args=COMMON,
        language="c++",
    )


setup(
    name="byteps-thc",
    version="0.1.0",
    description="THC (Tensor Homomorphic Compression) for BytePS",
    license="Apache-2.0",
    packages=find_packages(include=["byteps_thc", "byteps_thc.*"]),
    python_requires=">=3.9",
    install_requires=["numpy"],
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildExt},
    entry_points={"console_scripts": ["bpslaunch=byteps_thc.launch:main",
                                    "bpslaunch-thc=byteps_thc.launch:main"]},
)
