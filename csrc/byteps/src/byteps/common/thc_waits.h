// byteps-thc: the push_pulls a framework op is waiting for, so that a long wait can be named.
//
// A framework whose push_pull runs inside its own executor (TensorFlow's op: in eager mode and in
// a tf.function, the script's thread is inside TensorFlow while it waits) wraps the op's done
// callback with WatchWait when the op starts: the wait is open from then (InitTensor's blocking
// first push included) until the callback runs. byteps_thc_open_waits lists the open waits with
// their ages; byteps_thc.waits polls it and logs each wait older than BYTEPS_THC_STALL_WARN once,
// naming the tensor, as the torch adapter logs its own waits.
//
// Framework-free: no BytePS type, no framework type; any thread may call it.
#ifndef BYTEPS_THC_WAITS_H
#define BYTEPS_THC_WAITS_H

#include <functional>
#include <string>

namespace byteps {
namespace common {

// Opens a wait for tensor `name` and returns `done` wrapped: the wrapper closes the wait, then
// runs `done`. A wrapper that is never run leaves its wait open (a hang is what it is there for).
std::function<void()> WatchWait(const std::string& name, std::function<void()> done);

}  // namespace common
}  // namespace byteps

// The open waits, oldest first, as lines "<id>\t<seconds waited>\t<tensor name>\n" written into
// buf (NUL-terminated, at most len bytes; lines that do not fit are left out). Returns how many
// waits are open. An id is never reused within the process.
extern "C" int byteps_thc_open_waits(char* buf, int len);

#endif  // BYTEPS_THC_WAITS_H
