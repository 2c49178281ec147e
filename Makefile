# byteps-thc: two commands for a newcomer, `make demo` and `make test`; everything else is a step.
# Every target installs what it needs from nothing (apt packages, .venv/), and is idempotent.
SHELL := /bin/bash
PY    := .venv/bin/python
VENV  := .venv/.stamp
EXT   := byteps_thc/.ext-stamp

.PHONY: all venv ext byteps byteps-cuda lint test test-unit test-cluster demo bench clean distclean help

all: ext

help:
	@echo "make demo   - set everything up, then train on a local cluster with THC"
	@echo "make test   - set everything up, then run the tests"
	@echo "make lint   - ruff on the Python, clang-format on our C++ (CI runs it first)"
	@echo "make ext    - build the codec extension byteps_thc._C"
	@echo "make byteps - build and install the BytePS fork (pinned sdist + our patches)"
	@echo "make byteps-cuda - the fork's CUDA worker, compiled and linked (needs nvcc; make test runs it where nvcc is)"
	@echo "make bench  - codec benchmark (benchmarks/bench_codec.py)"
	@echo "make soak   - 10 min of THC training, RSS of every process; fails on growth (SOAK_MINUTES=N)"
	@echo "make test-tf    - the TensorFlow tests alone (make test runs them too)"
	@echo "make test-upstream-bugs - each upstream bug's test fails without its patch (3 builds)"
	@echo "make test-mxnet - MXNet in its own environment (.cache/venv-mxnet), our tests and upstream's"

venv: $(VENV)
# scripts/venv.sh: python3 -m venv, pip install -r requirements.txt, and byteps_thc (used in place:
# make ext builds _C here) importable from the venv, so that the fork's bpslaunch and
# `python -m byteps_thc...` work from any directory. The Docker image runs the same script.
$(VENV): requirements.txt scripts/venv.sh
	@scripts/venv.sh

ext: $(EXT)
# --force: setuptools recompiles a source only when it is newer than its object, not when a header
# it includes changed, and objects built against another layout of a struct corrupt memory.
$(EXT): $(VENV) setup.py csrc/build_facts.py $(shell find csrc/thc csrc/lhc csrc/common csrc/python -type f 2>/dev/null)
	$(PY) setup.py -q build_ext --inplace --force
	@touch $@

# Lint: ruff (pyproject.toml) on the Python; clang-format (.clang-format) on all our C++. Both are
# pinned in requirements.txt.
CXX_SOURCES = $(shell find csrc harness tests -type f \( -name '*.h' -o -name '*.cc' -o -name '*.cu' \
                      -o -name '*.cuh' \) | sort)
lint: $(VENV)
	.venv/bin/ruff check .
	.venv/bin/clang-format --dry-run --Werror $(CXX_SOURCES)

test-unit: ext
	$(PY) -m pytest -q tests/unit

# The BytePS fork (scripts/build_byteps.sh: cached, rebuilds only when its inputs change).
byteps: $(VENV)
	@nice scripts/build_byteps.sh

# The CUDA worker's compile-and-link check (csrc/byteps/patches/README.md): the fork with
# BYTEPS_THC_CPU_ONLY=0 against nvcc's CUDA and the pinned NCCL wheel, into .cache/fork-cuda (never
# .venv: against the CPU torch its torch plugin cannot load), cached in .cache/byteps/build-cuda/
# like make byteps. `make test` builds it and tests/unit/test_cuda_worker_build.py requires it
# where nvcc is on PATH (CUDA_WORKER=0 leaves it out there); elsewhere it is no prerequisite and
# costs nothing.
NVCC := $(shell command -v nvcc 2> /dev/null)
CUDA_WORKER ?= $(if $(NVCC),1,0)
FORK_CUDA := .cache/fork-cuda
byteps-cuda: $(VENV)
	@command -v nvcc > /dev/null || { echo "make byteps-cuda: no nvcc on PATH" >&2; exit 1; }
	@BYTEPS_THC_CPU_ONLY=0 BYTEPS_THC_TENSORFLOW=0 THC_CUDA_ARCHS=$${THC_CUDA_ARCHS:-90} \
	  nice scripts/build_byteps.sh --target $(FORK_CUDA)

