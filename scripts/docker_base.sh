#!/usr/bin/env bash
# The Debian base image for the byteps-thc image where no container registry can be reached (this
# machine, air-gapped clusters): Debian bookworm, variant minbase (what debian:bookworm-slim is),
# made with debootstrap from the Debian mirror this machine's apt already uses, then imported.
#
#   scripts/docker_base.sh [--force] [IMAGE]     IMAGE defaults to local/debian:bookworm-slim
#
# Prints nothing on stdout but IMAGE. Starts dockerd when none runs, and stops it again at the end
# (docker/engine.sh). Needs root (debootstrap); installs debootstrap with apt when it is missing.
# When this machine is Debian bookworm, its apt sources (the Debian entries) go into the image, so
# that apt inside a build uses the same mirrors (and security updates) as the host.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=../docker/engine.sh
. "$ROOT/docker/engine.sh"

force=0
if [ "${1:-}" = "--force" ]; then force=1; shift; fi
IMAGE="${1:-local/debian:bookworm-slim}"
SUITE=bookworm

docker_engine_up
rootfs=""
cleanup() { [ -z "$rootfs" ] || rm -rf "$rootfs"; docker_engine_down; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [ "$force" = 0 ] && "$DOCKER" image inspect "$IMAGE" > /dev/null 2>&1; then
  _dlog "base image $IMAGE exists"
  echo "$IMAGE"
  exit 0
fi

[ "$(id -u)" = 0 ] || _ddie "no base image $IMAGE, and making one with debootstrap needs root"
if ! command -v debootstrap > /dev/null; then
  command -v apt-get > /dev/null || _ddie "no base image $IMAGE and no debootstrap to make one: \
install debootstrap, or give BASE=<an image this engine has or can pull>"
  docker_apt_install debootstrap
fi

# The Debian mirror of the host's apt sources: one-line (deb URI SUITE ...) or deb822 (URIs: /
# Suites:) entries whose suite is exactly $SUITE. None (not a Debian host): debootstrap's default.
mirror="$({ cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
              /etc/apt/sources.list.d/*.sources 2> /dev/null || true; } | awk -v s="$SUITE" '
  /^[[:space:]]*#/ { next }
  $1 == "deb" { i = 2; if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
                if ($(i + 1) == s) { print $i; exit } next }
  /^URIs:/   { uri = $2 }
  /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == s && uri != "") { print uri; exit } }
  /^$/       { uri = "" }')"
host_suite="$(. /etc/os-release 2> /dev/null && echo "${VERSION_CODENAME:-}")"

rootfs="$(mktemp -d /tmp/byteps-thc-rootfs.XXXXXX)"
t0=$(date +%s)
_dlog "no base image $IMAGE: debootstrap --variant=minbase $SUITE ${mirror:-(the default mirror of debootstrap)}"
nice debootstrap --variant=minbase "$SUITE" "$rootfs" ${mirror:+"$mirror"} > "$rootfs.log" 2>&1 ||
  { tail -n 20 "$rootfs.log" >&2; _ddie "debootstrap failed (log: $rootfs.log)"; }
rm -f "$rootfs.log"
if [ "$host_suite" = "$SUITE" ]; then
  # the host's Debian sources replace debootstrap's one line (same mirror, plus updates/security)
  copied=""
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] && grep -q debian "$f" && grep -Eq "^[^#].*[[:space:]]$SUITE([[:space:]-]|$)" "$f" ||
      continue
    mkdir -p "$rootfs$(dirname "$f")" && cp "$f" "$rootfs$f" && copied="$copied $f"
  done
  case "$copied" in
    "" | *" /etc/apt/sources.list "* | *" /etc/apt/sources.list") ;;
    *) : > "$rootfs/etc/apt/sources.list" ;;  # only sources.list.d entries: no second copy
  esac
fi
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/tmp/*
tar -C "$rootfs" --numeric-owner -c . |
  "$DOCKER" import -c 'CMD ["/bin/bash"]' -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    -m "debootstrap --variant=minbase $SUITE" - "$IMAGE" > /dev/null
size="$("$DOCKER" image inspect -f '{{.Size}}' "$IMAGE")"
_dlog "made $IMAGE in $(( $(date +%s) - t0 )) s ($(( size / 1000000 )) MB)"
echo "$IMAGE"
