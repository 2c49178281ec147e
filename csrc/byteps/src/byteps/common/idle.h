// byteps-thc: the one idle wait of BytePS's polling loops (patch 0013 calls it where upstream
// slept 1 us in a dozen places; patch 0016 makes the pipeline loops wait on their queue).
//
// An empty queue makes a loop sleep BYTEPS_IDLE_SLEEP_US microseconds. Default: 1 (upstream's
// value) in GPU builds; 200 in the CPU-only worker, where a dozen loops waking every ~60 us (the
// kernel's timer slack) kept about half a core busy per idle process, which starves a small
// machine running several workers. Read once per process.
#pragma once

#include <chrono>
#include <cstdlib>
#include <thread>

namespace byteps {
namespace common {

#ifdef BYTEPS_CPU_ONLY
constexpr long kIdleSleepDefaultUs = 200;
#else
constexpr long kIdleSleepDefaultUs = 1;
#endif

inline std::chrono::microseconds IdleSleep() {
  static const std::chrono::microseconds d = [] {
    const char* v = std::getenv("BYTEPS_IDLE_SLEEP_US");
    long us = v && *v ? std::strtol(v, nullptr, 10) : kIdleSleepDefaultUs;
    return std::chrono::microseconds(us < 0 ? kIdleSleepDefaultUs : us);
  }();
  return d;
}

inline void IdleWait() { std::this_thread::sleep_for(IdleSleep()); }

// A pipeline loop with nothing to do waits on its queue (patch 0016): an empty queue sleeps until
// a task is added (or 5 ms), a queue whose tasks are not ready yet polls every IdleSleep().
template <typename Queue>
inline void IdleWait(Queue* q) {
  q->waitForTask(IdleSleep());
}

}  // namespace common
}  // namespace byteps
