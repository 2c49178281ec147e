// byteps-thc codec cores: the vector vocabulary both kernel families share.
//
// A kernel file is compiled once per instruction set with its own -m flags. Its family's
// header defines CODEC_SIMD_ISA (the namespace: portable, avx2, avx512) and CODEC_SIMD_W (32-bit
// lanes a vector: 4, 8, 16) and includes this, then brings the names it uses into its own
// namespace with using-declarations (thc/simd.h, lhc/kernels_impl.h). Everything here has
// internal linkage, so copies built with different flags are never merged by the linker.
// Vectors are GCC/Clang vector extensions: element-wise operations, IEEE for floats (no
// reassociation; -ffp-contract=off forbids contraction), so every width gives the bits of the
// scalar definition.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/hash.h"

#if !defined(CODEC_SIMD_ISA) || !defined(CODEC_SIMD_W)
#error "define CODEC_SIMD_ISA and CODEC_SIMD_W before including common/simd.h"
#endif

#if defined(__x86_64__) && (CODEC_SIMD_W >= 8)
#include <immintrin.h>
#endif

namespace codec {
namespace simd {
namespace CODEC_SIMD_ISA {
namespace {

constexpr int W = CODEC_SIMD_W;
typedef float vf __attribute__((vector_size(CODEC_SIMD_W * 4)));
typedef int32_t vi __attribute__((vector_size(CODEC_SIMD_W * 4)));
typedef uint32_t vu __attribute__((vector_size(CODEC_SIMD_W * 4)));
typedef uint64_t vq __attribute__((vector_size(CODEC_SIMD_W * 8)));  // W 64-bit lanes

// Loads and stores of one vector at any alignment.
inline vf LoadF(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void StoreF(float* p, vf v) { std::memcpy(p, &v, sizeof v); }
inline vu LoadU(const void* p) {
  vu v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void StoreU(void* p, vu v) { std::memcpy(p, &v, sizeof v); }
// A store that bypasses the caches (p aligned to the vector): for outputs not read again soon,
// it saves the read of the line that a plain store of a missing line costs. Plain elsewhere.
inline void StreamF(float* p, vf v) {
#if CODEC_SIMD_W == 16
  _mm512_stream_ps(p, (__m512)v);
#elif CODEC_SIMD_W == 8
  _mm256_stream_ps(p, (__m256)v);
#else
  StoreF(p, v);
#endif
}
inline void StreamFence() {
#if CODEC_SIMD_W >= 8
  _mm_sfence();
#endif
}
inline vf AsF(vu v) { return (vf)v; }
inline vu AsU(vf v) { return (vu)v; }
inline vf BroadcastF(float x) {
  vf v;
  for (int l = 0; l < W; ++l) v[l] = x;
  return v;
}
inline vu BroadcastU(uint32_t x) { return vu{} + x; }

// Lane numbers 0..W-1.
inline vu Iota() {
  vu v;
  for (int l = 0; l < W; ++l) v[l] = (uint32_t)l;
  return v;
}

// One bit per lane, lane l at bit l, of a lane-wise mask (all ones or zero).
inline uint32_t MoveMask(vi m) {
#if CODEC_SIMD_W == 16
  return (uint32_t)_mm512_movepi32_mask((__m512i)m);
#elif CODEC_SIMD_W == 8
  return (uint32_t)_mm256_movemask_ps((__m256)m);
#else
  uint32_t bits = 0;
  for (int l = 0; l < W; ++l) bits |= (uint32_t)(m[l] != 0) << l;
  return bits;
#endif
}

// codec::Hash32 of every lane.
inline vu Hash32V(vu x) { return Hash32Lanes(x); }

inline float FlipSign(float x, uint32_t bit) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u ^= bit;
  std::memcpy(&x, &u, 4);
  return x;
}
inline bool IsFinite(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return (u & 0x7F800000u) != 0x7F800000u;
}

}  // namespace
}  // namespace CODEC_SIMD_ISA
}  // namespace simd
}  // namespace codec
