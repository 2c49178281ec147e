#!/usr/bin/env bash
# make test-docker: the image, run as a cluster of containers.
#   1. builds byteps-thc:cpu (scripts/docker_image.sh; cached layers);
#   2. `docker stop` of a role ends it through SIGTERM (PID 1 forwards it), not by SIGKILL;
#   3. a cluster of 4 containers on a user-defined network (scheduler, server, 2 workers), each
#      configured by DMLC_*/BYTEPS_* alone, trains example/pytorch/train_digits.py with THC; every
#      container must exit 0, both workers must print the same parameter digest, and the test
#      accuracy must be at least MIN_ACC;
#   3b. unless COMPOSE=0, the same cluster from docker/compose.yml (`docker-compose up`: Debian's
#      docker-compose, installed when missing), with a fresh cluster key as its secret, checked
#      the same way and that every role ran with the key;
#   4. `docker run --rm IMAGE bpslaunch --local 2 --compressor thc -- python
#      example/pytorch/train_digits.py` (a whole cluster in one container), checked the same way;
#   5. with TF=1 (the image byteps-thc:cpu-tf), the same with example/tensorflow/train_digits.py.
# Containers and the network are removed on every path (failure, Ctrl-C, TERM). Starts dockerd
# when none runs, and stops it at the end.
# Environment: TF=1 (TensorFlow too), IMAGE (byteps-thc:cpu, byteps-thc:cpu-tf with TF=1),
#   SKIP_BUILD=1 (use IMAGE as it is), MIN_ACC (0.9), CLUSTER_TIMEOUT_S (900: the cluster must
#   finish within it, else it fails naming the laggards); FORK, PY, ... as scripts/docker_image.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=../docker/engine.sh
. docker/engine.sh

TF="${TF:-0}"
[ "$TF" = 1 ] && IMAGE="${IMAGE:-byteps-thc:cpu-tf}" || IMAGE="${IMAGE:-byteps-thc:cpu}"
MIN_ACC="${MIN_ACC:-0.9}"
CLUSTER_TIMEOUT_S="${CLUSTER_TIMEOUT_S:-900}"
RUN_ID="bpsthc-test-$$"
LOGS="$(mktemp -d /tmp/byteps-thc-test-docker.XXXXXX)"
T0=$(date +%s)

log() { echo "[test-docker] $*" >&2; }
fail() { echo "[test-docker] FAILED: $*" >&2; exit 1; }
elapsed() { echo "$(( $(date +%s) - ${1:-$T0} )) s"; }

