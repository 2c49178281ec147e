#!/bin/sh
# The image's entry point, after tini (PID 1, which forwards signals and reaps): runs CMD as given.
# ps-lite's ZeroMQ binds the scheduler to an IP address only, never a host name, so a name in
# DMLC_PS_ROOT_URI (a compose service, a container name) becomes its IPv4 address first. The
# name may not resolve yet while its container starts: try for BYTEPS_THC_RESOLVE_S seconds (60).
set -eu
uri="${DMLC_PS_ROOT_URI:-}"
case "$uri" in
  "" | *[!0-9.]*) ;;
  *) uri="" ;;  # already an address
esac
if [ -n "$uri" ]; then
  i=0 addr=""
  while :; do
    addr="$(getent ahostsv4 "$uri" 2> /dev/null | awk 'NR == 1 { print $1 }')" || addr=""
    [ -z "$addr" ] || break
    i=$((i + 1))
    if [ "$i" -ge "${BYTEPS_THC_RESOLVE_S:-60}" ]; then
      echo "entry: DMLC_PS_ROOT_URI=$uri does not resolve to an IPv4 address" >&2
      exit 2
    fi
    sleep 1
  done
  export DMLC_PS_ROOT_URI="$addr"
fi
exec "$@"
