// byteps-thc: the one idle wait of BytePS's polling loops (patch 0013 calls it where upstream
// slept 1 us in a dozen places).
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

}  // namespace common
}  // namespace byteps
