"""byteps-thc build hooks, imported by the patched BytePS setup.py (our file, not upstream's).

scripts/build_byteps.sh copies every file under csrc/byteps/src/ into the BytePS tree at the same
relative path (this one lands at the tree root, next to setup.py), copies the codec cores
csrc/thc/*.{h,cc} to thc/ and csrc/lhc/*.{h,cc} to lhc/ and the headers they share,
csrc/common/*.h, to common/ (the tree root is on the include path: "common/hash.h"), and writes
thc_added_files.txt (one copied path a line). The patched setup.py then asks this module for:

- cpu_only():        the worker mode; BYTEPS_THC_CPU_ONLY=1 compiles the worker without CUDA, NCCL
                     or libnuma (the build script always sets it to 0 or 1).
- extra_sources(k):  our .cc files for one library k in {server, worker, torch}. A file may name
                     its libraries in its first lines: `// byteps-thc-build: worker torch`.
                     Otherwise by place: thc/*.cc, lhc/*.cc and byteps/common/** go into server
                     and worker, byteps/server/** into server, byteps/torch/** into torch.
- setup_compiler(c): per-file flags (see file_flags) and BYTEPS_BUILD_JOBS parallel compiles.
- pslite_make_option(): ZeroMQ from the tarball the sdist bundles (no download), bounded -j.
"""
import os
import platform
import re
from multiprocessing.pool import ThreadPool

HERE = os.path.dirname(os.path.abspath(__file__))

# Same rule as the top-level setup.py of byteps-thc: a file's ISA is the suffix of its stem.
ISA_FLAGS = {
    "avx2": ["-mavx2", "-mbmi2"],
    "avx512": ["-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mbmi2"],
}
# The codec cores, copied into the tree as thc/ (csrc/thc) and lhc/ (csrc/lhc), and what they
# share (csrc/common, header-only).
CORES = ("thc", "lhc", "common")
# Our files outside the cores that get the codec flags too: they include the cores' headers,
# which are C++17 (BytePS compiles its own files as C++11).
CODEC_FILE_PREFIXES = ("thc_", "lhc_", "max_round")
# Codec files must not fuse a*b+c nor use fast-math (BytePS builds everything with -Ofast).
CODEC_FLAGS = ["-std=c++17", "-fno-fast-math", "-ffp-contract=off"]


def jobs():
    return max(1, int(os.environ.get("BYTEPS_BUILD_JOBS", "2")))


def cpu_only():
    return os.environ.get("BYTEPS_THC_CPU_ONLY", "0") == "1"


def _is_x86():
    return platform.machine().lower() in ("x86_64", "amd64")


def _isa(path):
    return os.path.splitext(os.path.basename(path))[0].rsplit("_", 1)[-1]


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
        if _isa(rel) in ISA_FLAGS and not _is_x86():
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


def file_flags(src):
    """Extra flags for one source file: the codec rule for the cores (thc/*, lhc/*, common/*) and
    the files named in CODEC_FILE_PREFIXES, none otherwise."""
    rel = os.path.relpath(os.path.abspath(src), HERE)
    base = os.path.basename(rel)
    core = rel.split(os.sep)[0] in CORES
    if not (core or base.startswith(CODEC_FILE_PREFIXES)):
        return []
    flags = list(CODEC_FLAGS)
    if core:
        flags += ["-march=x86-64"] if _is_x86() else []
    return flags + ISA_FLAGS.get(_isa(rel), [])


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

    compiler._compile = _compile
    compiler.compile = compile


def pslite_make_option():
    zmq = os.path.join(HERE, "zeromq-4.1.4.tar.gz")
    return 'WGET="cp %s ." ZMQ_URL= -j%d ' % (zmq, jobs())
