// byteps-thc: what a worker does when ps-lite reports a dead node (ps/internal/liveness.h).
#ifndef BYTEPS_THC_LIVENESS_H
#define BYTEPS_THC_LIVENESS_H

namespace byteps {
namespace common {

// Patch 0050 calls this on a worker before ps-lite starts. On a dead-node report the worker
// fails the cluster (FailCluster: every push_pull in flight and every later one completes with
// the report, which the framework raises), then gives the script PS_HEARTBEAT_TIMEOUT seconds
// (at least kMinGraceSeconds) to act on the exception (log, save, exit); a process still alive
// after that, e.g. a script blocked outside BytePS, ends with status ps::kDeadNodeExitStatus.
// Servers and the scheduler keep ps-lite's default: log and exit with that status at once.
void InstallDeadNodeHandler();

constexpr int kMinGraceSeconds = 5;

}  // namespace common
}  // namespace byteps

#endif  // BYTEPS_THC_LIVENESS_H
