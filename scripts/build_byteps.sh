#!/usr/bin/env bash
# Build and install the BytePS fork of byteps-thc into .venv/:
#   the pinned byteps==0.2.5.post15 sdist (downloaded with pip, sha256-checked)
#   + our patch series csrc/byteps/patches/*.patch (applied in name order)
#   + our patches of the ZeroMQ 4.1.4 that the sdist bundles, csrc/byteps/patches/zeromq/*.patch
#     (copied to zeromq-patches/; patch 0025 applies them after unpacking the tarball)
#   + our sources: every file under csrc/byteps/src/ (same relative path in the tree)
#     and the codec cores csrc/thc/*.{h,cc} and csrc/lhc/*.{h,cc} (into thc/ and lhc/), with
#     the headers they share, csrc/common/*.h (into common/), and how to compile them,
#     csrc/build_facts.py (to the tree root, beside byteps_thc_build.py, which reads it)
# -> the server and the PyTorch plugin, built as a wheel in .cache/byteps/build/KEY/dist/ and
#    installed from that wheel with pip (the wheel stays: the Docker image installs the same one).
#
# Cached and idempotent: a stamp keyed on the sdist hash, the patches, our sources, this script,
# the mode and the Python/torch versions; nothing is rebuilt while the key is unchanged.
# Offline apart from the package index: ZeroMQ comes from the tarball the sdist bundles.
#
# Usage: scripts/build_byteps.sh [--server-only] [--target DIR] [--force] [--wheel DIR]
#          (--wheel DIR: also copy the wheel that is installed into DIR; built again if the
#          install is up to date but its wheel is gone)
#        scripts/build_byteps.sh --target DIR --without NNNN[,NNNN]  # the series minus those patches
#          (a test variant, e.g. to show a fix's test failing without it; needs --target, never
#          .venv; built in .cache/byteps/build-without-NNNN/, apart from the normal build)
#        scripts/build_byteps.sh --devtree DIR     # git tree: pristine sdist + one commit a patch
#          (message: the patch's file name, a blank line, then its subject and body)
#        scripts/build_byteps.sh --export DIR      # rewrite the patch series from that tree
#          (every header: subject = what, <= 72 chars; body = why; no dates, one author)
#        scripts/build_byteps.sh --zeromq --devtree DIR | --zeromq --export DIR
#          (the same for ZeroMQ 4.1.4 from the sdist's tarball and csrc/byteps/patches/zeromq/)
# Environment:
#   BYTEPS_THC_CPU_ONLY=1|0  force the CPU-only worker (1) or the CUDA/NCCL worker (0). Unset: CUDA
#                            only when torch is built with CUDA *and* sees a GPU (driver + device);
#                            an installed nvcc alone does not count (CI has nvcc and no GPU).
#                            The CUDA worker: CUDA from nvcc's tree (or BYTEPS_CUDA_HOME), NCCL from
#                            BYTEPS_NCCL_HOME, the system (libnccl-dev) or the pinned nvidia-nccl-cu13
#                            wheel, and libnuma-dev;
#                            built in .cache/byteps/build-cuda/, apart from the CPU build. Against a
#                            CPU torch it is a compile-and-link check (make byteps-cuda): its torch
#                            plugin cannot load there (no libc10_cuda), so it needs --target DIR.
#   BYTEPS_BUILD_JOBS=N      parallel compiles (default 2).  PY=...  the Python to build for.
#   BYTEPS_THC_TENSORFLOW=0  no TensorFlow plugin (built by default when tensorflow is importable).
set -euo pipefail
# The whole script is one block: bash reads it before running it, so editing this file while a
# build runs cannot break that build.
{

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PY:-$ROOT/.venv/bin/python}"
SDIST_VERSION="0.2.5.post15"
SDIST="byteps-$SDIST_VERSION.tar.gz"
SDIST_SHA256="9d6a3c5be4c4b5a172739744bb32725c433f9a9f63794e1885e7376ff4eea99f"
SDIST_SIZE=4568030
# NCCL for the CUDA worker (BYTEPS_THC_CPU_ONLY=0): nccl.h and libnccl.so.2 from NVIDIA's wheel for
# CUDA 13 on the package index (x86-64; elsewhere set BYTEPS_NCCL_HOME).
NCCL_VERSION="2.28.9"
NCCL_WHEEL="nvidia_nccl_cu13-$NCCL_VERSION-py3-none-manylinux_2_18_x86_64.whl"
NCCL_WHEEL_SHA256="e4553a30f34195f3fa1da02a6da3d6337d28f2003943aa0a3d247bbc25fefc42"
PATCHES="$ROOT/csrc/byteps/patches"
ZMQ_PATCHES="$PATCHES/zeromq"  # against zeromq-4.1.4/ of the sdist's tarball (-p1)
SRC="$ROOT/csrc/byteps/src"
CORE="$ROOT/csrc/thc"
LHC_CORE="$ROOT/csrc/lhc"
CODEC_COMMON="$ROOT/csrc/common"  # header-only: what both cores include as common/*.h
BUILD_FACTS="$ROOT/csrc/build_facts.py"  # the cores' sources and flags (every build reads it)
CACHE="$ROOT/.cache/byteps"
export BYTEPS_BUILD_JOBS="${BYTEPS_BUILD_JOBS:-2}"

