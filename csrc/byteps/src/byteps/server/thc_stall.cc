// byteps-thc: the server's stall inspector (see thc_stall.h).
#include "thc_stall.h"

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <thread>

#include "../common/logging.h"
#include "ps/internal/liveness.h"
#include "ps/ps.h"

namespace byteps {
namespace server {
namespace {

double EnvSeconds(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  double s = std::strtod(v, &end);
  while (end && *end == ' ') ++end;
  if (end == v || *end != '\0' || !(s >= 0) || s > 1e7) {
    LOG(WARNING) << name << "=" << v << " is not a number of seconds >= 0; using " << fallback;
    return fallback;
  }
  return s;
}

}  // namespace

StallSettings StallSettingsFromEnv() {
  StallSettings s;
  s.warn_s = EnvSeconds("BYTEPS_THC_STALL_WARN", s.warn_s);
  s.timeout_s = EnvSeconds("BYTEPS_THC_STALL_TIMEOUT", s.timeout_s);
  return s;
}

StallWatch::Action StallWatch::Look(uint64_t round, bool waiting, double now_s,
                                    const StallSettings& s, double* waited) {
  if (!waiting) {
    round_ = 0;
    return kNone;
  }
  if (round != round_) {
    round_ = round;
    since_ = now_s;
    warned_ = failed_ = false;
  }
  *waited = now_s - since_;
  if (!failed_ && s.timeout_s > 0 && *waited >= s.timeout_s) {
    failed_ = warned_ = true;
    return kFail;
  }
  if (!warned_ && s.warn_s > 0 && *waited >= s.warn_s) {
    warned_ = true;
    return kWarn;
  }
  return kNone;
}

std::string DescribeWorkers(const std::set<int>& node_ids) {
  if (node_ids.empty()) return "none";
  std::ostringstream os;
  const char* sep = "";
  for (int id : node_ids) {
    os << sep << ps::DescribeNodeId(id);
    sep = ", ";
  }
  return os.str();
}

std::set<int> MissingWorkers(const std::set<int>& pushed) {
  std::set<int> missing;
  for (int id : ps::Postoffice::Get()->GetNodeIDs(ps::kWorkerGroup)) {
    if (!pushed.count(id)) missing.insert(id);
  }
  return missing;
}

double StallNow() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void EndAfterStall(const std::string& why) {
  static std::once_flag once;
  std::call_once(once, [&why] {
    std::thread([why] {
      std::this_thread::sleep_for(std::chrono::milliseconds(kStallExitDelayMs));
      LOG(ERROR) << "byteps-thc server: exiting with status 1 after a stall timeout: " << why;
      std::fflush(stderr);
      _exit(1);
    }).detach();
  });
}

namespace {
struct Inspector {
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::thread thread;
};
Inspector* g_inspector = nullptr;  // set once, under the once_flag

// At exit, before the THC path's globals are destroyed (registered after they were built):
// the thread must not look at them any more.
void StopStallInspector() {
  Inspector* in = g_inspector;
  {
    std::lock_guard<std::mutex> lk(in->mu);
    in->stop = true;
  }
  in->cv.notify_all();
  if (in->thread.joinable()) in->thread.join();
}
}  // namespace

void StartStallInspector(std::function<void()> look) {
  static std::once_flag once;
  std::call_once(once, [&look] {
    g_inspector = new Inspector;  // never deleted: read by StopStallInspector at exit
    g_inspector->thread = std::thread([look] {
      Inspector* in = g_inspector;
      std::unique_lock<std::mutex> lk(in->mu);
      while (!in->cv.wait_for(lk, std::chrono::seconds(1), [in] { return in->stop; })) {
        lk.unlock();
        look();  // takes the THC lock itself
        lk.lock();
      }
    });
    std::atexit(StopStallInspector);
  });
}

}  // namespace server
}  // namespace byteps
