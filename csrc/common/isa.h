// byteps-thc codec cores: the choice of instruction set, the same for both cores.
//
// Each core builds its kernel family three times (portable, AVX2, AVX-512; setup.py and
// byteps_thc_build.py give a file the -m flags of its suffix) and hands IsaChoice its three
// tables. The best one the CPU runs is chosen on first use; Force caps it (tests and benchmarks
// compare them). The choice is one pointer, read atomically by every driver call. A CPU runs an
// ISA's files when it has every feature they are compiled for: AVX2, BMI2 and FMA (THC's AVX2
// files add `#pragma GCC target("fma")`); for AVX-512, F, BW, DQ and VL on top of those.
#pragma once

#include <atomic>
#include <string>

#if defined(__x86_64__) || defined(_M_X64)
#define CODEC_HAVE_X86 1
#endif

namespace codec {

// Whether this CPU runs the kernels of `name` ("portable", "avx2", "avx512").
inline bool CpuHasIsa(const std::string& name) {
  if (name == "portable") return true;
#ifdef CODEC_HAVE_X86
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2") &&
                    __builtin_cpu_supports("fma");
  if (name == "avx2") return avx2;
  if (name == "avx512")
    return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#endif
  return false;
}

// The arguments of IsaChoice's constructor: the tables `table(ns)` makes of each build's
// namespace, of the builds this machine compiles (setup.py builds the avx2 and avx512 kernel
// files on x86-64 only).
#ifdef CODEC_HAVE_X86
#define CODEC_ISA_TABLES(table) table(portable), table(avx2), table(avx512)
#else
#define CODEC_ISA_TABLES(table) table(portable)
#endif

// One core's kernel tables (Kernels has a `const char* name`) and the active one.
template <class Kernels>
class IsaChoice {
 public:
  explicit IsaChoice(const Kernels& portable) : tables_{portable, portable, portable}, n_(1) {
    active_.store(Best(), std::memory_order_relaxed);
  }
  IsaChoice(const Kernels& portable, const Kernels& avx2, const Kernels& avx512)
      : tables_{portable, avx2, avx512}, n_(3) {
    active_.store(Best(), std::memory_order_relaxed);
  }
  IsaChoice(const IsaChoice&) = delete;
  IsaChoice& operator=(const IsaChoice&) = delete;

  const Kernels& active() const { return *active_.load(std::memory_order_relaxed); }
  // False, and nothing changes, if this CPU or this build lacks `name`.
  bool Force(const std::string& name) {
    const Kernels* k = ByName(name);
    if (!k || !CpuHasIsa(name)) return false;
    active_.store(k, std::memory_order_relaxed);
    return true;
  }

 private:
  const Kernels* ByName(const std::string& name) const {
    for (int i = 0; i < n_; ++i)
      if (name == tables_[i].name) return &tables_[i];
    return nullptr;
  }
  const Kernels* Best() const {
    for (const char* n : {"avx512", "avx2"})
      if (ByName(n) && CpuHasIsa(n)) return ByName(n);
    return &tables_[0];
  }

  const Kernels tables_[3];  // portable, avx2, avx512; the first n_ are this build's
  const int n_;
  std::atomic<const Kernels*> active_{nullptr};
};

}  // namespace codec
