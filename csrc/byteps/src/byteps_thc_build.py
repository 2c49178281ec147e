"""byteps-thc build hooks, imported by the patched BytePS setup.py (our file, not upstream's).

scripts/build_byteps.sh copies every file under csrc/byteps/src/ into the BytePS tree at the same
relative path (this one lands at the tree root, next to setup.py), copies the codec cores
csrc/thc/*.{h,cc} to thc/ and csrc/lhc/*.{h,cc} to lhc/ and the headers they share,
csrc/common/*.h, to common/ (the tree root is on the include path: "common/hash.h"), copies the
codec's build description csrc/build_facts.py beside this file, and writes thc_added_files.txt
(one copied path a line). The patched setup.py then asks this module for:

- cpu_only():        the worker mode; BYTEPS_THC_CPU_ONLY=1 compiles the worker without CUDA, NCCL
                     or libnuma (the build script always sets it to 0 or 1).
- torch_cuda(), torch_cuda_extension(): whether the torch plugin gets CUDA, and its extension
                     class then (CUDAExtension, or a CPU torch's compile-and-link check).
- extra_sources(k):  our .cc files for one library k in {server, worker, torch}. A file may name
                     its libraries in its first lines: `// byteps-thc-build: worker torch`.
                     Otherwise by place: thc/*.cc, lhc/*.cc and byteps/common/** go into server
                     and worker, byteps/server/** into server, byteps/torch/** into torch.
                     thc/cuda/ (the CUDA kernels, copied for the CUDA worker only) is not here.
- extra_objects(k):  objects compiled apart, for library k: for the CUDA worker's torch plugin
                     the CUDA kernels (thc/cuda/*.cu, by nvcc through thc/cuda/build.py, which
                     `make ext` uses for byteps_thc._C too), which the plugin's THC device
                     (byteps/common/compressor/impl/thc_device_kernels.cc) calls.
- setup_compiler(c): per-file flags (see file_flags), BYTEPS_BUILD_JOBS parallel compiles, and
                     LINKED on every link.
- pslite_make_option(): ZeroMQ from the tarball the sdist bundles (no download) with our patches
                     of it (zeromq-patches/*.patch, which the build script copies from
                     csrc/byteps/patches/zeromq/; patch 0025 applies them), bounded -j.
"""
import importlib.util
import os
import re
from multiprocessing.pool import ThreadPool

HERE = os.path.dirname(os.path.abspath(__file__))


