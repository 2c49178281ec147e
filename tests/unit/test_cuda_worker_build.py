"""The CUDA worker, compiled and linked without a GPU (`make byteps-cuda`).

Where nvcc is on PATH, `make test` builds the fork with BYTEPS_THC_CPU_ONLY=0 (upstream's
CUDA/NCCL worker, with our stages) against nvcc's CUDA and the pinned NCCL wheel, into
.cache/fork-cuda. These tests read what was built with binutils and the dynamic loader:

- the torch plugin (the worker's sources, our stages and torch's ops, compiled with CUDA on) is
  the CUDA worker: the NCCL stages are in it, it calls CUDA, NCCL and libnuma, and it registers
  the CUDA tensors' push_pull;
- it links libcudart, libnccl and libnuma, and every symbol it uses resolves, except, against a
  CPU torch, the ones in c10::cuda (libc10_cuda.so comes only with CUDA torch wheels);
- THC's CUDA kernels (csrc/thc/cuda, compiled by nvcc) are linked into the torch plugin, with
  the THC device that calls them (thc_device_kernels.cc) in place of the fallback that the other
  plugins keep;
- the server (no CUDA in it, as in the CPU build) has no undefined symbol and loads.
"""
import os
import re
import subprocess
import sys
from glob import glob

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.needs_cuda_fork

CPU_TORCH = torch.version.cuda is None
TORCH_LIB = os.path.join(os.path.dirname(torch.__file__), "lib")


def _library(fork, plugin):
    found = glob(os.path.join(fork, "byteps", plugin, "c_lib*.so"))
    assert len(found) == 1, f"{plugin} library in {fork}: {found}"
    return found[0]


def _symbols(path, which):
    """The dynamic symbols of `path`, demangled: which = defined or undefined."""
    out = subprocess.run(["nm", "-D", "-C", f"--{which}-only", path], capture_output=True,
                         text=True, check=True).stdout
    return {line.split(None, 2)[-1] for line in out.splitlines() if line.strip()}


def _needed(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True,
                         check=True).stdout
    return set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out))


def _loader_env(fork):
    """LD_LIBRARY_PATH with the CUDA and NCCL the build used (the build script records them; a
    system NCCL is on the loader's own path)."""
    with open(os.path.join(fork, ".byteps-thc-cuda-libdirs")) as f:
        dirs = [line.strip() for line in f if line.strip()]
    assert 1 <= len(dirs) <= 2 and all(os.path.isdir(d) for d in dirs), dirs
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(dirs + [TORCH_LIB, env.get("LD_LIBRARY_PATH", "")])
    return env


def _unresolved(path, env):
    """What `ldd -r` reports: (libraries not found, `path`'s own undefined symbols, demangled;
    those of the libraries it loads are theirs)."""
    p = subprocess.run(["ldd", "-r", path], capture_output=True, text=True, env=env)
    text = p.stdout + p.stderr
    not_found = re.findall(r"^\s*(\S+) => not found", text, re.M)
    mangled = [name for name, where in re.findall(r"undefined symbol: (\S+)\s+\((.*)\)", text)
               if os.path.realpath(where) == os.path.realpath(path)]
    demangled = subprocess.run(["c++filt"], input="\n".join(mangled), capture_output=True,
                               text=True, check=True).stdout.split("\n") if mangled else []
    return not_found, [d for d in demangled if d]


def test_the_build_is_the_cuda_worker(cuda_fork):
    assert os.path.exists(os.path.join(cuda_fork, ".byteps-thc-build.stamp")), (
        f"no CUDA worker build in {cuda_fork} (make byteps-cuda)")
    plugin = _library(cuda_fork, "torch")
    with open(plugin, "rb") as f:
        image = f.read()
    # ops.cc registers the CUDA tensors' push_pull only when built with HAVE_CUDA=1
    registered = b"byteps_torch_push_pull_async_torch_cuda_FloatTensor" in image
    assert registered, "the torch plugin has no CUDA push_pull: built with HAVE_CUDA=0"
    defined = _symbols(plugin, "defined")
    for stage in ("RootNcclLoop()", "NonRootNcclLoop()", "SyncNcclLoop()", "ThcNormLoop()",
                  "CopyDevice2HostLoop()", "RootCopyHost2DeviceLoop()"):
        assert f"byteps::common::{stage}" in defined, stage
    # nccl_manager.cc, which the CPU-only build leaves out (cpu_only.h has its one-rank stand-in)
    assert any(s.startswith("byteps::common::NcclManager::") for s in defined)


def _all_symbols(path):
    """Every symbol of `path`'s symbol table, demangled, without its arguments and ABI tags:
    name -> nm's type letters."""
    out = subprocess.run(["nm", "-C", path], capture_output=True, text=True, check=True).stdout
    found = {}
    for line in out.splitlines():
        parts = line.split(None, 2)
        if len(parts) == 3:
            name = re.sub(r"\[abi:\w+\]", "", parts[2].split("(")[0])
            found.setdefault(name, set()).add(parts[1])
    return found


