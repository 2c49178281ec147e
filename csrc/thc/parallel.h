// byteps-thc codec core: one partition's chunks over several threads (Encoder::set_threads,
// Decode's `threads`). Not part of the public interface.
//
// A call spawns its helper threads and joins them before it returns: no pool, no state shared
// between callers, so any number of callers (BytePS's compression threads) may run at once, and
// a caller that asks for one thread never creates one. The cost (tens of microseconds a thread)
// is paid only where every thread gets at least kMinThreadElems coordinates, work of a few
// hundred microseconds. Every task writes only its own chunk's outputs and its own result slot;
// the drivers combine the slots in task order afterwards, so the bits never depend on which
// thread ran what, or when.
#pragma once

#include <cstddef>
#include <exception>
#include <thread>
#include <vector>

namespace thc {
namespace detail {

constexpr size_t kMinThreadElems = size_t{1} << 16;

// Threads worth using for `tasks` tasks of `elems` coordinates in all, at most `threads`.
inline int UsefulThreads(int threads, size_t tasks, size_t elems) {
  size_t t = threads < 1 ? 1 : (size_t)threads;
  if (t > tasks) t = tasks;
  const size_t by_size = elems / kMinThreadElems;
  if (t > by_size) t = by_size;
  return t < 1 ? 1 : (int)t;
}

// body(i) for every i in [0, tasks), on `threads` threads (the caller is one of them), each a
// contiguous range of tasks (neighbouring chunks stream through memory one after another). An
// exception from a task reaches the caller (the first one, in thread order) after every thread
// has finished; a helper that cannot be started leaves its range to the caller.
template <class Body>
void ParallelTasks(int threads, size_t tasks, Body body) {
  if (threads <= 1 || tasks <= 1) {
    for (size_t i = 0; i < tasks; ++i) body(i);
    return;
  }
  const size_t t = (size_t)threads < tasks ? (size_t)threads : tasks;
  std::vector<std::exception_ptr> errors(t);
  auto range = [&](size_t k) {
    try {
      for (size_t i = k * tasks / t; i < (k + 1) * tasks / t; ++i) body(i);
    } catch (...) {
      errors[k] = std::current_exception();
    }
  };
  std::vector<std::thread> helpers;
  std::vector<size_t> inline_ranges;
  helpers.reserve(t - 1);
  for (size_t k = 1; k < t; ++k) {
    try {
      helpers.emplace_back(range, k);
    } catch (...) {  // no thread to be had (resource limits): the caller does that range
      inline_ranges.push_back(k);
    }
  }
  range(0);
  for (size_t k : inline_ranges) range(k);
  for (std::thread& h : helpers) h.join();
  for (std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace detail
}  // namespace thc
