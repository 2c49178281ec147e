// byteps-thc CUDA: a CPU emulation of the few CUDA built-ins the tile kernels use, so that the
// kernels' own code (tile.cuh, launch.cu) runs and is tested on machines without a GPU
// (tests/unit/test_cuda.py builds it with g++ -DTHC_CUDA_EMULATE). Each CUDA thread of a block
// is a std::thread, __syncthreads a barrier, blocks run one after another. Slow: correctness only.
// Never part of the real build.
#pragma once

#include <cuda_runtime.h>

#include <math.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace thc_emu {

class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen_ != gen; });
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_, count_ = 0;
  uint64_t gen_ = 0;
};

struct Ctx {
  uint3 tid, bid;
  dim3 bdim, gdim;
  void* smem = nullptr;
  Barrier* barrier = nullptr;
  std::atomic<int>* vote = nullptr;  // __syncthreads_or's flag, shared by the block
};
inline Ctx& Current() {
  thread_local Ctx ctx;
  return ctx;
}

// Runs kernel() for every thread of every block of the grid: `block` threads take the blocks one
// after another, with a barrier between blocks (they share one shared-memory buffer).
template <typename F>
void Launch(unsigned grid, unsigned block, size_t smem_bytes, F kernel) {
  std::vector<float4> smem((smem_bytes + sizeof(float4) - 1) / sizeof(float4));
  Barrier barrier(static_cast<int>(block));
  std::atomic<int> vote{0};
  std::vector<std::thread> threads;
  threads.reserve(block);
  for (unsigned t = 0; t < block; ++t) {
    threads.emplace_back([&, t] {
      Ctx& c = Current();
      c.tid = make_uint3(t, 0, 0);
      c.bdim = dim3(block);
      c.gdim = dim3(grid);
      c.smem = smem.data();
      c.barrier = &barrier;
      c.vote = &vote;
      for (unsigned b = 0; b < grid; ++b) {
        c.bid = make_uint3(b, 0, 0);
        kernel();  // early returns are uniform over a block in these kernels
        barrier.Wait();
      }
    });
  }
  for (auto& th : threads) th.join();
}

}  // namespace thc_emu

#define threadIdx (thc_emu::Current().tid)
#define blockIdx (thc_emu::Current().bid)
#define blockDim (thc_emu::Current().bdim)
#define gridDim (thc_emu::Current().gdim)
#define __syncthreads() (thc_emu::Current().barrier->Wait())

namespace thc_emu {
// Barrier, then the OR of every thread's predicate. The flag is cleared by thread 0 after all
// have read it; the next call's first barrier orders that before any new vote.
inline int SyncThreadsOr(int pred) {
  Ctx& c = Current();
  c.barrier->Wait();
  if (pred) c.vote->store(1);
  c.barrier->Wait();
  const int any = c.vote->load();
  c.barrier->Wait();
  if (c.tid.x == 0) c.vote->store(0);
  return any;
}
}  // namespace thc_emu
#define __syncthreads_or(pred) (thc_emu::SyncThreadsOr((pred) ? 1 : 0))
#define THC_DYNAMIC_SMEM(name) float4* name = static_cast<float4*>(thc_emu::Current().smem)
#undef __grid_constant__
#define __grid_constant__
#undef __launch_bounds__
#define __launch_bounds__(...)

inline float __fadd_rn(float a, float b) { return a + b; }  // built with -ffp-contract=off
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __uint2float_rn(uint32_t v) { return static_cast<float>(v); }
inline uint32_t __float_as_uint(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}
inline float __uint_as_float(uint32_t u) {
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline int atomicOr(int* p, int v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
inline double atomicAdd(double* p, double v) {
  double old, want;
  __atomic_load(p, &old, __ATOMIC_SEQ_CST);
  do {
    want = old + v;
  } while (!__atomic_compare_exchange(p, &old, &want, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
  return old;
}
