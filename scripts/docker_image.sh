#!/usr/bin/env bash
# Build the byteps-thc image from the Dockerfile (make image).
#
#   scripts/docker_image.sh          byteps-thc:cpu   CPU workers, offline pip (docker/wheels/)
#   scripts/docker_image.sh --gpu    byteps-thc:gpu   CUDA worker: BASE/RUNTIME_BASE must name CUDA
#                                                     devel/runtime images this machine can pull
# Environment:
#   BASE            the builder's base (default debian:bookworm-slim; when it can be neither found
#                   nor pulled: local/debian:bookworm-slim, made by scripts/docker_base.sh)
#   RUNTIME_BASE    the final stage's base (default BASE)
#   IMAGE           the tag (default byteps-thc:cpu / byteps-thc:gpu)
#   OFFLINE=1|0     pip inside the build reads only docker/wheels/, filled here with this machine's
#                   pip configuration (default 1 for the CPU image, 0 for --gpu: its torch is the
#                   index's CUDA build, and its Python is the base's)
#   FORK=prebuilt   the image installs the fork's wheel and the codec's extension that this
#                   checkout's `make test` built (scripts/build_byteps.sh --wheel, make ext: run
#                   here first, a no-op when they are up to date), copied to docker/prebuilt/;
#                   PY / BYTEPS_THC_FORK_DIR choose another Python / --target, as for make test.
#                   Default for the CPU image when the checkout has .venv/ (or PY is given).
#   FORK=source     the image compiles both in its builder stage (default otherwise, and --gpu)
#   TF=1            TensorFlow in the image (tensorflow-cpu, keras) with the fork's TF plugin;
#                   tag byteps-thc:cpu-tf (default: without, byteps-thc:cpu)
#   BYTEPS_BUILD_JOBS, THC_CUDA_ARCHS   passed on to the build
# Starts dockerd when none runs and stops it at the end (docker/engine.sh). Layers are cached in
# the engine's data root: a rebuild redoes only the steps whose inputs changed.
set -euo pipefail
# The whole script is one block: bash reads it before running it, so that an edit to this file
# while a build runs cannot break that build.
{
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=../docker/engine.sh
. docker/engine.sh

# PY (the Python of make test, default .venv/bin/python) as an absolute path: build_byteps.sh
# runs it from its build tree
[ -z "${PY:-}" ] || PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"
gpu=0
if [ "${1:-}" = "--gpu" ]; then gpu=1; shift; fi
[ $# = 0 ] || _ddie "usage: scripts/docker_image.sh [--gpu]"
# the sdist scripts/build_byteps.sh pins (in the image it finds it in docker/wheels/ and checks
# its sha256); make byteps has downloaded it into .cache/ when it ran here
SDIST="byteps==0.2.5.post15" SDIST_FILE=byteps-0.2.5.post15.tar.gz
TF="${TF:-0}"
[ "$TF" = 0 ] || [ "$TF" = 1 ] || _ddie "TF=$TF: give TF=1 (TensorFlow in the image) or TF=0"
if [ "$gpu" = 1 ]; then
  [ -n "${BASE:-}" ] || _ddie "--gpu needs BASE=<a CUDA devel image> (and RUNTIME_BASE=<its runtime \
image>), e.g. BASE=nvidia/cuda:13.0.1-devel-ubuntu24.04: see docs/DOCKER.md"
  [ "$TF" = 0 ] || _ddie "TF=1: requirements.txt pins tensorflow-cpu, which the GPU image does not take"
  [ "${FORK:-source}" = source ] || _ddie "--gpu compiles the CUDA worker in the image: FORK=source only"
  IMAGE="${IMAGE:-byteps-thc:gpu}" OFFLINE="${OFFLINE:-0}" FORK=source
  args=(--build-arg BYTEPS_THC_CPU_ONLY=0)
else
  [ "$TF" = 1 ] && tag=byteps-thc:cpu-tf || tag=byteps-thc:cpu
  IMAGE="${IMAGE:-$tag}" OFFLINE="${OFFLINE:-1}"
  args=(--build-arg BYTEPS_THC_CPU_ONLY=1)
  if [ -z "${FORK:-}" ]; then
    [ "$OFFLINE" = 1 ] && [ -x "${PY:-.venv/bin/python}" ] && FORK=prebuilt || FORK=source
  fi
fi
case "$FORK" in
  prebuilt) [ "$OFFLINE" = 1 ] || _ddie "FORK=prebuilt needs OFFLINE=1: the wheelhouse is for \
this machine's Python, the one the prebuilt fork is built for" ;;
  source) ;;
  *) _ddie "FORK=$FORK: give FORK=prebuilt (install what make test built) or FORK=source" ;;
esac
args+=(--build-arg "BYTEPS_THC_TENSORFLOW=$TF" --build-arg "FORK=$FORK")
# the pins of requirements.txt that go into the image's .venv (scripts/venv.sh --without)
[ "$TF" = 1 ] && without=dev || without=dev,tf

