# Sourced by scripts/docker_base.sh, scripts/docker_image.sh and scripts/test_docker.sh: a Docker
# client that builds with BuildKit, and an engine to talk to.
#
#   docker_engine_up     use the engine that answers; with none, start dockerd (root only;
#                        installs docker.io + iptables with apt when dockerd is missing)
#   docker_engine_down   stop dockerd again if docker_engine_up started it (a no-op otherwise)
#   $DOCKER              the client to call (set it to choose one)
#
# The engine we start keeps its images and build cache in BYTEPS_THC_DOCKER_ROOT (default
# /var/lib/byteps-thc-docker, outside the clone): a second run on the same machine reuses every
# layer that its inputs did not change. It runs under `nice` (BYTEPS_THC_DOCKER_NICE, default 10),
# so image builds and containers yield to interactive work; its log is BYTEPS_THC_DOCKERD_LOG.
BYTEPS_THC_DOCKER_ROOT="${BYTEPS_THC_DOCKER_ROOT:-/var/lib/byteps-thc-docker}"
BYTEPS_THC_DOCKERD_LOG="${BYTEPS_THC_DOCKERD_LOG:-/tmp/byteps-thc-dockerd.log}"
_docker_started_pid=""

_dlog() { echo "[docker] $*" >&2; }
_ddie() { echo "[docker] error: $*" >&2; exit 1; }

# apt-get install PKG... when we may (root with apt-get); otherwise say what is missing.
docker_apt_install() {
  if [ "$(id -u)" != 0 ] || ! command -v apt-get > /dev/null; then
    _ddie "$* missing, and this is not root on a Debian/Ubuntu machine: install $* yourself"
  fi
  _dlog "installing $* (apt-get)"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends "$@"; } > /tmp/byteps-thc-apt.log 2>&1 ||
    { tail -n 20 /tmp/byteps-thc-apt.log >&2; _ddie "apt-get install $* failed"; }
}

# A client whose `docker build` runs BuildKit: one with buildx, else Debian's 20.10 client
# (/usr/bin/docker: BuildKit built in, DOCKER_BUILDKIT=1). A newer client without buildx cannot
# run BuildKit at all (its legacy builder has no RUN --mount), so it is passed over.
_docker_client() {
  if [ -n "${DOCKER:-}" ]; then export DOCKER_BUILDKIT=1; return; fi
  if command -v docker > /dev/null && docker buildx version > /dev/null 2>&1; then
    DOCKER=docker
  elif [ -x /usr/bin/docker ]; then
    DOCKER=/usr/bin/docker; export DOCKER_BUILDKIT=1
  else
    docker_apt_install docker.io iptables
    DOCKER=/usr/bin/docker; export DOCKER_BUILDKIT=1
  fi
}

_docker_answers() { "$DOCKER" version --format '{{.Server.Version}}' > /dev/null 2>&1; }

docker_engine_up() {
  _docker_client
  if _docker_answers; then return 0; fi
  if [ -n "${DOCKER_HOST:-}" ]; then
    _ddie "no Docker engine answers at DOCKER_HOST=$DOCKER_HOST (unset it to start a local one)"
  fi
  [ "$(id -u)" = 0 ] || _ddie "no Docker engine is running and only root can start one: start \
dockerd (or ask for access to its socket)"
  command -v dockerd > /dev/null || docker_apt_install docker.io iptables
  command -v iptables > /dev/null || docker_apt_install iptables
  mkdir -p "$BYTEPS_THC_DOCKER_ROOT"
  _dlog "no engine running: starting dockerd (data root $BYTEPS_THC_DOCKER_ROOT, log $BYTEPS_THC_DOCKERD_LOG)"
  # its own session: a Ctrl-C at the terminal reaches our trap, which stops it, not dockerd itself
  setsid nice -n "${BYTEPS_THC_DOCKER_NICE:-10}" dockerd --data-root "$BYTEPS_THC_DOCKER_ROOT" \
    --pidfile /run/byteps-thc-dockerd.pid > "$BYTEPS_THC_DOCKERD_LOG" 2>&1 < /dev/null &
  _docker_started_pid=$!
  local i
  for i in $(seq 60); do
    if _docker_answers; then _dlog "dockerd is up (pid $_docker_started_pid)"; return 0; fi
    if ! kill -0 "$_docker_started_pid" 2> /dev/null; then
      tail -n 15 "$BYTEPS_THC_DOCKERD_LOG" >&2
      _docker_started_pid=""
      _ddie "no Docker engine is running and dockerd could not be started (log above: $BYTEPS_THC_DOCKERD_LOG)"
    fi
    sleep 1
  done
  tail -n 15 "$BYTEPS_THC_DOCKERD_LOG" >&2
  docker_engine_down
  _ddie "dockerd did not answer within 60 s (log: $BYTEPS_THC_DOCKERD_LOG)"
}

docker_engine_down() {
  [ -n "$_docker_started_pid" ] || return 0
  local pid=$_docker_started_pid i
  _docker_started_pid=""
  _dlog "stopping the dockerd we started (pid $pid)"
  kill -TERM "$pid" 2> /dev/null || return 0
  for i in $(seq 30); do kill -0 "$pid" 2> /dev/null || return 0; sleep 1; done
  kill -KILL "$pid" 2> /dev/null || true
}
