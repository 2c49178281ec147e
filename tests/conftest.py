"""What a test needs, declared as a marker and checked here once (markers: pyproject.toml).

- `needs_fork(*plugins, python=None)`: the BytePS fork with these plugins built (default: the
  server and the torch plugin). Found on disk, never imported: importing `byteps.server` starts
  a server. With BYTEPS_THC_FORK_DIR=DIR the fork is the build that `scripts/build_byteps.sh
  --target DIR` installed there (the cluster's processes import `byteps` from DIR first); with
  `python=` it is the fork that interpreter imports (another virtual environment).
- `needs_root(*tools)`: root, and these programs on PATH (network namespaces: `ip`, `tc`).
- `needs_tf`: TensorFlow installed (found, not imported: TF stays out of the test process).
- `needs_gpu`: a CUDA device that torch sees, and byteps_thc._C built with the CUDA kernels.
- `needs_cuda_fork`: the CUDA worker's compile-and-link build (`make byteps-cuda`, in
  CUDA_FORK_DIR; the fixture `cuda_fork` is that folder). `make test` builds it where nvcc is on
  PATH and sets BYTEPS_THC_CUDA_FORK to it, and then it is required: a missing build fails.

A test whose needs are not met is skipped with the reason (`pytest -rs` lists them). The checks
run when such a test is about to run, after its `skipif` markers, and each result is kept.
"""
import functools
import glob
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

_fork_dir = os.environ.get("BYTEPS_THC_FORK_DIR", "")
FORK_DIR = os.path.abspath(_fork_dir) if _fork_dir else ""

_cuda_fork = os.environ.get("BYTEPS_THC_CUDA_FORK", "")
CUDA_FORK_DIR = os.path.abspath(_cuda_fork or os.path.join(os.path.dirname(__file__), "..",
                                                           ".cache", "fork-cuda"))

DEFAULT_PLUGINS = ("server", "torch")
# what builds a plugin (and where to look when it does not build)
BUILD = {"tensorflow": "make byteps-tf; build.log under .cache/byteps/build/ says why it failed",
         "mxnet": "make mxnet-env"}

# The `byteps` package directory as another interpreter finds it ("" when it finds none).
_PACKAGE_DIR = ("import importlib.util as u; s = u.find_spec('byteps'); "
                "print(list(s.submodule_search_locations)[0] if s and s.submodule_search_locations "
                "else '')")


def _package_dir(python):
    """Where the fork's `byteps` package lies, as `python` (None: this one) would import it."""
    if python is None and FORK_DIR:
        return os.path.join(FORK_DIR, "byteps")
    if python is None or python == sys.executable:
        spec = importlib.util.find_spec("byteps")
        locations = spec and spec.submodule_search_locations
        return list(locations)[0] if locations else ""
    p = subprocess.run([python, "-c", _PACKAGE_DIR], capture_output=True, text=True, timeout=120)
    return p.stdout.strip() if p.returncode == 0 else ""


@functools.lru_cache(maxsize=None)
def fork_missing(plugins=DEFAULT_PLUGINS, python=None):
    """None when the fork's `plugins` are built, else why the tests that need them cannot run."""
    where = (f" in BYTEPS_THC_FORK_DIR={FORK_DIR}" if python is None and FORK_DIR
             else f" for {python}" if python else "")
    pkg = _package_dir(python)
    if not pkg or not os.path.isdir(pkg):  # the first plugin's build installs the fork
        hint = ("scripts/build_byteps.sh --target DIR" if python is None and FORK_DIR
                else BUILD.get(plugins[0], "make byteps"))
        return f"the BytePS fork is not installed{where} ({hint})"
    for sub in plugins:
        if not glob.glob(os.path.join(pkg, sub, "c_lib*.so")):
            return (f"the BytePS fork's {sub} plugin is not built{where} "
                    f"({BUILD.get(sub, 'make byteps')})")
    return None


@functools.lru_cache(maxsize=None)
def root_missing(tools=()):
    if os.geteuid() != 0:
        return "needs root (network namespaces and tc)"
    for tool in tools:
        if shutil.which(tool) is None:
            return f"needs `{tool}` on PATH"
    return None


@functools.lru_cache(maxsize=None)
def tf_missing():
    return "tensorflow is not installed" if importlib.util.find_spec("tensorflow") is None else None


@functools.lru_cache(maxsize=None)
def gpu_missing():
    try:
        import torch  # only for the GPU tests: torch is not loaded into every test run
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    try:
        from byteps_thc import _C
    except ImportError:
        return "byteps_thc._C is not built (make ext)"
    return None if getattr(_C, "with_cuda", False) else "byteps_thc._C built without CUDA"


@functools.lru_cache(maxsize=None)
def cuda_fork_missing():
    if _cuda_fork:  # make test built it: its absence is the tests' failure, not a skip
        return None
    if shutil.which("nvcc") is None:
        return "no nvcc on PATH (the CUDA worker is compiled only where nvcc is)"
    if not os.path.exists(os.path.join(CUDA_FORK_DIR, ".byteps-thc-build.stamp")):
        return f"the CUDA worker is not built in {CUDA_FORK_DIR} (make byteps-cuda)"
    return None


def missing(item):
    """Why `item` cannot run here, or None."""
    for mark in item.iter_markers("needs_root"):
        why = root_missing(tuple(mark.args))
        if why:
            return why
    if item.get_closest_marker("needs_tf") and tf_missing():
        return tf_missing()
    for mark in item.iter_markers("needs_fork"):
        why = fork_missing(tuple(mark.args) or DEFAULT_PLUGINS, mark.kwargs.get("python"))
        if why:
            return why
    if item.get_closest_marker("needs_gpu") and gpu_missing():
        return gpu_missing()
    if item.get_closest_marker("needs_cuda_fork") and cuda_fork_missing():
        return cuda_fork_missing()
    return None


def pytest_runtest_setup(item):
    """Skips before any fixture of the test is set up (conftest hooks run before the runner's).
    The skip is reported at the test, as a skip marker's is (pytest's `_use_item_location`)."""
    why = missing(item)
    if why:
        raise pytest.skip.Exception(why, _use_item_location=True)


@pytest.fixture
def fork():
    """Skip unless the BytePS fork (server and torch plugin) is installed."""
    why = fork_missing()
    if why:
        pytest.skip(why)


@pytest.fixture
def cuda_fork():
    """The folder of the CUDA worker's build (tests marked `needs_cuda_fork`)."""
    return CUDA_FORK_DIR
