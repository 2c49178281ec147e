// byteps-thc: the push_pulls a framework op is waiting for (see thc_waits.h).
// byteps-thc-build: worker
#include "thc_waits.h"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

namespace byteps {
namespace common {
namespace {

using Clock = std::chrono::steady_clock;

struct Wait {
  std::string name;
  Clock::time_point since;
};

std::mutex& Mutex() {
  static std::mutex* mu = new std::mutex;  // never destroyed: callable during static teardown
  return *mu;
}

// id -> wait; ids grow, so the map's order is the order the waits opened in (oldest first)
std::map<uint64_t, Wait>& Open() {
  static auto* open = new std::map<uint64_t, Wait>;
  return *open;
}

uint64_t g_next_id = 0;  // under Mutex()

void Close(uint64_t id) {
  std::lock_guard<std::mutex> lock(Mutex());
  Open().erase(id);
}

}  // namespace

std::function<void()> WatchWait(const std::string& name, std::function<void()> done) {
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(Mutex());
    id = g_next_id++;
    Open().emplace(id, Wait{name, Clock::now()});
  }
  auto inner = std::make_shared<std::function<void()>>(std::move(done));
  return [id, inner]() {
    Close(id);
    (*inner)();
  };
}

}  // namespace common
}  // namespace byteps

extern "C" int byteps_thc_open_waits(char* buf, int len) {
  using byteps::common::Clock;
  std::lock_guard<std::mutex> lock(byteps::common::Mutex());
  const auto now = Clock::now();
  size_t used = 0;
  const size_t cap = (buf && len > 0) ? static_cast<size_t>(len) : 0;
  if (cap) buf[0] = 0;
  for (const auto& kv : byteps::common::Open()) {
    const double waited = std::chrono::duration<double>(now - kv.second.since).count();
    char head[64];
    const int n = std::snprintf(head, sizeof(head), "%llu\t%.3f\t",
                                static_cast<unsigned long long>(kv.first), waited);
    const std::string line = std::string(head, n > 0 ? n : 0) + kv.second.name + "\n";
    if (used + line.size() + 1 > cap) continue;  // no room: left out, still counted
    std::memcpy(buf + used, line.data(), line.size());
    used += line.size();
    buf[used] = 0;
  }
  return static_cast<int>(byteps::common::Open().size());
}
