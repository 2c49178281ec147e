// byteps-thc LHC core: the one place that chooses the instruction set.
//
// The best kernels the CPU supports are chosen on first use (AVX-512 needs F, BW, DQ, VL and
// BMI2; AVX2 needs AVX2 and BMI2, which the kernel files are built with); ForceIsa lets tests and
// benchmarks cap the choice. The choice is a pointer to a table of plain functions, read
// atomically by every driver call.
#include <atomic>
#include <string>

#include "lhc/internal.h"
#include "lhc/lhc.h"

namespace lhc {
namespace detail {
namespace {

#define LHC_KERNEL_TABLE(ns) \
  Kernels { #ns, ns::Prepare, ns::NonzeroBitmap, ns::OrAdd, ns::BucketsK }

const Kernels kPortable = LHC_KERNEL_TABLE(portable);
#ifdef LHC_HAVE_X86
const Kernels kAvx2 = LHC_KERNEL_TABLE(avx2);
const Kernels kAvx512 = LHC_KERNEL_TABLE(avx512);
#endif

bool CpuHas(const std::string& name) {
  if (name == "portable") return true;
#ifdef LHC_HAVE_X86
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2");
  if (name == "avx2") return avx2;
  if (name == "avx512")
    return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#endif
  return false;
}

const Kernels* ByName(const std::string& name) {
  if (name == "portable") return &kPortable;
#ifdef LHC_HAVE_X86
  if (name == "avx2") return &kAvx2;
  if (name == "avx512") return &kAvx512;
#endif
  return nullptr;
}

const Kernels* Best() {
  for (const char* n : {"avx512", "avx2", "portable"})
    if (CpuHas(n)) return ByName(n);
  return &kPortable;
}

std::atomic<const Kernels*>& Active() {
  static std::atomic<const Kernels*> active{Best()};
  return active;
}

}  // namespace

const Kernels& ActiveKernels() { return *Active().load(std::memory_order_relaxed); }

}  // namespace detail

const char* ActiveIsa() { return detail::ActiveKernels().name; }

bool ForceIsa(const std::string& name) {
  if (!detail::CpuHas(name)) return false;
  const detail::Kernels* k = detail::ByName(name);
  if (!k) return false;
  detail::Active().store(k, std::memory_order_relaxed);
  return true;
}

}  // namespace lhc