def _build_facts():
    spec = importlib.util.spec_from_file_location("build_facts",
                                                  os.path.join(HERE, "build_facts.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# The codec's build description (csrc/build_facts.py): the cores' flags and the ISA rule.
FACTS = _build_facts()
# The codec cores, copied into the tree as thc/ (csrc/thc) and lhc/ (csrc/lhc), and what they
# share (csrc/common, header-only).
CORES = FACTS.CORES + (FACTS.SHARED,)
# Our files outside the cores that get the codec flags too: they include the cores' headers,
# which are C++17 (BytePS compiles its own files as C++11), and must not be built with BytePS's
# -Ofast either; failure.cc, the registry that every stage's thread and ps-lite's callbacks
# reach, must not get -Ofast's -fallow-store-data-races.
CODEC_FILE_PREFIXES = ("thc_", "lhc_", "max_round", "failure")


# Shared libraries every BytePS library links: libsodium, for the CURVE security of ps-lite's
# ZeroMQ (built --with-libsodium, patch 0022).
LINKED = ["sodium"]


def jobs():
    return max(1, int(os.environ.get("BYTEPS_BUILD_JOBS", "2")))


def cpu_only():
    return os.environ.get("BYTEPS_THC_CPU_ONLY", "0") == "1"


def torch_cuda():
    """Whether the torch plugin is built with CUDA (HAVE_CUDA=1): exactly when the worker is,
    since the plugin compiles the worker's sources, and a CUDA worker includes cuda_runtime.h.
    A CPU torch (`torch.version.cuda` None) still gets HAVE_CUDA=1 then: the build script allows
    that only into a --target, as the CUDA worker's compile-and-link check."""
    return not cpu_only()


# The one header of c10/cuda that torch generates when it is built with CUDA, absent from a CPU
# torch's include/: its CUDA build's setting, c10_cuda as a shared library (what CUDA wheels ship).
CPU_TORCH_CUDA_MACROS = ("c10/cuda/impl/cuda_cmake_macros.h",
                         "#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")


def torch_cuda_extension():
    """The setuptools extension for the torch plugin with CUDA. A CUDA torch: its own
    CUDAExtension. A CPU torch (the compile-and-link check): CppExtension plus the CUDA toolkit's
    headers and libcudart from BYTEPS_CUDA_HOME, and CPU_TORCH_CUDA_MACROS written into the tree.
    torch's c10/cuda headers are in every torch wheel, its libc10_cuda.so only in CUDA ones, so
    the plugin's references into c10::cuda stay undefined and it cannot load into a CPU torch."""
    import torch
    from torch.utils import cpp_extension

    if torch.version.cuda is not None:
        return cpp_extension.CUDAExtension
    cuda_home = os.environ.get("BYTEPS_CUDA_HOME") or "/usr/local/cuda"
    macros_dir = os.path.join(HERE, "thc_cpu_torch_cuda")
    rel, text = CPU_TORCH_CUDA_MACROS
    os.makedirs(os.path.dirname(os.path.join(macros_dir, rel)), exist_ok=True)
    with open(os.path.join(macros_dir, rel), "w") as f:
        f.write(text)

    def extension(name, sources, *args, **kwargs):
        kwargs["include_dirs"] = list(kwargs.get("include_dirs") or []) + [
            os.path.join(cuda_home, "include"), macros_dir]
        kwargs["library_dirs"] = list(kwargs.get("library_dirs") or []) + [
            os.path.join(cuda_home, "lib64")]
        return cpp_extension.CppExtension(name, sources, *args, **kwargs)

    return extension


def _added_files():
    listing = os.path.join(HERE, "thc_added_files.txt")
    if not os.path.exists(listing):
        return []
    with open(listing) as f:
        return [line.strip() for line in f if line.strip()]


def _tagged_libraries(rel):
    """The libraries named by a `byteps-thc-build:` line in the first 2 KiB, or None."""
    with open(os.path.join(HERE, rel), errors="replace") as f:
        m = re.search(r"byteps-thc-build:([ a-z,]+)", f.read(2048))
    return set(m.group(1).replace(",", " ").split()) if m else None


def extra_sources(kind):
    srcs = []
    for rel in _added_files():
        if not rel.endswith(".cc"):
            continue
        if not FACTS.compiled_here(rel) or rel.startswith("thc/cuda/"):
            continue
        top = rel.split("/")[0]
        tagged = _tagged_libraries(rel)
        if tagged is not None:
            ok = kind in tagged
        elif top in CORES:
            ok = kind in ("server", "worker")
        elif rel.startswith("byteps/common/"):
            ok = kind in ("server", "worker")
        elif rel.startswith("byteps/server/"):
            ok = kind == "server"
        elif rel.startswith("byteps/torch/"):
            ok = kind == "torch"
        else:
            ok = False
        if ok:
            srcs.append(rel)
    return sorted(srcs)


def _nvcc():
    home = os.environ.get("BYTEPS_CUDA_HOME") or os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    return os.path.join(home, "bin", "nvcc")


def extra_objects(kind):
    """The CUDA kernels' objects for the CUDA worker's torch plugin; nothing otherwise."""
    if kind != "torch" or not torch_cuda():
        return []
    spec = importlib.util.spec_from_file_location(
        "thc_cuda_build", os.path.join(HERE, "thc", "cuda", "build.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    objects, _, _ = mod.cuda_objects(_nvcc(), os.path.join(HERE, "build"), HERE,
                                     include_root=HERE, binding=False)
    return objects


def file_flags(src):
    """Extra flags for one source file, after BytePS's (-Ofast -march=native): the cores' flags
    for thc/*, lhc/*, common/* (build_facts.core_flags: their x86-64 baseline and ISA rule), the
    codec flags alone for the files named in CODEC_FILE_PREFIXES, none otherwise."""
    rel = os.path.relpath(os.path.abspath(src), HERE)
    if rel.split(os.sep)[0] in CORES:
        return FACTS.core_flags(rel)
    if os.path.basename(rel).startswith(CODEC_FILE_PREFIXES):
        return list(FACTS.CODEC)
    return []


def setup_compiler(compiler):
    """Give `compiler` per-file flags and compile the sources of one extension in parallel."""
    if getattr(compiler, "_thc_hooked", False):
        return
    compiler._thc_hooked = True
    original = compiler._compile

    # no debug info unless asked: it doubles compile and link time (BYTEPS_BUILD_DEBUG=1 keeps -g)
    nodebug = [] if os.environ.get("BYTEPS_BUILD_DEBUG") == "1" else ["-g0"]

    def _compile(obj, src, ext, cc_args, extra_postargs, pp_opts):
        extra = list(extra_postargs or []) + nodebug + file_flags(src)
        return original(obj, src, ext, cc_args, extra, pp_opts)

    def compile(sources, output_dir=None, macros=None, include_dirs=None, debug=0,
                extra_preargs=None, extra_postargs=None, depends=None):
        macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs)
        cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)
        todo = [o for o in objects if o in build]
        total = len(todo)

        def one(item):
            i, obj = item
            src, ext = build[obj]
            print("[byteps-thc build] compile %d/%d %s"
                  % (i + 1, total, os.path.relpath(src, HERE)), flush=True)
            _compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

        with ThreadPool(jobs()) as pool:
            for _ in pool.imap_unordered(one, list(enumerate(todo))):
                pass
        return objects

    original_link = compiler.link

    def link(target_desc, objects, output_filename, output_dir=None, libraries=None, *args,
             **kwargs):
        # ps-lite's static libzmq.a carries CURVE (the cluster key), which calls libsodium
        libraries = list(libraries or []) + [lib for lib in LINKED if lib not in (libraries or [])]
        return original_link(target_desc, objects, output_filename, output_dir, libraries, *args,
                             **kwargs)

    compiler._compile = _compile
    compiler.compile = compile
    compiler.link = link


def pslite_make_option():
    zmq = os.path.join(HERE, "zeromq-4.1.4.tar.gz")
    patches = os.path.join(HERE, "zeromq-patches")
    names = sorted(n for n in os.listdir(patches) if n.endswith(".patch")) \
        if os.path.isdir(patches) else []
    return 'WGET="cp %s ." ZMQ_URL= ZMQ_PATCHES="%s" -j%d ' % (
        zmq, " ".join(os.path.join(patches, n) for n in names), jobs())