log() { echo "[build_byteps] $*" >&2; }
die() { echo "[build_byteps] error: $*" >&2; exit 1; }

server_only=0; target=""; force=0; devtree=""; export_dir=""; without=""; wheel_dir=""; zeromq=0
while [ $# -gt 0 ]; do
  case "$1" in
    --server-only) server_only=1 ;;
    --target) target="$(mkdir -p "$2" && cd "$2" && pwd)"; shift ;;
    --force) force=1 ;;
    --wheel) wheel_dir="$(mkdir -p "$2" && cd "$2" && pwd)"; shift ;;
    --without) without="${without:+$without,}$2"; shift ;;
    --devtree) devtree="$2"; shift ;;
    --export) export_dir="$2"; shift ;;
    --zeromq) zeromq=1 ;;
    -h|--help) sed -n '2,34p' "$0"; exit 0 ;;
    *) die "unknown argument $1" ;;
  esac
  shift
done

# ---- the pinned sdist ------------------------------------------------------------------------
fetch_sdist() {
  mkdir -p "$CACHE/dist"
  local f="$CACHE/dist/$SDIST"
  if [ ! -f "$f" ] || [ "$(sha256sum "$f" | cut -d' ' -f1)" != "$SDIST_SHA256" ]; then
    rm -f "$f"
    log "downloading byteps==$SDIST_VERSION (sdist) from the package index"
    "$PY" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
      "byteps==$SDIST_VERSION" -d "$CACHE/dist" > "$CACHE/dist/pip.log" 2>&1 ||
      { cat "$CACHE/dist/pip.log" >&2; die "pip download failed"; }
  fi
  [ "$(stat -c %s "$f")" = "$SDIST_SIZE" ] || die "$SDIST: wrong size"
  [ "$(sha256sum "$f" | cut -d' ' -f1)" = "$SDIST_SHA256" ] || die "$SDIST: sha256 mismatch"
  echo "$f"
}

# The CUDA toolkit's root: BYTEPS_CUDA_HOME, CUDA_HOME, else the tree of the nvcc on PATH (nvcc may
# be a wrapper script, so ask nvcc itself), else /usr/local/cuda.
cuda_home() {
  local top="${BYTEPS_CUDA_HOME:-${CUDA_HOME:-}}"
  if [ -z "$top" ] && command -v nvcc > /dev/null; then
    top="$(nvcc --dryrun -c -x cu /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -n 1)"
  fi
  top="${top:-/usr/local/cuda}"
  [ -f "$top/include/cuda_runtime.h" ] || die "no CUDA toolkit at $top (set BYTEPS_CUDA_HOME)"
  (cd "$top" && pwd -P)
}