test: ext byteps $(if $(filter 1,$(CUDA_WORKER)),byteps-cuda)
	$(if $(filter 1,$(CUDA_WORKER)),BYTEPS_THC_CUDA_FORK=$(CURDIR)/$(FORK_CUDA)) $(PY) -m pytest -q tests

# The three upstream bugs our patches fix (0005, 0006, 0012): each one's test fails on the series
# without that patch and passes on ours. Not part of `make test`: three more builds (15-40 min
# on 2 cores, cached until the series, our sources or the build script change).
.PHONY: test-upstream-bugs
test-upstream-bugs: ext byteps
	@nice scripts/test_upstream_bugs.sh

demo: ext byteps
	$(PY) scripts/demo.py

bench: ext
	$(PY) benchmarks/bench_codec.py

# Soak (not part of `make test`): SOAK_MINUTES of THC training on a --local 2 cluster while the RSS
# of every process is sampled; exits non-zero when one grows after warm-up (benchmarks/soak.py).
SOAK_MINUTES ?= 10
.PHONY: soak
soak: ext byteps
	$(PY) benchmarks/soak.py --minutes $(SOAK_MINUTES)

clean:
	rm -rf build $(EXT) byteps_thc/_C*.so
distclean: clean
	rm -rf .venv .cache

# TensorFlow: `make byteps` builds the fork's TF plugin too (tensorflow-cpu is in .venv;
# BYTEPS_THC_TENSORFLOW=0 skips it) and `make test` runs its tests; these run them alone.
.PHONY: byteps-tf test-tf
byteps-tf: byteps

test-tf: ext byteps
	$(PY) -m pytest -q -rs tests/unit/test_tf_adapter.py tests/cluster/test_tf_train.py

# MXNet (not part of `make test`; .ci/run runs it after): mxnet 1.9.1 imports on Python 3.11
# only with numpy < 1.24, so it has its own environment, with the fork built for it
# (BYTEPS_THC_MXNET=1); numba, parameterized and tqdm are for upstream's MXNet tests.
MXPY := .cache/venv-mxnet/bin/python
.PHONY: mxnet-env test-mxnet
mxnet-env:
	@test -x $(MXPY) || python3 -m venv .cache/venv-mxnet
	$(MXPY) -m pip install -q --disable-pip-version-check mxnet==1.9.1 numpy==1.23.5 \
	    scikit-learn==1.3.2 setuptools==75.1.0 wheel==0.44.0 \
	    numba==0.68.1 llvmlite==0.50.0 parameterized==0.9.0 tqdm==4.70.1
	@$(MXPY) -c 'import site, os; open(os.path.join(site.getsitepackages()[0], "byteps_thc.pth"), "w").write(os.getcwd() + "\n")'
	@BYTEPS_THC_MXNET=1 PY=$(CURDIR)/$(MXPY) nice scripts/build_byteps.sh

test-mxnet: $(VENV) mxnet-env
	BYTEPS_THC_TEST_MXNET=1 $(PY) -m pytest -q -rs tests/cluster/test_mxnet_train.py \
	    tests/cluster/test_upstream_mxnet.py

# Docker (docs/DOCKER.md): the image byteps-thc:cpu, and a cluster of its containers. Both start
# dockerd when none runs (and stop it again), and make the Debian base with debootstrap when no
# registry can be reached. image-gpu: byteps-thc:gpu, where BASE/RUNTIME_BASE (CUDA) can be pulled.
.PHONY: image image-gpu test-docker
image:
	@scripts/docker_image.sh

image-gpu:
	@scripts/docker_image.sh --gpu

test-docker:
	@scripts/test_docker.sh
