# byteps-thc images for clusters: the codec, the BytePS fork (scheduler, server, workers with the
# PyTorch plugin, and the TensorFlow one with BYTEPS_THC_TENSORFLOW=1) and the examples, installed
# as `make test` installs them. docs/DOCKER.md says how to build and run them.
#
#   make image                                   # byteps-thc:cpu (scripts/docker_image.sh)
#   docker build -t byteps-thc:cpu .             # the same, compiled here, with a registry
#   scripts/docker_image.sh --gpu                # byteps-thc:gpu: CUDA worker (see docs/DOCKER.md)
#
# Stages: `runtime` is the base with python3 and .venv (scripts/venv.sh, as make venv); the fork's
# wheel and the codec's extension come from `fork-source` (compiled in `builder`, FORK=source) or
# `fork-prebuilt` (docker/prebuilt/: the wheel and the extension `make test` built and installed
# on the building machine, FORK=prebuilt); the final stage installs them into `runtime`. No
# compiler, build tree, apt list, pip cache or wheel is in the final image.
# BytePS's own sources are compiled with upstream's -march=native: build the image on (or for)
# the machines that run it. The codec core picks its SIMD kernels at run time.
ARG BASE=debian:bookworm-slim
ARG RUNTIME_BASE=${BASE}
ARG FORK=source

# ---- runtime: python3, tini and .venv ---------------------------------------------------------
FROM ${RUNTIME_BASE} AS runtime
# 1: the CPU-only worker (no CUDA, NCCL or libnuma); 0: the CUDA worker (CUDA BASE/RUNTIME_BASE).
ARG BYTEPS_THC_CPU_ONLY=1
# 1: tensorflow-cpu and keras in .venv (the pins tagged [tf]) and the fork's TensorFlow plugin.
ARG BYTEPS_THC_TENSORFLOW=0
# 1: pip reads only docker/wheels/ (scripts/docker_image.sh fills it from the host's pip
# configuration; the byteps sdist is there too); 0: pip uses the index, PIP_INDEX_URL if given.
ARG OFFLINE=0
ARG PIP_INDEX_URL=
ENV DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
# tini is PID 1: it forwards SIGTERM (docker stop) to bpslaunch, which stops its role's
# processes, and it reaps them. libgomp1: BytePS is built with -fopenmp; libsodium23: its
# ZeroMQ's CURVE security (the cluster key).
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 libsodium23 python3 python3-venv tini \
    && if [ "$BYTEPS_THC_CPU_ONLY" = 0 ]; then \
        apt-get install -y --no-install-recommends libnuma1; fi \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/byteps-thc
# pip's settings for every RUN that installs: the wheelhouse (OFFLINE=1) or the index, and the CA
# bundle of a TLS-intercepting proxy as the BuildKit secret `hostca` (never written to a layer).
COPY docker/pip-env.sh docker/pip-env.sh
# .venv: make venv's recipe, less the lint/test/plot tools ([dev]) and, unless asked for, [tf]
COPY requirements.txt requirements.txt
COPY scripts/venv.sh scripts/venv.sh
RUN --mount=type=bind,source=docker/wheels,target=/wheels \
    --mount=type=secret,id=hostca,target=/run/secrets/hostca \
    . docker/pip-env.sh \
    && if [ "$BYTEPS_THC_TENSORFLOW" = 1 ]; then without=dev; else without=dev,tf; fi \
    && scripts/venv.sh --without "$without"

# ---- builder (FORK=source): the fork's wheel and the codec's extension, compiled here -----------
FROM ${BASE} AS builder
ARG BYTEPS_THC_CPU_ONLY=1
ARG BYTEPS_THC_TENSORFLOW=0
ARG BYTEPS_BUILD_JOBS=2
ARG OFFLINE=0
ARG PIP_INDEX_URL=
# CUDA architectures of the codec's kernels (setup.py's THC_CUDA_ARCHS; empty: all it knows).
ARG THC_CUDA_ARCHS=
ENV DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates g++ libsodium-dev make patch \
        pkg-config python3-dev \
    && if [ "$BYTEPS_THC_CPU_ONLY" = 0 ]; then \
        apt-get install -y --no-install-recommends libnuma-dev \
        && { ls /usr/include/nccl.h > /dev/null 2>&1 \
             || apt-get install -y --no-install-recommends libnccl-dev; }; fi \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/byteps-thc
