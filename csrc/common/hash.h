// byteps-thc codec cores: the hashes both random streams are built from (docs/ALGORITHM.md,
// "Random streams"; byteps_thc/lhc_reference.py, "keys and streams"). Header-only, standard
// library only: csrc/thc, csrc/thc/cuda and csrc/lhc include it, and nothing of BytePS or a
// framework.
//
// Internal linkage on purpose: the kernel files include this and are compiled with different
// -m flags (portable, AVX2, AVX-512), so an out-of-line copy must stay in its own translation
// unit; with external linkage the linker could hand the portable kernels a copy that uses
// BMI2 or AVX-512 instructions. Under nvcc the same functions run on host and device.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define CODEC_HOST_DEVICE __host__ __device__
#else
#define CODEC_HOST_DEVICE
#endif

namespace codec {
namespace {

// SplitMix64's output function of x (Steele, Lea and Flood's finaliser, its increment added).
CODEC_HOST_DEVICE inline uint64_t SplitMix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A 32-bit integer hash (two multiply-xorshift rounds), the per-element streams' hash, of x or
// of every lane of a vector of uint32 (GCC/Clang vector extensions; common/simd.h's Hash32V).
template <class U>
CODEC_HOST_DEVICE inline U Hash32Lanes(U x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}
CODEC_HOST_DEVICE inline uint32_t Hash32(uint32_t x) { return Hash32Lanes(x); }

// The counter a round key hashes: the rank in the top 24 bits, the step in the low 40
// (kMaxRank, kMaxStep in limits.h).
CODEC_HOST_DEVICE inline uint64_t RankStep(uint32_t rank, uint64_t step) {
  return (static_cast<uint64_t>(rank) << 40) ^ step;
}

}  // namespace
}  // namespace codec