def test_the_plugin_links_thc_cuda_kernels(cuda_fork):
    plugin = _library(cuda_fork, "torch")
    symbols = _all_symbols(plugin)
    # the kernels' host launchers, defined in the plugin (T: global, t: hidden by their flags)
    for launcher in ("LaunchNorm", "LaunchEncode", "LaunchDecode"):
        kinds = symbols.get(f"thc::cuda::{launcher}", set())
        assert kinds & {"T", "t"}, (launcher, kinds)
    # the kernels' device replaced the weak fallback (W) that returns none
    kinds = symbols.get("byteps::common::compressor::thcdevice::MakeKernelDevice", set())
    assert kinds & {"T", "t"} and not kinds & {"W", "w"}, kinds
    # the device code itself: nvcc's fat binary section
    sections = subprocess.run(["readelf", "-S", "-W", plugin], capture_output=True, text=True,
                              check=True).stdout
    assert ".nv_fatbin" in sections
    # the server has none of it
    server = _library(cuda_fork, "server")
    assert not any(k.startswith("thc::cuda::") for k in _all_symbols(server))


NCCL_CALLS = ("ncclGetUniqueId", "ncclCommInitRank", "ncclReduce", "ncclBroadcast",
              "ncclGroupStart")


def _nccl_is_static(plugin):
    """NCCL linked in (a system libnccl_static.a) rather than libnccl.so.2 (the pinned wheel)."""
    return "ncclReduce" in {s.split("@")[0] for s in _symbols(plugin, "defined")}


def test_the_worker_calls_cuda_nccl_and_numa(cuda_fork):
    plugin = _library(cuda_fork, "torch")
    undefined = {s.split("@")[0] for s in _symbols(plugin, "undefined")}
    calls = ("cudaSetDevice", "cudaMemcpyAsync", "cudaStreamSynchronize", "cudaHostRegister",
             "cudaHostGetDevicePointer", "cudaStreamCreateWithFlags", "cudaEventRecord",
             "numa_max_node") + (() if _nccl_is_static(plugin) else NCCL_CALLS)
    for call in calls:
        assert call in undefined, call


def test_the_plugin_links_cuda_nccl_and_numa(cuda_fork):
    plugin = _library(cuda_fork, "torch")
    needed = _needed(plugin)
    for lib in ("libcudart.so.13", "libnuma.so.1", "libc10.so", "libtorch_cpu.so",
                "libsodium.so.23") + (() if _nccl_is_static(plugin) else ("libnccl.so.2",)):
        assert lib in needed, (lib, sorted(needed))
    assert ("libc10_cuda.so" in needed) == (not CPU_TORCH)


def test_every_symbol_resolves_but_c10_cuda(cuda_fork):
    env = _loader_env(cuda_fork)
    not_found, undefined = _unresolved(_library(cuda_fork, "torch"), env)
    assert not not_found, not_found
    # a Python extension takes the interpreter's C API from the process that loads it
    python_api = [s for s in undefined if re.match(r"_?Py", s)]
    c10_cuda = [s for s in undefined if s.startswith("c10::cuda::")]
    others = sorted(set(undefined) - set(python_api) - set(c10_cuda))
    assert others == [], others
    assert bool(c10_cuda) == CPU_TORCH, c10_cuda[:5]


_LOAD = """
import ctypes, os, sys, torch
mode = os.RTLD_LAZY if sys.argv[2] == "lazy" else os.RTLD_NOW
try:
    ctypes.CDLL(sys.argv[1], mode=mode)
except OSError as e:
    sys.exit(str(e))
maps = open("/proc/self/maps").read()
print(" ".join(lib for lib in ("libcudart.so", "libnccl.so", "libnuma.so") if lib in maps))
"""


@pytest.mark.skipif(not CPU_TORCH, reason="against a CUDA torch the plugin loads as it is")
def test_the_plugin_loads_into_a_cpu_torch_only_lazily(cuda_fork):
    """Bound lazily, the plugin loads after `import torch` (no GPU, no driver): libcudart, libnccl
    and libnuma load, and its static initialisers run. Bound at once, the loader refuses it for
    a c10::cuda function: those are all it lacks."""
    plugin, env = _library(cuda_fork, "torch"), _loader_env(cuda_fork)
    lazy = subprocess.run([sys.executable, "-c", _LOAD, plugin, "lazy"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert lazy.returncode == 0, lazy.stderr
    loaded = ["libcudart.so", "libnuma.so"] if _nccl_is_static(plugin) else [
        "libcudart.so", "libnccl.so", "libnuma.so"]
    assert lazy.stdout.split() == loaded
    now = subprocess.run([sys.executable, "-c", _LOAD, plugin, "now"], capture_output=True,
                         text=True, env=env, timeout=120)
    assert now.returncode != 0
    assert re.search(r"undefined symbol: _ZN\w*3c104cuda", now.stderr), now.stderr


def test_the_server_has_no_cuda_and_loads(cuda_fork):
    server = _library(cuda_fork, "server")
    needed = _needed(server)
    assert not {lib for lib in needed if "cuda" in lib or "nccl" in lib}, sorted(needed)
    not_found, undefined = _unresolved(server, _loader_env(cuda_fork))
    assert (not_found, undefined) == ([], [])
    # loading runs its static initialisers; starting a server takes a call (byteps.server's import)
    p = subprocess.run([sys.executable, "-c", "import ctypes, sys; ctypes.CDLL(sys.argv[1])",
                        server], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