COPY docker/pip-env.sh docker/pip-env.sh
# Both steps build against the runtime's .venv, bind-mounted (not copied), for its Python.
# the codec extension: make ext's command, from its inputs alone
COPY setup.py setup.py
COPY csrc/build_facts.py csrc/build_facts.py
COPY csrc/thc csrc/thc
COPY csrc/lhc csrc/lhc
COPY csrc/common csrc/common
COPY csrc/python csrc/python
RUN --mount=type=bind,from=runtime,source=/opt/byteps-thc/.venv,target=/opt/byteps-thc/.venv \
    mkdir -p byteps_thc /out \
    && THC_CUDA_ARCHS=$THC_CUDA_ARCHS .venv/bin/python setup.py -q build_ext --inplace \
    && cp byteps_thc/_C*.so /out/ && rm -rf build byteps_thc
# the fork's wheel: scripts/build_byteps.sh (what make byteps runs), from its inputs alone
COPY scripts/build_byteps.sh scripts/build_byteps.sh
COPY csrc/byteps csrc/byteps
RUN --mount=type=bind,from=runtime,source=/opt/byteps-thc/.venv,target=/opt/byteps-thc/.venv \
    --mount=type=bind,source=docker/wheels,target=/wheels \
    --mount=type=secret,id=hostca,target=/run/secrets/hostca \
    . docker/pip-env.sh \
    && BYTEPS_THC_CPU_ONLY=$BYTEPS_THC_CPU_ONLY BYTEPS_THC_TENSORFLOW=$BYTEPS_THC_TENSORFLOW \
       BYTEPS_BUILD_JOBS=$BYTEPS_BUILD_JOBS PY=/opt/byteps-thc/.venv/bin/python \
       scripts/build_byteps.sh --target /tmp/fork --wheel /out \
    && rm -rf .cache /tmp/fork

FROM scratch AS fork-source
COPY --from=builder /out/ /

# ---- FORK=prebuilt: what `make test` built on this machine (scripts/docker_image.sh) -----------
FROM scratch AS fork-prebuilt
COPY docker/prebuilt/ /

FROM fork-${FORK} AS fork

# ---- the image --------------------------------------------------------------------------------
FROM runtime
ARG BYTEPS_THC_TENSORFLOW=0
# the fork: its wheel, installed as scripts/build_byteps.sh installs it
RUN --mount=type=bind,from=fork,target=/fork \
    .venv/bin/pip install -q --no-deps --no-index /fork/byteps-*.whl
# the project (the build context less docker/wheels/ and docker/prebuilt/), with the extension
RUN --mount=type=bind,target=/ctx --mount=type=bind,from=fork,target=/fork \
    tar -C /ctx -c --exclude=./docker/wheels --exclude=./docker/prebuilt . \
      | tar -x --no-same-owner \
    && cp /fork/_C*.so byteps_thc/ \
    && .venv/bin/python -c 'import byteps_thc._C, byteps.torch' \
    && if [ "$BYTEPS_THC_TENSORFLOW" = 1 ]; then .venv/bin/python -c 'import byteps.tensorflow'; fi
ENV PATH=/opt/byteps-thc/.venv/bin:$PATH PYTHONUNBUFFERED=1
# docker/entry.sh turns a host name in DMLC_PS_ROOT_URI into an address (ps-lite binds the
# scheduler to an address only), then runs CMD as it is: `docker run IMAGE bpslaunch ...`.
ENTRYPOINT ["/usr/bin/tini", "--", "/opt/byteps-thc/docker/entry.sh"]
CMD ["bpslaunch", "--help"]
