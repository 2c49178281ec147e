"""Build of byteps_thc: the Python package and its extension byteps_thc._C.

The extension holds the codec cores (csrc/thc and csrc/lhc, plain C++17, with the headers they
share in csrc/common) and their thin binding (csrc/python).
Sources and flags come from csrc/build_facts.py, which every build of the cores reads: SIMD kernels
are compiled per file with their own -m flags and chosen at run time; nothing is built with
-march=native. When nvcc is found, the CUDA twins (csrc/thc/cuda) are compiled and linked too
(THC_WITH_CUDA=1); THC_CUDA=0 in the environment skips them, THC_CUDA=1 requires them.

The BytePS fork is built separately (`make byteps`, scripts/build_byteps.sh).
"""
import importlib.util
import os
import shutil
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
CORE = ROOT / "csrc" / "thc"


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# The sources and flags of the codec cores (csrc/build_facts.py: every build of them reads it).
FACTS = _load("build_facts", ROOT / "csrc" / "build_facts.py")
# Every file of the extension gets the codec flags (per file: the ISA rule); these are the
# extension's own: a shared object that exports only the module's init.
EXTENSION_FLAGS = ["-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra", "-Wno-unused-parameter"]


def core_sources():
    srcs = [str(Path(p).relative_to(ROOT)) for p in FACTS.core_sources(ROOT / "csrc")]
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
            extra = list(extra_postargs) + FACTS.core_flags(src)
            return original(obj, src, ext, cc_args, extra, pp_opts)

        self.compiler._compile = compile_one
        nvcc = find_nvcc()
        if nvcc:
            # (nvcc, build_temp, root) -> (objects, link_args, macros)
            cuda_objects = _load("thc_cuda_build", CORE / "cuda" / "build.py").cuda_objects
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
        # headers, CUDA sources and the build facts: a change to any of them rebuilds the extension
        depends=sorted(str(p.relative_to(ROOT)) for pat in ("*.h", "*.cuh", "*.cu")
                       for p in (ROOT / "csrc").rglob(pat) if "byteps" not in p.parts)
        + ["csrc/build_facts.py"],
        extra_compile_args=EXTENSION_FLAGS,
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