# NCCL's headers and library from the pinned wheel, unpacked once into $CACHE/nccl-VERSION/
# (include/, lib/libnccl.so.2 and its link-time name lib/libnccl.so); prints that folder.
fetch_nccl() {
  local dir="$CACHE/nccl-$NCCL_VERSION" whl="$CACHE/dist/$NCCL_WHEEL"
  if [ ! -f "$dir/lib/libnccl.so.2" ]; then
    mkdir -p "$CACHE/dist"
    log "downloading nvidia-nccl-cu13==$NCCL_VERSION (wheel, ~190 MiB) from the package index"
    "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary :all: \
      "nvidia-nccl-cu13==$NCCL_VERSION" -d "$CACHE/dist" > "$CACHE/dist/pip-nccl.log" 2>&1 ||
      { cat "$CACHE/dist/pip-nccl.log" >&2; die "pip download nvidia-nccl-cu13 failed"; }
    [ -f "$whl" ] || die "no $NCCL_WHEEL (another platform? set BYTEPS_NCCL_HOME)"
    [ "$(sha256sum "$whl" | cut -d' ' -f1)" = "$NCCL_WHEEL_SHA256" ] || die "$NCCL_WHEEL: sha256 mismatch"
    local tmp; tmp="$(mktemp -d "$CACHE/nccl.XXXXXX")"
    "$PY" - "$whl" "$tmp" <<'PYEOF' || die "unpacking $NCCL_WHEEL failed"
import os, shutil, sys, zipfile
whl, out = sys.argv[1:]
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        for part in ("include", "lib"):
            prefix = "nvidia/nccl/%s/" % part
            if name.startswith(prefix) and not name.endswith("/"):
                dst = os.path.join(out, part, name[len(prefix):])
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                with z.open(name) as src, open(dst, "wb") as f:
                    shutil.copyfileobj(src, f)
PYEOF
    ln -s libnccl.so.2 "$tmp/lib/libnccl.so"
    rm -rf "$dir" && mv "$tmp" "$dir" && rm -f "$whl"  # the unpacked files are what is kept
  fi
  echo "$dir"
}

