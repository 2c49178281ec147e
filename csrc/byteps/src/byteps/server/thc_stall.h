// byteps-thc: the server's stall inspector for THC rounds (after Horovod's).
//
// Once a second the THC path looks at every round that some worker has pushed into but that is
// not complete. A round that has waited BYTEPS_THC_STALL_WARN seconds (default 60, 0 = never) is
// logged once, naming the workers that have not pushed and those that have; after
// BYTEPS_THC_STALL_TIMEOUT seconds (default 0 = never) it fails: every worker waiting for it gets
// the message as its push_pull's error, and every later round of that key fails too (a late push
// of the stalled round would otherwise be summed into another round). The server then exits with
// status 1 (EndAfterStall): the cluster cannot go on, and its death is what tells the workers
// that are not waiting on it (a worker blocked elsewhere, one at its finalize barrier) through
// ps-lite's dead-node detection, which then ends the scheduler too.
#ifndef BYTEPS_SERVER_THC_STALL_H
#define BYTEPS_SERVER_THC_STALL_H

#include <cstdint>
#include <functional>
#include <set>
#include <string>

namespace byteps {
namespace server {

struct StallSettings {
  double warn_s = 60;    // 0: no warning
  double timeout_s = 0;  // 0: never fail
};

// From the environment; a value that does not parse is logged and replaced by the default.
StallSettings StallSettingsFromEnv();

// One kind of round of one key, as the inspector last saw it.
class StallWatch {
 public:
  enum Action { kNone, kWarn, kFail };
  // `round`: the round being filled (1-based); `waiting`: somebody has pushed into it. Returns
  // what to do now (each at most once per round) and how long the round has waited.
  Action Look(uint64_t round, bool waiting, double now_s, const StallSettings& s, double* waited);

 private:
  uint64_t round_ = 0;
  double since_ = 0;
  bool warned_ = false, failed_ = false;
};

// ps-lite node ids -> "worker 1 (ps-lite node 11, 10.0.0.2:9000), ..."; "none" when empty.
std::string DescribeWorkers(const std::set<int>& node_ids);
// The workers of the cluster that are not in `pushed`.
std::set<int> MissingWorkers(const std::set<int>& pushed);
// Seconds on a steady clock.
double StallNow();

// Once per process: the responses already queued get kStallExitDelayMs to leave, then the process
// ends with status 1 (_exit: handler threads may be blocked on the stalled round).
void EndAfterStall(const std::string& why);
constexpr int kStallExitDelayMs = 2000;

// Starts, once per process, a thread that calls `look` every second.
void StartStallInspector(std::function<void()> look);

}  // namespace server
}  // namespace byteps

#endif  // BYTEPS_SERVER_THC_STALL_H
