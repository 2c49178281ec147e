// byteps-thc LHC core: what the drivers (codec.cc) and the kernel files share. Not public.
//
// One kernel family (kernels_impl.h), built three times (portable, AVX2, AVX-512) with different
// -m flags into its own namespace; dispatch.cc hands the drivers the table of the best one the
// CPU has. The kernels are the dense, streaming parts: the input scan, the support bitmap, the
// hashes of the buckets and the aggregator's OR and add. Peeling and the sparse scatter are
// scalar (they are random access). All of it is integer arithmetic, so every ISA gives the
// same bits.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lhc {
namespace detail {

struct Kernels {
  const char* name;
  // a = x + r (r == nullptr: a is not written and x is scanned), *max_mag = the largest
  // |value| as float bits. Returns 0, or 1 if x has a NaN/Inf, or 2 if x + r does.
  int (*prepare)(const float* x, const float* r, float* a, size_t d, uint32_t* max_mag);
  // words[0, ceil(d / 64)): bit i set where v[i] != 0 (-0.0 counts as 0). Returns the count.
  size_t (*nonzero_bitmap)(const float* v, size_t d, uint64_t* words);
  // words |= in_words; y += in_y (mod 2^32). The inputs may be unaligned.
  void (*or_add)(uint64_t* words, const uint8_t* in_words, size_t nwords, uint32_t* y,
                 const uint8_t* in_y, size_t m);
  // b[3 i + j] = j * sub + (hash32(keys[j] ^ idx[i]) * sub >> 32); bit j of neg[i] = hash & 1.
  void (*buckets)(const uint32_t* keys, const uint32_t* idx, size_t n, uint32_t sub, uint32_t* b,
                  uint8_t* neg);
};

const Kernels& ActiveKernels();

#define LHC_DECLARE_ISA_KERNELS(ns)                                                             \
  namespace ns {                                                                                \
  int Prepare(const float* x, const float* r, float* a, size_t d, uint32_t* max_mag);           \
  size_t NonzeroBitmap(const float* v, size_t d, uint64_t* words);                              \
  void OrAdd(uint64_t* words, const uint8_t* in_words, size_t nwords, uint32_t* y,              \
             const uint8_t* in_y, size_t m);                                                    \
  void BucketsK(const uint32_t* keys, const uint32_t* idx, size_t n, uint32_t sub, uint32_t* b, \
                uint8_t* neg);                                                                  \
  }

LHC_DECLARE_ISA_KERNELS(portable)
#if defined(__x86_64__) || defined(_M_X64)
#define LHC_HAVE_X86 1
LHC_DECLARE_ISA_KERNELS(avx2)
LHC_DECLARE_ISA_KERNELS(avx512)
#endif

}  // namespace detail
}  // namespace lhc