patch_list() {
  find "$PATCHES" -maxdepth 1 -name '[0-9][0-9][0-9][0-9]-*.patch' | sort |
    { if [ -n "$without" ]; then grep -v -E "/(${without//,/|})-[^/]*\.patch\$"; else cat; fi; }
}
zmq_patch_list() {
  find "$ZMQ_PATCHES" -maxdepth 1 -name '[0-9][0-9][0-9][0-9]-*.patch' 2> /dev/null | sort
}
if [ -n "$without" ]; then
  [[ "$without" =~ ^[0-9]{4}(,[0-9]{4})*$ ]] || die "--without takes patch numbers: NNNN[,NNNN]"
  [ -n "$target$devtree" ] || die "--without needs --target DIR (a variant never goes into .venv)"
  for n in ${without//,/ }; do
    ls "$PATCHES/$n"-*.patch > /dev/null 2>&1 || die "--without $n: no patch $n-*.patch"
  done
fi

# ---- patch maintenance: --devtree / --export ---------------------------------------------------
# --zeromq: ZeroMQ's series (csrc/byteps/patches/zeromq/) against the tarball the sdist bundles
[ -z "$devtree$export_dir" ] || [ "$zeromq" = 0 ] || [ -z "$without" ] ||
  die "--without names patches of BytePS's series, not ZeroMQ's"
series_dir="$PATCHES"; [ "$zeromq" = 0 ] || series_dir="$ZMQ_PATCHES"
if [ -n "$devtree" ]; then
  sdist="$(fetch_sdist)"
  [ ! -e "$devtree" ] || die "$devtree exists"
  mkdir -p "$devtree"
  if [ "$zeromq" = 1 ]; then
    tar --no-same-owner -xzOf "$sdist" "byteps-$SDIST_VERSION/zeromq-4.1.4.tar.gz" |
      tar --no-same-owner -xz -C "$devtree" --strip-components=1
    pristine="zeromq 4.1.4 of the byteps $SDIST_VERSION sdist (pristine)"
  else
    tar --no-same-owner -xzf "$sdist" -C "$devtree" --strip-components=1
    pristine="byteps $SDIST_VERSION sdist (pristine)"
  fi
  cd "$devtree"
  git init -q && git add -A && git -c user.name=byteps-thc -c user.email=byteps-thc@localhost \
    commit -qm "$pristine" && git tag pristine
  for p in $( if [ "$zeromq" = 1 ]; then zmq_patch_list; else patch_list; fi ); do
    git apply --whitespace=nowarn "$p" || die "$(basename "$p") does not apply"
    git add -A
    # The commit message: the file name, then the patch's subject (what) and body (why).
    # format-patch folds a long Subject header over lines that start with a space: unfold it.
    msg="$(awk '/^Subject: /{on=1; sub(/^Subject: (\[PATCH\] )?/, ""); printf "%s", $0; next}
                on==1 && /^ /{printf "%s", $0; next}
                on==1{on=2; print ""}
                on==2 && (/^---$/||/^diff --git /){exit}
                on==2' "$p")"
    msg="$(basename "$p")"$'\n\n'"$msg"
    git -c user.name=byteps-thc -c user.email=byteps-thc@localhost commit -q -m "$msg"
  done
  log "dev tree ready in $devtree: one commit a patch (subject = patch file name), tag 'pristine'"
  exit 0
fi
if [ -n "$export_dir" ]; then
  cd "$export_dir"
  for c in $(git rev-list --reverse pristine..HEAD); do
    name="$(git log -1 --format=%s "$c")"
    [[ "$name" =~ ^[0-9]{4}-[A-Za-z0-9._-]+\.patch$ ]] || die "commit $c: subject must be NNNN-name.patch, is '$name'"
    # One convention for every patch header: the message after the file name is the patch's
    # subject (what it does, 72 characters at most) and a body (why).
    msg="$(git log -1 --format=%B "$c" | sed '1,/^$/d')"
    subject="$(head -n1 <<< "$msg")"
    [ -n "$subject" ] && [ ${#subject} -le 72 ] || die "$name: subject (what, <= 72 chars) is '$subject'"
    [ -n "$(sed '1,/^$/d' <<< "$msg" | tr -d '[:space:]')" ] || die "$name: no body (why) after the subject"
    # the patch as its own commit, with a fixed author and no dates: unchanged patches stay
    # byte-identical
    pc="$(GIT_AUTHOR_NAME=byteps-thc GIT_AUTHOR_EMAIL=byteps-thc@localhost \
          GIT_COMMITTER_NAME=byteps-thc GIT_COMMITTER_EMAIL=byteps-thc@localhost \
          git commit-tree "$c^{tree}" -p "$c^" -m "$msg")"
    tmp="$(mktemp)"
    git format-patch -1 "$pc" -U1 --no-signature --zero-commit --no-stat --stdout |
      sed '/^Date: /d' > "$tmp"
    mkdir -p "$series_dir"
    if cmp -s "$tmp" "$series_dir/$name"; then rm -f "$tmp"; else mv "$tmp" "$series_dir/$name"; log "wrote ${series_dir#"$ROOT/"}/$name"; fi
  done
  exit 0
fi

# ---- mode and cache key ----------------------------------------------------------------------
[ -x "$PY" ] || die "$PY not found (run make venv)"
if [ -z "${BYTEPS_THC_CPU_ONLY:-}" ]; then
  BYTEPS_THC_CPU_ONLY="$("$PY" -c 'import torch; print(0 if (torch.version.cuda and torch.cuda.is_available()) else 1)' 2>/dev/null || echo 1)"
fi
export BYTEPS_THC_CPU_ONLY
[ "$BYTEPS_THC_CPU_ONLY" = 1 ] && mode="cpu-only worker" || mode="CUDA worker"
[ "$server_only" = 1 ] && mode="server only"
cuda_worker=0 nccl_from=""
if [ "$server_only" = 0 ] && [ "$BYTEPS_THC_CPU_ONLY" = 0 ]; then
  cuda_worker=1
  BYTEPS_CUDA_HOME="$(cuda_home)" || exit 1
  export BYTEPS_CUDA_HOME
  export CUDA_HOME="${CUDA_HOME:-$BYTEPS_CUDA_HOME}"  # torch's CUDAExtension reads CUDA_HOME
  # NCCL: BYTEPS_NCCL_HOME (upstream's variable), else the system's (libnccl-dev: what the GPU
  # image installs; linked statically, as upstream does), else the pinned wheel
  if [ -n "${BYTEPS_NCCL_HOME:-}" ]; then nccl_from="BYTEPS_NCCL_HOME=$BYTEPS_NCCL_HOME"
  elif [ -f /usr/include/nccl.h ]; then nccl_from="system"
  else nccl_from="wheel nvidia-nccl-cu13==$NCCL_VERSION $NCCL_WHEEL_SHA256"; fi
  if ! "$PY" -c 'import sys, torch; sys.exit(torch.version.cuda is None)' 2>/dev/null; then
    mode="$mode, compile-and-link check (CPU torch)"
    [ -n "$target" ] || die "a CUDA worker against a CPU torch cannot load (no libc10_cuda): it is a compile-and-link check, and needs --target DIR"
  fi
fi
# Other framework plugins (issue 6). The TensorFlow plugin too, by default, when tensorflow is
# importable here (requirements.txt pins tensorflow-cpu); a failing TF plugin fails the build.
# BYTEPS_THC_TENSORFLOW=0: torch's only. BYTEPS_THC_MXNET=1: the MXNet plugin instead of torch's
# (MXNet's own environment, make mxnet-env).
with_tf=0 with_mx="${BYTEPS_THC_MXNET:-0}"
if [ "$server_only" = 0 ] && [ "$with_mx" != 1 ] && [ "${BYTEPS_THC_TENSORFLOW:-1}" = 1 ] &&
   "$PY" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("tensorflow") is None)' 2>/dev/null; then
  with_tf=1 mode="$mode + TensorFlow"
fi
if [ "$server_only" = 0 ] && [ "$with_mx" = 1 ]; then mode="$mode, MXNet"; fi

sdist="$(fetch_sdist)"
key="$( {
  echo "sdist $SDIST_SHA256 cpu=$BYTEPS_THC_CPU_ONLY server_only=$server_only without=$without"
  "$PY" -c 'import sys; print(sys.version)'
  [ "$server_only$with_mx" != 00 ] || "$PY" -c 'import torch; print("torch", torch.__version__)'
  echo "tf=$with_tf mxnet=$with_mx"  # the plugins are tied to the exact framework versions
  if [ "$cuda_worker" = 1 ]; then  # the CUDA worker: its toolkit and its NCCL
    echo "cuda $BYTEPS_CUDA_HOME"; "$BYTEPS_CUDA_HOME/bin/nvcc" --version | tail -n 1
    echo "nccl $nccl_from"
  fi
  [ "$with_tf$with_mx" = 00 ] || "$PY" -c 'import importlib.metadata as m
for d in ("tensorflow", "tensorflow-cpu", "keras", "mxnet"):
    try: print(d, m.version(d))
    except m.PackageNotFoundError: pass'
  sha256sum "$0"
  for p in $(patch_list); do sha256sum "$p"; done
  for p in $(zmq_patch_list); do sha256sum "$p"; done
  (cd "$SRC" 2>/dev/null && find . -type f ! -name '*.pyc' ! -path '*/__pycache__/*' | sort | xargs -r sha256sum)
  (cd "$CORE" && find . -maxdepth 1 -type f \( -name '*.h' -o -name '*.cc' \) | sort | xargs -r sha256sum)
  (cd "$LHC_CORE" && find . -maxdepth 1 -type f \( -name '*.h' -o -name '*.cc' \) | sort | xargs -r sha256sum)
  (cd "$CODEC_COMMON" && find . -maxdepth 1 -type f \( -name '*.h' -o -name '*.cc' \) | sort | xargs -r sha256sum)
  sha256sum < "$BUILD_FACTS"
  # the CUDA worker's torch plugin links the kernels (byteps_thc_build.extra_objects)
  [ "$cuda_worker" = 0 ] || { (cd "$CORE/cuda" && find . -maxdepth 1 -type f | sort | xargs -r sha256sum)
    echo "THC_CUDA_ARCHS=${THC_CUDA_ARCHS:-}"; }
} | sha256sum | cut -c1-16)"