docker_engine_up
trap docker_engine_down EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
t_start=$(date +%s)

# ---- the base ---------------------------------------------------------------------------------
have() { "$DOCKER" image inspect "$1" > /dev/null 2>&1; }
pull() { _dlog "pulling $1"; timeout 600 "$DOCKER" pull -q "$1" > /dev/null 2>&1; }
if [ -n "${BASE:-}" ]; then
  have "$BASE" || pull "$BASE" || _ddie "no image $BASE here, and it cannot be pulled"
  if [ -n "${RUNTIME_BASE:-}" ]; then
    have "$RUNTIME_BASE" || pull "$RUNTIME_BASE" ||
      _ddie "no image $RUNTIME_BASE here, and it cannot be pulled"
  fi
else
  BASE=debian:bookworm-slim
  if ! have "$BASE" && ! pull "$BASE"; then
    _dlog "$BASE cannot be pulled (no registry): using the local Debian base"
    BASE="$(scripts/docker_base.sh local/debian:bookworm-slim)"
  fi
fi
args+=(--build-arg "BASE=$BASE" --build-arg "RUNTIME_BASE=${RUNTIME_BASE:-$BASE}")

# ---- pip: the wheelhouse (offline) or the index -----------------------------------------------
hostpip() {  # this machine's pip, with this machine's configuration (index, find-links, CA)
  if [ -n "${PY:-}" ]; then "$PY" -m pip "$@"
  elif [ -x .venv/bin/python ]; then .venv/bin/python -m pip "$@"
  else python3 -m pip "$@"; fi
}
if [ "$OFFLINE" = 1 ]; then
  # Keyed on the pins the image installs and the sdist: refilled only when they change. The image's Python
  # must be the one these wheels are for (bookworm's 3.11 here): pip in the build refuses others.
  key="$(scripts/venv.sh --print --without "$without"; echo "$SDIST"; hostpip --version)"
  key="$(sha256sum <<< "$key" | cut -c1-16)"
  if [ "$(cat docker/wheels/.key 2> /dev/null)" != "$key" ]; then
    t0=$(date +%s)
    _dlog "filling docker/wheels/ from this machine's pip configuration (requirements.txt \
without [${without//,/], [}], + $SDIST)"
    find docker/wheels -mindepth 1 ! -name .gitignore -delete
    scripts/venv.sh --print --without "$without" > docker/wheels/requirements.txt
    hostpip download -q --disable-pip-version-check -r docker/wheels/requirements.txt \
        -d docker/wheels > /tmp/byteps-thc-wheels.log 2>&1 &&
      { cp "$ROOT/.cache/byteps/dist/$SDIST_FILE" docker/wheels/ 2> /dev/null ||  # make byteps's
        hostpip download -q --disable-pip-version-check --no-deps --no-binary :all: "$SDIST" \
          -d docker/wheels >> /tmp/byteps-thc-wheels.log 2>&1; } ||
      { grep -v '^WARNING: Location' /tmp/byteps-thc-wheels.log | tail -n 20 >&2
        _ddie "pip download failed (log: /tmp/byteps-thc-wheels.log)"; }
    echo "$key" > docker/wheels/.key
    _dlog "docker/wheels/: $(du -sh docker/wheels | cut -f1) in $(( $(date +%s) - t0 )) s"
  fi
else
  # the index this machine's pip uses, if it names one (never written into the repository)
  index="${PIP_INDEX_URL:-$(hostpip config get global.index-url 2> /dev/null || true)}"
  [ -z "$index" ] || args+=(--build-arg "PIP_INDEX_URL=$index")
fi
args+=(--build-arg "OFFLINE=$OFFLINE")
# The CA bundle pip trusts here, for pip inside the build (a BuildKit secret: never in a layer).
ca="${PIP_CERT:-$(hostpip config get global.cert 2> /dev/null || true)}"
if [ "$OFFLINE" = 0 ] && [ -n "$ca" ] && [ -f "$ca" ]; then args+=(--secret "id=hostca,src=$ca"); fi
[ -z "${BYTEPS_BUILD_JOBS:-}" ] || args+=(--build-arg "BYTEPS_BUILD_JOBS=$BYTEPS_BUILD_JOBS")
[ -z "${THC_CUDA_ARCHS:-}" ] || args+=(--build-arg "THC_CUDA_ARCHS=$THC_CUDA_ARCHS")

