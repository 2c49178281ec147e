// byteps-thc: the torch plugin's blocking wait, which a signal (Ctrl-C) can interrupt.
//
// byteps_torch_wait_and_clear waits for a push_pull's completion callback, which runs on another
// thread and drops torch tensors, so the wait holds no GIL (patch 0005). Python runs a signal's
// handler only in the main thread and only once that thread returns to the interpreter: a script
// blocked in synchronize() on a stalled cluster ignored Ctrl-C until the push_pull completed, or
// for ever. WaitInterruptibly therefore takes the GIL back every kSignalCheck and asks Python
// to run pending handlers; a handler that raises (KeyboardInterrupt from the default SIGINT
// handler) ends the wait with that exception. The push_pull itself goes on: its handle stays
// valid, so a later synchronize() of it still returns its result.
#ifndef BYTEPS_THC_TORCH_WAIT_H
#define BYTEPS_THC_TORCH_WAIT_H

#include <pybind11/pybind11.h>

#include <chrono>
#include <thread>

namespace byteps {
namespace torch {

constexpr std::chrono::milliseconds kSignalCheck{100};

// Waits until done() is true, without the GIL. Throws pybind11::error_already_set when a signal
// handler raised. Call with the GIL held.
template <typename Done>
void WaitInterruptibly(Done done) {
  pybind11::gil_scoped_release release;
  auto checked = std::chrono::steady_clock::now();
  while (!done()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const auto now = std::chrono::steady_clock::now();
    if (now - checked < kSignalCheck) continue;
    checked = now;
    pybind11::gil_scoped_acquire acquire;
    if (PyErr_CheckSignals() != 0) throw pybind11::error_already_set();
  }
}

}  // namespace torch
}  // namespace byteps

#endif  // BYTEPS_THC_TORCH_WAIT_H