dest="${target:-$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')}"
stamp="$dest/.byteps-thc-build.stamp"
builds="$CACHE/build${without:+-without-${without//,/-}}"  # a variant never touches the normal tree
[ "$with_mx" != 1 ] || builds="$builds-mxnet"  # nor does MXNet's (each cleans only its own)
[ "$cuda_worker" = 0 ] || builds="$builds-cuda"   # nor does the CUDA worker's
work="$builds/$key"
wheel() { ls "$work"/dist/byteps-*.whl 2> /dev/null | head -n 1; }
up_to_date() {
  [ "$force" = 0 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$key" ] && [ -d "$dest/byteps" ] &&
    { [ -z "$wheel_dir" ] || [ -n "$(wheel)" ]; }
}
copy_wheel() {
  [ -n "$wheel_dir" ] || return 0
  find "$wheel_dir" -maxdepth 1 -name 'byteps-*.whl' -delete
  # byteps.key: the build's key and mode (scripts/docker_image.sh checks the mode it needs)
  cp "$(wheel)" "$wheel_dir/" && echo "$key cpu_only=$BYTEPS_THC_CPU_ONLY tensorflow=$with_tf" \
    > "$wheel_dir/byteps.key"
  log "wheel $(basename "$(wheel)") -> $wheel_dir"
}
if up_to_date; then
  log "up to date ($mode, key $key)"
  copy_wheel
  exit 0
fi

# ---- prepare the tree ------------------------------------------------------------------------
# ps-lite's ZeroMQ is built with libsodium, for the cluster key's CURVE security (patch 0022),
# and every BytePS library links it: Debian's libsodium-dev (headers, libsodium.so, its
# pkg-config file), installed here when missing and we may (root with apt-get).
if ! pkg-config --exists libsodium 2> /dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
    log "installing libsodium-dev and pkg-config (apt-get)"
    mkdir -p "$CACHE"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends libsodium-dev pkg-config; } > "$CACHE/apt.log" 2>&1 ||
      { tail -n 20 "$CACHE/apt.log" >&2; die "apt-get install libsodium-dev pkg-config failed"; }
  fi
  pkg-config --exists libsodium 2> /dev/null ||
    die "libsodium is missing: install Debian's libsodium-dev and pkg-config (as root: apt-get install libsodium-dev pkg-config)"