cleanup() {
  local rc=$? ids
  trap - EXIT INT TERM
  if [ -n "${DOCKER:-}" ] && _docker_answers; then
    ids="$("$DOCKER" ps -aq --filter "label=byteps-thc-test=$RUN_ID" 2> /dev/null || true)"
    [ -z "$ids" ] || "$DOCKER" rm -f $ids > /dev/null 2>&1 || true
    "$DOCKER" network rm "$RUN_ID" > /dev/null 2>&1 || true
    [ -z "${COMPOSE_UP:-}" ] || IMAGE="$IMAGE" "${compose[@]}" down > /dev/null 2>&1 || true
  fi
  docker_engine_down
  if [ "$rc" = 0 ]; then rm -rf "$LOGS"; else log "logs of this run: $LOGS"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT
trap 'log "terminated"; exit 143' TERM

docker_engine_up

# ---- 1. the image -----------------------------------------------------------------------------
if [ "${SKIP_BUILD:-0}" = 1 ]; then
  "$DOCKER" image inspect "$IMAGE" > /dev/null 2>&1 || fail "SKIP_BUILD=1 but there is no $IMAGE"
else
  t=$(date +%s)
  IMAGE="$IMAGE" TF="$TF" scripts/docker_image.sh
  log "image: $(elapsed "$t")"
fi

# The last line "final test accuracy: A (...) parameter digest D" of each worker in FILE...:
# prints "A D" per worker; fails unless there is one per worker, digests agree, A >= MIN_ACC.
check_training() {
  local what=$1 n=$2 file=$3 lines accs digests
  lines="$(grep -E 'final test accuracy: [0-9.]+ .*parameter digest [0-9a-f]+' "$file" || true)"
  [ "$(wc -l <<< "$lines" | tr -d ' ')" = "$n" ] && [ -n "$lines" ] ||
    fail "$what: expected $n workers' 'final test accuracy' lines, found: ${lines:-none} (log: $file)"
  accs="$(sed -E 's/.*final test accuracy: ([0-9.]+) .*/\1/' <<< "$lines")"
  digests="$(sed -E 's/.*parameter digest ([0-9a-f]+).*/\1/' <<< "$lines" | sort -u)"
  [ "$(wc -l <<< "$digests" | tr -d ' ')" = 1 ] ||
    fail "$what: the workers' parameters differ (digests $(tr '\n' ' ' <<< "$digests"))"
  awk -v min="$MIN_ACC" '$1 < min { bad = 1 } END { exit bad }' <<< "$accs" ||
    fail "$what: test accuracy $(tr '\n' ' ' <<< "$accs")below $MIN_ACC"
  grep -q 'compression .*[Tt][Hh][Cc]' "$file" ||
    fail "$what: rank 0 did not report THC compression (log: $file)"
  log "$what: accuracy $(tr '\n' ' ' <<< "$accs")digest $digests (equal on all $n workers)"
}

"$DOCKER" network create --label "byteps-thc-test=$RUN_ID" "$RUN_ID" > /dev/null
common=(--network "$RUN_ID" --label "byteps-thc-test=$RUN_ID" --shm-size 256m
        -e DMLC_NUM_WORKER=2 -e DMLC_NUM_SERVER=1 -e DMLC_PS_ROOT_URI="$RUN_ID-scheduler"
        -e DMLC_PS_ROOT_PORT=9000 -e BYTEPS_COMPRESSOR=thc)

# ---- 2. docker stop ends a role through SIGTERM -----------------------------------------------
# A scheduler alone waits for its cluster forever; `docker stop` sends SIGTERM and, after 30 s,
# SIGKILL. Exit 137 means SIGKILL: the signal never reached bpslaunch.
t=$(date +%s)
"$DOCKER" run -d --name "$RUN_ID-stop" "${common[@]}" -e DMLC_ROLE=scheduler \
  -e DMLC_PS_ROOT_URI="$RUN_ID-stop" "$IMAGE" bpslaunch > /dev/null
for _ in $(seq 60); do
  # (not grep -q: under pipefail its early exit would fail the pipeline through SIGPIPE)
  "$DOCKER" logs "$RUN_ID-stop" 2>&1 | grep 'BytePS launching scheduler' > /dev/null && break
  sleep 1
done
"$DOCKER" stop -t 30 "$RUN_ID-stop" > /dev/null
code="$("$DOCKER" inspect -f '{{.State.ExitCode}}' "$RUN_ID-stop")"
"$DOCKER" logs "$RUN_ID-stop" > "$LOGS/stop.log" 2>&1 || true
"$DOCKER" rm -f "$RUN_ID-stop" > /dev/null
[ "$code" != 137 ] || fail "docker stop had to SIGKILL the scheduler: SIGTERM did not reach bpslaunch"
grep -q 'BytePS launching scheduler' "$LOGS/stop.log" ||
  fail "the scheduler container never started its role (exit $code; log: $LOGS/stop.log)"
log "docker stop: the scheduler ended on SIGTERM (exit $code), $(elapsed "$t")"

# ---- 3. four containers -----------------------------------------------------------------------
t=$(date +%s)
names=(scheduler server worker0 worker1)
"$DOCKER" run -d --name "$RUN_ID-scheduler" "${common[@]}" -e DMLC_ROLE=scheduler \
  "$IMAGE" bpslaunch > /dev/null
"$DOCKER" run -d --name "$RUN_ID-server" "${common[@]}" -e DMLC_ROLE=server \
  "$IMAGE" bpslaunch > /dev/null
for i in 0 1; do
  "$DOCKER" run -d --name "$RUN_ID-worker$i" "${common[@]}" -e DMLC_ROLE=worker \
    -e DMLC_WORKER_ID=$i "$IMAGE" bpslaunch python example/pytorch/train_digits.py > /dev/null
done
log "cluster: scheduler, server, worker0, worker1 started on network $RUN_ID"
# Wait until all four have exited; the first that exits non-zero fails the run, by name.
deadline=$(( $(date +%s) + CLUSTER_TIMEOUT_S ))
while :; do
  running=()
  for n in "${names[@]}"; do
    st="$("$DOCKER" inspect -f '{{.State.Status}} {{.State.ExitCode}}' "$RUN_ID-$n")"
    case "$st" in
      "exited 0") ;;
      exited*|dead*)
        "$DOCKER" logs "$RUN_ID-$n" > "$LOGS/$n.log" 2>&1 || true
        tail -n 25 "$LOGS/$n.log" | sed "s/^/[$n] /" >&2
        fail "container $n exited with ${st#* } (log above and in $LOGS/$n.log)" ;;
      *) running+=("$n") ;;
    esac
  done
  [ ${#running[@]} -gt 0 ] || break
  [ "$(date +%s)" -lt "$deadline" ] ||
    fail "the cluster did not finish within $CLUSTER_TIMEOUT_S s; still running: ${running[*]}"
  sleep 2
done
for n in "${names[@]}"; do "$DOCKER" logs "$RUN_ID-$n" > "$LOGS/$n.log" 2>&1; done
cat "$LOGS/worker0.log" "$LOGS/worker1.log" > "$LOGS/workers.log"
check_training "4 containers" 2 "$LOGS/workers.log"
log "4 containers: all exited 0, $(elapsed "$t")"

# ---- 3b. docker/compose.yml ------------------------------------------------------------------
# COMPOSE=0 leaves the compose step out (it installs Debian's docker-compose when missing).
if [ "${COMPOSE:-1}" = 1 ]; then
t=$(date +%s)
command -v docker-compose > /dev/null || docker_apt_install docker-compose
compose=(docker-compose --no-ansi -p "$RUN_ID" -f docker/compose.yml)
# the cluster key, mounted into every container as a secret (docs/SECURITY.md)
export CLUSTER_KEY="$LOGS/cluster.key"
"$ROOT/.venv/bin/python" -m byteps_thc.launch --new-cluster-key "$CLUSTER_KEY" 2> /dev/null ||
  fail "bpslaunch --new-cluster-key $CLUSTER_KEY failed"
COMPOSE_UP=1
set +e
IMAGE="$IMAGE" timeout "$CLUSTER_TIMEOUT_S" "${compose[@]}" up --no-color > "$LOGS/compose.log" 2>&1
rc=$?
set -e
[ $rc -eq 0 ] || { tail -n 30 "$LOGS/compose.log" >&2; fail "docker-compose up exited with $rc \
(log: $LOGS/compose.log)"; }
# every service's container exited 0 (up returns 0 whatever they exited with)
codes="$(IMAGE="$IMAGE" "${compose[@]}" ps -q | xargs "$DOCKER" inspect -f '{{.Name}} {{.State.ExitCode}}')"
bad="$(awk '$2 != 0' <<< "$codes")"
[ "$(wc -l <<< "$codes")" = 4 ] && [ -z "$bad" ] ||
  fail "docker compose: the containers exited with: $(tr '\n' ' ' <<< "$codes")(log: $LOGS/compose.log)"
IMAGE="$IMAGE" "${compose[@]}" logs --no-color worker0 worker1 > "$LOGS/compose-workers.log" 2>&1
check_training "docker compose" 2 "$LOGS/compose-workers.log"
keyed="$(grep -c 'BytePS launching .* (cluster key /run/secrets/cluster_key)' "$LOGS/compose.log" || true)"
[ "$keyed" = 4 ] || fail "docker compose: $keyed of the 4 roles ran with the cluster key (log: $LOGS/compose.log)"
IMAGE="$IMAGE" "${compose[@]}" down > /dev/null 2>&1
COMPOSE_UP=
log "docker compose: all four exited 0, $(elapsed "$t")"
else
  log "docker compose: skipped (COMPOSE=0)"
fi

# ---- 4. (5.) bpslaunch --local 2 in one container ---------------------------------------------
local2() {  # FRAMEWORK: example/FRAMEWORK/train_digits.py in one container, checked
  local what="bpslaunch --local 2 ($1)" log="$LOGS/local-$1.log" rc t
  t=$(date +%s)
  set +e
  "$DOCKER" run --rm --name "$RUN_ID-local" --label "byteps-thc-test=$RUN_ID" "$IMAGE" \
    bpslaunch --local 2 --compressor thc -- python "example/$1/train_digits.py" > "$log" 2>&1
  rc=$?
  set -e
  if [ $rc -ne 0 ]; then
    tail -n 30 "$log" >&2
    fail "docker run IMAGE $what exited with $rc (log: $log)"
  fi
  check_training "$what" 2 "$log"
  log "$what in one container: exit 0, $(elapsed "$t")"
}
local2 pytorch
[ "$TF" = 0 ] || local2 tensorflow
log "passed in $(elapsed)"
