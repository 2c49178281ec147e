"""Compile the CUDA twins (csrc/thc/cuda) for setup.py.

setup.py calls `cuda_objects(nvcc, build_temp, root)` when nvcc is found; it returns the object
files to link into byteps_thc._C, the link arguments (libcudart, with an rpath) and the macro
THC_WITH_CUDA=1 (which makes csrc/python/binding.cc register the CUDA bindings).

Architectures: SASS for A100 (sm_80) and Hopper (sm_90), plus Blackwell (sm_100, sm_120) when the
nvcc knows them (12.8+), and PTX of the newest for what comes later. THC_CUDA_ARCHS="90" (or
"80;90", ...) overrides the list, e.g. on a machine that only needs its own GPU. Objects are reused
when neither the sources nor the flags changed (a stamp beside them).
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import importlib.util
import os
import re
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _build_facts():
    spec = importlib.util.spec_from_file_location("build_facts", HERE.parents[1] / "build_facts.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# The codec's build description (csrc/build_facts.py): nvcc's level and FP rules, the host
# compiler's FP rules; these objects link into byteps_thc._C, a shared object exporting one init.
FACTS = _build_facts()
FLAGS = (FACTS.NVCC + FACTS.xcompiler(["-fPIC", "-fvisibility=hidden"] + FACTS.FP)
         + ["-DTHC_WITH_CUDA=1"])


def nvcc_version(nvcc: str) -> tuple:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"release (\d+)\.(\d+)", out)
    if not m:
        raise RuntimeError(f"cannot read the CUDA version from `{nvcc} --version`:\n{out}")
    return int(m.group(1)), int(m.group(2))


def choose_archs(nvcc: str) -> list[int]:
    env = os.environ.get("THC_CUDA_ARCHS", "").strip()
    if env:
        return [int(a) for a in re.split(r"[;, ]+", env) if a]
    major, minor = nvcc_version(nvcc)
    if (major, minor) < (11, 8):
        raise RuntimeError(f"nvcc {major}.{minor} is too old: sm_90 needs CUDA 11.8 or newer")
    archs = [80, 90]
    if (major, minor) >= (12, 8):
        archs += [100, 120]
    return archs


def gencode_flags(archs: list[int]) -> list[str]:
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    newest = max(archs)
    flags.append(f"-gencode=arch=compute_{newest},code=compute_{newest}")
    return flags


def _libdir_of(home: Path):
    for cand in (home / "lib64", home / "lib", home / "targets" / "x86_64-linux" / "lib",
                 home / "targets" / "sbsa-linux" / "lib"):
        if list(cand.glob("libcudart.so*")):
            return cand
    return None


def cuda_libdir(nvcc: str) -> Path:
    """The folder of libcudart: CUDA_HOME, then nvcc's own tree (as found, then with symlinks
    resolved: /usr/local/bin/nvcc may point into /usr/local/cuda), then /usr/local/cuda."""
    homes = [Path(os.environ["CUDA_HOME"])] if os.environ.get("CUDA_HOME") else []
    homes += [Path(nvcc).parent.parent, Path(nvcc).resolve().parent.parent, Path("/usr/local/cuda")]
    for home in homes:
        lib = _libdir_of(home)
        if lib is not None:
            return lib
    raise RuntimeError(f"libcudart not found near {nvcc} (tried {', '.join(map(str, homes))}); "
                       "set CUDA_HOME, or THC_CUDA=0 for a CPU-only build")


def _binding_includes() -> list[str]:
    import pybind11
    inc = [pybind11.get_include(), sysconfig.get_paths()["include"]]
    plat = sysconfig.get_paths().get("platinclude")
    if plat and plat not in inc:
        inc.append(plat)
    return [f"-I{p}" for p in inc]


def _compile(cmd: list[str], label: str) -> float:
    t0 = time.time()
    print(f"[thc cuda] nvcc {label}", flush=True)
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.stderr.write(res.stdout + res.stderr)
        raise RuntimeError(f"nvcc failed on {label} (command: {' '.join(cmd)})")
    if res.stderr.strip():
        sys.stderr.write(res.stderr)
    return time.time() - t0


def cuda_objects(nvcc, build_temp: Path, root: Path, include_root: Path = None,
                 binding: bool = True):
    """(objects, link args, macros) of the kernels, and of their pybind11 binding when `binding`.
    `include_root` holds thc/ and common/ (default root/csrc; the BytePS tree's root when the
    fork's CUDA torch plugin links the kernels without the binding)."""
    nvcc = str(nvcc)
    root = Path(root)
    include_root = Path(include_root) if include_root else root / "csrc"
    archs = choose_archs(nvcc)
    out_dir = Path(build_temp) / "thc_cuda"
    out_dir.mkdir(parents=True, exist_ok=True)
    includes = [f"-I{include_root}"]
    cu_flags = FLAGS + gencode_flags(archs) + includes
    binding = root / "csrc" / "python" / "binding_cuda.cc" if binding else None
    # The binding shares pybind11's inline classes with the C++ files setuptools compiles with
    # Python's CFLAGS, which define NDEBUG; without it pybind11's arg_v (a default argument) has
    # another layout in this object, and the linker keeps one destructor for both: an invalid
    # free at import.
    sources = sorted(HERE.glob("*.cu"))
    jobs = [(src, out_dir / (src.stem + ".o"), [nvcc] + cu_flags) for src in sources]
    if binding is not None and binding.exists():
        cc_flags = FLAGS + includes + _binding_includes() + ["-DNDEBUG"]
        jobs.append((binding, out_dir / "binding_cuda.o", [nvcc] + cc_flags))

    # Reuse the objects when the sources, headers and flags are unchanged (the headers of
    # csrc/common included: common.cuh and thc.h include them).
    h = hashlib.sha256()
    common = sorted((include_root / "common").glob("*.h"))
    for p in sorted(HERE.glob("*")) + [binding, include_root / "thc" / "thc.h"] + common + [
            FACTS.__file__]:
        if p is not None and Path(p).is_file() and Path(p).suffix in (
                ".cu", ".cuh", ".h", ".cc", ".py"):
            p = Path(p)
            h.update(p.name.encode())
            h.update(p.read_bytes())
    h.update(repr([j[2] for j in jobs]).encode())
    stamp = out_dir / "stamp"
    objects = [str(j[1]) for j in jobs]
    if (stamp.exists() and stamp.read_text() == h.hexdigest()
            and all(Path(o).exists() for o in objects)):
        print(f"[thc cuda] objects up to date ({len(objects)})", flush=True)
    else:
        if stamp.exists():
            stamp.unlink()
        t0 = time.time()
        print(f"[thc cuda] compiling {len(jobs)} files for sm_{', sm_'.join(map(str, archs))}",
              flush=True)
        parallel = max(1, int(os.environ.get("THC_CUDA_JOBS", "0"))
                       or min(len(jobs), os.cpu_count() or 1, 8))
        with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
            futs = [pool.submit(_compile, cmd + ["-c", str(src), "-o", str(obj)], src.name)
                    for src, obj, cmd in jobs]
            for f in futs:
                f.result()
        stamp.write_text(h.hexdigest())
        print(f"[thc cuda] compiled in {time.time() - t0:.1f} s", flush=True)

    libdir = cuda_libdir(nvcc)
    link_args = [f"-L{libdir}", "-lcudart", f"-Wl,-rpath,{libdir}"]
    return objects, link_args, [("THC_WITH_CUDA", "1")]


if __name__ == "__main__":  # a compile check on its own: python csrc/thc/cuda/build.py [nvcc]
    import shutil
    tool = (sys.argv[1] if len(sys.argv) > 1
            else (shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"))
    objs, link, macros = cuda_objects(tool, HERE.parents[2] / "build" / "cuda-check",
                                      HERE.parents[2])
    print("\n".join(objs))
    print(link, macros)