fi
start=$(date +%s)
# One build of a tree at a time (two builds in one checkout deleted each other's files); the
# second waits, then finds the first one's install if it was the same.
mkdir -p "$builds"
exec 9> "$builds.lock"
if ! flock -n 9; then log "another build of $builds is running; waiting for it"; flock 9; fi
if up_to_date; then
  log "up to date ($mode, key $key, built meanwhile)"
  copy_wheel
  exit 0
fi
if [ "$cuda_worker" = 1 ]; then
  # The CUDA worker links libnuma (upstream's NUMA placement of cross-PCIe-switch buffers) and
  # NCCL; upstream's setup.py finds NCCL at BYTEPS_NCCL_HOME, static unless BYTEPS_NCCL_LINK says.
  if [ ! -f /usr/include/numa.h ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
      log "installing libnuma-dev (apt-get)"
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
          --no-install-recommends libnuma-dev; } > "$CACHE/apt-numa.log" 2>&1 ||
        { tail -n 20 "$CACHE/apt-numa.log" >&2; die "apt-get install libnuma-dev failed"; }
    fi
    [ -f /usr/include/numa.h ] || die "the CUDA worker needs libnuma: install Debian's libnuma-dev"
  fi
  if [ "${nccl_from%% *}" = wheel ]; then
    BYTEPS_NCCL_HOME="$(fetch_nccl)" || exit 1
    export BYTEPS_NCCL_HOME BYTEPS_NCCL_LINK=SHARED  # the wheel has no static library
  fi
  log "CUDA $BYTEPS_CUDA_HOME; NCCL: $nccl_from, linked ${BYTEPS_NCCL_LINK:-static}"
