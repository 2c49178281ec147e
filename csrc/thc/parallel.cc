// byteps-thc codec core: the kernels' way to threads (internal.h, RunTasks).
#include "thc/parallel.h"
#include "thc/internal.h"

namespace thc {
namespace detail {

void RunTasks(int threads, size_t tasks, void (*fn)(void* ctx, size_t i), void* ctx) {
  ParallelTasks(threads, tasks, [fn, ctx](size_t i) { fn(ctx, i); });
}

}  // namespace detail
}  // namespace thc
