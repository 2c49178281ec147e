# byteps-thc images for clusters: the codec, the BytePS fork (scheduler, server, workers with the
# PyTorch and TensorFlow plugins) and the examples, installed by the same Makefile targets as
# `make test` (make venv, make byteps, make ext). docs/DOCKER.md says how to build and run them.
#
#   make image                                   # byteps-thc:cpu (scripts/docker_image.sh)
#   docker build -t byteps-thc:cpu .             # the same with a registry (BASE is public)
#   scripts/docker_image.sh --gpu                # byteps-thc:gpu: CUDA worker (see docs/DOCKER.md)
#
# Two stages: `builder` holds the compilers and the build trees; the final stage gets the project
# directory (.venv included) and the runtime libraries only, and no apt lists or pip cache.
# BytePS's own sources are compiled with upstream's -march=native: build the image on (or for)
# the machines that run it. The codec core picks its SIMD kernels at run time.
ARG BASE=debian:bookworm-slim
ARG RUNTIME_BASE=${BASE}

FROM ${BASE} AS builder
# 1: the CPU-only worker (no CUDA, NCCL or libnuma); 0: the CUDA worker (a CUDA devel BASE).
ARG BYTEPS_THC_CPU_ONLY=1
# 0: no TensorFlow plugin (the GPU image: requirements.txt pins tensorflow-cpu).
ARG BYTEPS_THC_TENSORFLOW=1
ARG BYTEPS_BUILD_JOBS=2
# 1: pip reads only docker/wheels/ (scripts/docker_image.sh fills it from the host's pip
# configuration; the byteps sdist is there too); 0: pip uses the index, PIP_INDEX_URL if given.
ARG OFFLINE=0
ARG PIP_INDEX_URL=
# CUDA architectures of the codec's kernels (setup.py's THC_CUDA_ARCHS; empty: all it knows).
ARG THC_CUDA_ARCHS=
ENV DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates g++ make patch \
        python3 python3-dev python3-venv \
    && if [ "$BYTEPS_THC_CPU_ONLY" = 0 ]; then \
        apt-get install -y --no-install-recommends libnuma-dev \
        && { ls /usr/include/nccl.h > /dev/null 2>&1 \
             || apt-get install -y --no-install-recommends libnccl-dev; }; fi \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/byteps-thc
# pip's settings for every RUN that installs: the wheelhouse (OFFLINE=1) or the index, and the CA
# bundle of a TLS-intercepting proxy as the BuildKit secret `hostca` (never written to a layer).
COPY docker/pip-env.sh docker/pip-env.sh

# .venv from requirements.txt: `make venv` (the same recipe as make test)
COPY requirements.txt Makefile ./
RUN --mount=type=bind,source=docker/wheels,target=/wheels \
    --mount=type=secret,id=hostca,target=/run/secrets/hostca \
    . docker/pip-env.sh && make venv

# the fork (server, scheduler, workers, torch + TF plugins): `make byteps` (scripts/build_byteps.sh)
# from its inputs alone, so that a change elsewhere does not rebuild it
COPY scripts/build_byteps.sh scripts/build_byteps.sh
COPY csrc csrc
RUN --mount=type=bind,source=docker/wheels,target=/wheels \
    --mount=type=secret,id=hostca,target=/run/secrets/hostca \
    . docker/pip-env.sh \
    && BYTEPS_THC_CPU_ONLY=$BYTEPS_THC_CPU_ONLY BYTEPS_THC_TENSORFLOW=$BYTEPS_THC_TENSORFLOW \
       BYTEPS_BUILD_JOBS=$BYTEPS_BUILD_JOBS make byteps \
    && rm -rf .cache/byteps/build .cache/byteps/build.lock

# the codec extension and the rest of the project: `make ext`
COPY . .
RUN rm -rf docker/wheels \
    && THC_CUDA_ARCHS=$THC_CUDA_ARCHS make ext \
    && rm -rf build .cache \
    && .venv/bin/python -c 'import byteps_thc._C, byteps.torch' \
    && if [ "$BYTEPS_THC_TENSORFLOW" = 1 ]; then .venv/bin/python -c 'import byteps.tensorflow'; fi

FROM ${RUNTIME_BASE}
ARG BYTEPS_THC_CPU_ONLY=1
# tini is PID 1: it forwards SIGTERM (docker stop) to bpslaunch, which stops its role's
# processes, and it reaps them. libgomp1: BytePS is built with -fopenmp.
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 python3 tini \
    && if [ "$BYTEPS_THC_CPU_ONLY" = 0 ]; then \
        apt-get install -y --no-install-recommends libnuma1; fi \
    && rm -rf /var/lib/apt/lists/*
COPY --from=builder /opt/byteps-thc /opt/byteps-thc
WORKDIR /opt/byteps-thc
ENV PATH=/opt/byteps-thc/.venv/bin:$PATH PYTHONUNBUFFERED=1
# docker/entry.sh turns a host name in DMLC_PS_ROOT_URI into an address (ps-lite binds the
# scheduler to an address only), then runs CMD as it is: `docker run IMAGE bpslaunch ...`.
ENTRYPOINT ["/usr/bin/tini", "--", "/opt/byteps-thc/docker/entry.sh"]
CMD ["bpslaunch", "--help"]
