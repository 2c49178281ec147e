# byteps-thc image for clusters: the codec, the BytePS fork (server, scheduler, workers) and
# PyTorch, built from this repository exactly as `make test` builds it.
#
#   docker build -t byteps-thc .                                   # CPU workers (any x86-64 / arm64 host)
#   docker build -t byteps-thc:gpu --build-arg BASE=nvidia/cuda:13.0.0-devel-ubuntu24.04 \
#                --build-arg TORCH="torch==2.13.0 --index-url <your CUDA wheel index>" .
#
# Run one role per container with the usual BytePS variables, or a whole local cluster:
#   docker run --rm byteps-thc bpslaunch --local 2 --compressor thc -- \
#       python example/pytorch/train_digits.py
# BytePS's own sources are compiled for the build host's CPU (upstream's -march=native): build the
# image on (or for) the machines that run it. The codec core picks its SIMD kernels at run time.
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}

ARG TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
ENV DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
RUN apt-get update && apt-get install -y --no-install-recommends \
        build-essential git patch make python3 python3-venv python3-dev iproute2 \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/byteps-thc
COPY requirements.txt ./
RUN python3 -m venv .venv && .venv/bin/pip install -q ${TORCH} \
    && .venv/bin/pip install -q -r requirements.txt
COPY . .
RUN make ext byteps && rm -rf .cache/byteps/build
ENV PATH=/opt/byteps-thc/.venv/bin:$PATH
CMD ["bpslaunch", "--help"]