fi
[ -z "$without" ] || mode="$mode, without patch ${without//,/, }"
log "building BytePS $SDIST_VERSION + $(patch_list | wc -l) patches ($mode, key $key, -j$BYTEPS_BUILD_JOBS)"
rm -rf "$work"; mkdir -p "$work"
tar --no-same-owner -xzf "$sdist" -C "$work" --strip-components=1
cd "$work"
apply() { patch -p1 --batch --forward --fuzz="$1" --no-backup-if-mismatch -s "${@:2}" < "$p"; }
for p in $(patch_list); do
  log "patch $(basename "$p")"
  if [ -n "$without" ] && ! apply 0 --dry-run > /dev/null && apply 1 --dry-run > /dev/null; then
    # A later patch whose one line of context is a line of a left-out patch (0011 after 0005)
    log "  ... with --fuzz=1: its context includes lines of patch(es) $without"
    apply 1
  else
    apply 0 || die "$(basename "$p") does not apply${without:+ without patch(es) $without}"
  fi
done
: > thc_added_files.txt
if [ -d "$SRC" ]; then
  (cd "$SRC" && find . -type f ! -name '*.pyc' ! -path '*/__pycache__/*' | sed 's|^\./||' | sort) |
  while read -r rel; do
    mkdir -p "$(dirname "$rel")"; cp "$SRC/$rel" "$rel"; echo "$rel" >> thc_added_files.txt
  done