# ---- FORK=prebuilt: the fork's wheel and the codec's extension of this checkout's make test ----
if [ "$FORK" = prebuilt ]; then
  t0=$(date +%s)
  find docker/prebuilt -mindepth 1 ! -name .gitignore -delete
  # make byteps's build (a no-op when up to date): leaves its wheel in docker/prebuilt/
  PY="${PY:-$ROOT/.venv/bin/python}" nice scripts/build_byteps.sh \
    ${BYTEPS_THC_FORK_DIR:+--target "$BYTEPS_THC_FORK_DIR"} --wheel docker/prebuilt ||
    _ddie "the fork's build failed: fix it (make byteps), or build the image with FORK=source"
  read -r _ mode_cpu mode_tf < docker/prebuilt/byteps.key
  [ "$mode_cpu" = cpu_only=1 ] || _ddie "this checkout's fork is the CUDA worker ($mode_cpu): the \
CPU image needs the CPU-only one; build it with FORK=source"
  [ "$TF" = 0 ] || [ "$mode_tf" = tensorflow=1 ] || _ddie "TF=1, but this checkout's fork has no \
TensorFlow plugin ($mode_tf): make byteps with tensorflow in .venv, or FORK=source"
  # make ext's build (a no-op when up to date); with PY given (no .venv here), the extension as
  # it is, if no input of it is newer
  if [ -z "${PY:-}" ]; then
    make -s ext || _ddie "the codec extension's build failed (make ext)"
  else
    so="$(ls byteps_thc/_C*.so 2> /dev/null | head -n 1)"
    [ -n "$so" ] && [ -z "$(find setup.py csrc/build_facts.py csrc/thc csrc/lhc csrc/common csrc/python -newer "$so" -type f | head -n 1)" ] ||
      _ddie "byteps_thc/_C*.so is missing or older than its sources: build it (make ext)"
  fi
  so="$(ls byteps_thc/_C*.so | head -n 1)"
  # (grep without -q: under pipefail, grep -q can exit before ldd has written everything, and
  # ldd's SIGPIPE would make the test false)
  if ldd "$so" 2> /dev/null | grep 'libcudart' > /dev/null; then
    # make ext linked the CUDA kernels (nvcc is here): the CPU image has no CUDA runtime, so it
    # gets the same sources built by the same setup.py with THC_CUDA=0, apart from make ext's
    # (cached on its inputs)
    ekey="$( { "${PY:-.venv/bin/python}" -c 'import sys; print(sys.version)'
               find setup.py csrc/build_facts.py csrc/thc csrc/lhc csrc/common csrc/python -type f | sort | xargs sha256sum; } |
             sha256sum | cut -c1-16)"
    edir="$ROOT/.cache/docker-ext/$ekey"
    if ! ls "$edir"/byteps_thc/_C*.so > /dev/null 2>&1; then
      _dlog "make ext linked CUDA: building the extension without it (THC_CUDA=0) for the CPU image"
      rm -rf "$ROOT/.cache/docker-ext"
      THC_CUDA=0 nice "${PY:-.venv/bin/python}" setup.py -q build_ext --build-lib "$edir" \
        --build-temp "$edir/tmp" > /tmp/byteps-thc-ext.log 2>&1 ||
        { tail -n 20 /tmp/byteps-thc-ext.log >&2; _ddie "the CPU-only extension's build failed"; }
    fi
    so="$(ls "$edir"/byteps_thc/_C*.so | head -n 1)"
  fi
  cp "$so" docker/prebuilt/
  _dlog "FORK=prebuilt: $(cd docker/prebuilt && echo byteps-*.whl _C*.so) in $(( $(date +%s) - t0 )) s"
fi

# ---- build ------------------------------------------------------------------------------------
LOG="/tmp/byteps-thc-image-${IMAGE//[^A-Za-z0-9_.-]/-}.log"
t0=$(date +%s)
[ "$OFFLINE" = 1 ] && how="docker/wheels/ only" || how="the index"
_dlog "building $IMAGE (base $BASE; FORK=$FORK; pip from $how; log $LOG)"
set +e
: > "$LOG"  # (the progress filter below must not read an older build's log)
"$DOCKER" build --progress=plain "${args[@]}" -t "$IMAGE" . > "$LOG" 2>&1 &
pid=$!
# one line a finished step (its time, or CACHED) and the fork build's progress, not every line
tail -n +1 -f "$LOG" --pid=$pid 2> /dev/null | awk '
  match($0, /^#[0-9]+ \[/) { id = $1; if (!(id in step)) step[id] = substr($0, length(id) + 2, 100); next }
  $2 == "DONE" && (($1) in step) { printf "[docker build] %s  %s\n", $3, step[$1]; fflush(); next }
  $2 == "CACHED" && (($1) in step) { printf "[docker build] CACHED %s\n", step[$1]; fflush(); next }
  $2 == "ERROR" { print "[docker build] " $0; fflush(); next }
  /\[build_byteps\] (building|installed|up to date)/ { sub(/^#[0-9]+ [0-9.]+ /, ""); print "[docker build] " $0; fflush() }' >&2
wait $pid; rc=$?
set -e
if [ $rc -ne 0 ]; then
  grep -v '^WARNING: Location' "$LOG" | tail -n 40 >&2
  _ddie "docker build failed (exit $rc; log: $LOG)"
fi
size="$("$DOCKER" image inspect -f '{{.Size}}' "$IMAGE")"
_dlog "built $IMAGE in $(( $(date +%s) - t0 )) s ($(( size / 1000000 )) MB); $(( $(date +%s) - t_start )) s in all"
exit 0
}