fi
for core in "$CORE" "$LHC_CORE" "$CODEC_COMMON"; do  # csrc/{thc,lhc,common} -> {thc,lhc,common}/
  sub="$(basename "$core")"; mkdir -p "$sub"
  for f in "$core"/*.h "$core"/*.cc; do
    [ -e "$f" ] || continue
    cp "$f" "$sub/"; echo "$sub/$(basename "$f")" >> thc_added_files.txt
  done
done
if [ "$cuda_worker" = 1 ]; then  # csrc/thc/cuda -> thc/cuda/: the kernels and their nvcc build
  mkdir -p thc/cuda
  for f in "$CORE"/cuda/*.cu "$CORE"/cuda/*.cuh "$CORE"/cuda/*.h "$CORE"/cuda/build.py; do
    [ -e "$f" ] || continue
    cp "$f" thc/cuda/; echo "thc/cuda/$(basename "$f")" >> thc_added_files.txt
  done
fi
cp "$BUILD_FACTS" build_facts.py && echo build_facts.py >> thc_added_files.txt
log "added $(wc -l < thc_added_files.txt) files of ours"
mkdir -p zeromq-patches
for p in $(zmq_patch_list); do cp "$p" zeromq-patches/; done
# ZeroMQ (with libsodium) changes only with our patches of it: reuse the one built before with
# the same ones (~30 s; the name holds their hash, so a changed patch builds it anew).
zmq_cache="$CACHE/zmq-deps-sodium"
if [ -n "$(zmq_patch_list)" ]; then
  zmq_cache="$zmq_cache-$(for p in $(zmq_patch_list); do sha256sum < "$p"; done | sha256sum | cut -c1-16)"
fi
if [ -d "$zmq_cache/include" ]; then
  mkdir -p 3rdparty/ps-lite/deps && cp -a "$zmq_cache/." 3rdparty/ps-lite/deps/
  log "ZeroMQ from $zmq_cache"
fi

# ---- build and install -----------------------------------------------------------------------
export BYTEPS_WITHOUT_TENSORFLOW=1 BYTEPS_WITHOUT_MXNET=1
if [ "$server_only" = 1 ]; then
  export BYTEPS_WITHOUT_PYTORCH=1
else
  export BYTEPS_WITH_PYTORCH=1  # a failing torch plugin fails the build instead of being skipped
fi
if [ "$with_tf" = 1 ]; then unset BYTEPS_WITHOUT_TENSORFLOW; export BYTEPS_WITH_TENSORFLOW=1; fi
if [ "$server_only" = 0 ] && [ "$with_mx" = 1 ]; then
  unset BYTEPS_WITHOUT_MXNET BYTEPS_WITH_PYTORCH; export BYTEPS_WITHOUT_PYTORCH=1 BYTEPS_WITH_MXNET=1
fi
# A wheel first, then an install of that wheel (what `pip install .` does, with the wheel kept)
pip_args=(--no-deps --no-cache-dir --disable-pip-version-check)
# --force-reinstall: a wheel of the same version (the sdist's) is otherwise "already satisfied"
inst_args=(install --force-reinstall "${pip_args[@]}")
[ -n "$target" ] && inst_args+=(--target "$target" --upgrade)
log "compiling (full log: $work/build.log)"
set +e
{ nice "$PY" -m pip wheel --no-build-isolation "${pip_args[@]}" -v -w dist . &&
    "$PY" -m pip "${inst_args[@]}" dist/byteps-*.whl; } > build.log 2>&1 &
pid=$!
tail -n +1 -f build.log --pid=$pid 2>/dev/null |
  grep --line-buffered -E '\[byteps-thc build\]|INFO: |error:|Error:|Successfully installed' |
  grep --line-buffered -v 'error_feedback' | sed -u 's/^ *//; s/^/[build_byteps] /'
wait $pid; rc=$?
set -e
if [ $rc -ne 0 ]; then
  grep -E -B2 -A8 'error' build.log | tail -n 60 >&2
  die "build failed (exit $rc); full log: $work/build.log"
fi
if [ ! -d "$zmq_cache/include" ] && [ -d 3rdparty/ps-lite/deps/include ]; then
  rm -rf "$zmq_cache.tmp" && cp -a 3rdparty/ps-lite/deps "$zmq_cache.tmp" &&
    mv "$zmq_cache.tmp" "$zmq_cache"
fi
# keep the newest tree only (for reading its build.log), drop the others
find "$builds" -mindepth 1 -maxdepth 1 ! -name "$key" -exec rm -rf {} +
# where the CUDA worker's libraries find CUDA and NCCL (tests/unit/test_cuda_worker_build.py)
[ "$cuda_worker" = 0 ] ||
  printf '%s\n' "$BYTEPS_CUDA_HOME/lib64" ${BYTEPS_NCCL_HOME:+"$BYTEPS_NCCL_HOME/lib"} \
    > "$dest/.byteps-thc-cuda-libdirs"
echo "$key" > "$stamp"
log "installed into $dest in $(( $(date +%s) - start )) s ($mode)"
copy_wheel
exit 0
}
