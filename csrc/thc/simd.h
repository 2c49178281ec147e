// byteps-thc codec core: the vector vocabulary of the kernel implementation headers.
//
// A kernel file sets THC_ISA (namespace name) and THC_W (floats per vector: 4 portable, 8 AVX2,
// 16 AVX-512), then includes its family's *_impl.h, which includes this. Everything here and in
// the impl headers lives in namespace thc::detail::THC_ISA with internal linkage, so the same
// source compiled with different -m flags can never be merged by the linker into one copy.
// Vectors are GCC/Clang vector extensions: element-wise IEEE operations, no reassociation, no
// contraction (-ffp-contract=off), so the results are those of the scalar definition.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if !defined(THC_ISA) || !defined(THC_W)
#error "define THC_ISA and THC_W before including a kernel implementation header"
#endif

#if defined(__x86_64__) && (THC_W >= 8)
#include <immintrin.h>
#endif

// GCC 12 warns about the deliberately undefined source vector inside its own gather intrinsics.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace thc {
namespace detail {
namespace THC_ISA {
namespace {

constexpr int W = THC_W;
typedef float vf __attribute__((vector_size(THC_W * 4)));
typedef int32_t vi __attribute__((vector_size(THC_W * 4)));
typedef uint32_t vu __attribute__((vector_size(THC_W * 4)));

inline vf LoadF(const float* p) { vf v; std::memcpy(&v, p, sizeof v); return v; }
inline void StoreF(float* p, vf v) { std::memcpy(p, &v, sizeof v); }
// A store that bypasses the caches (p aligned to the vector): for outputs not read again soon,
// it saves the read of the line that a plain store of a missing line costs. Plain elsewhere.
inline void StreamF(float* p, vf v) {
#if THC_W == 16
  _mm512_stream_ps(p, (__m512)v);
#elif THC_W == 8
  _mm256_stream_ps(p, (__m256)v);
#else
  StoreF(p, v);
#endif
}
inline void StreamFence() {
#if THC_W >= 8
  _mm_sfence();
#endif
}
inline vu LoadU(const void* p) { vu v; std::memcpy(&v, p, sizeof v); return v; }
inline void StoreU(void* p, vu v) { std::memcpy(p, &v, sizeof v); }
inline vf AsF(vu v) { return (vf)v; }
inline vu AsU(vf v) { return (vu)v; }
inline vf BroadcastF(float x) {
  vf v;
  for (int l = 0; l < W; ++l) v[l] = x;
  return v;
}
inline vu BroadcastU(uint32_t x) { return vu{} + x; }

// x's low and high halves, each widened to binary64 (exact).
typedef double vdh __attribute__((vector_size(THC_W * 4)));  // W/2 doubles
inline void Widen(vf x, vdh* lo, vdh* hi) {
#if THC_W == 16
  *lo = (vdh)_mm512_cvtps_pd(_mm512_castps512_ps256((__m512)x));
  *hi = (vdh)_mm512_cvtps_pd(_mm512_extractf32x8_ps((__m512)x, 1));
#elif THC_W == 8
  *lo = (vdh)_mm256_cvtps_pd(_mm256_castps256_ps128((__m256)x));
  *hi = (vdh)_mm256_cvtps_pd(_mm256_extractf128_ps((__m256)x, 1));
#else
  for (int l = 0; l < W / 2; ++l) { (*lo)[l] = x[l]; (*hi)[l] = x[l + W / 2]; }
#endif
}

// acc0 += (double)x[lo half]^2, acc1 += (double)x[hi half]^2 (each square exact in binary64).
inline void AddSquares(vf x, vdh* acc0, vdh* acc1) {
  vdh lo, hi;
  Widen(x, &lo, &hi);
  *acc0 = *acc0 + lo * lo;
  *acc1 = *acc1 + hi * hi;
}

// Lane numbers 0..W-1.
inline vu Iota() {
  vu v;
  for (int l = 0; l < W; ++l) v[l] = (uint32_t)l;
  return v;
}

inline uint32_t Hash32(uint32_t x) {
  x ^= x >> 16; x *= 0x7FEB352Du; x ^= x >> 15; x *= 0x846CA68Bu; x ^= x >> 16;
  return x;
}
inline vu Hash32V(vu x) {
  x ^= x >> 16; x *= 0x7FEB352Du; x ^= x >> 15; x *= 0x846CA68Bu; x ^= x >> 16;
  return x;
}

// Sign bits (bit 31 set where neg_j) of elements j0 .. j0+W-1, j0 a multiple of W (W <= 32), so
// they come from one 32-bit sign word.
inline vu SignBitsV(uint32_t sign_key, uint64_t j0) {
  const uint32_t word = Hash32(sign_key ^ (uint32_t)(j0 >> 5));
  const uint32_t shift = (uint32_t)(j0 & 31);
  return ((BroadcastU(word >> shift) >> Iota()) & 1u) << 31;
}
inline uint32_t SignBit(uint32_t sign_key, uint64_t j) {
  return ((Hash32(sign_key ^ (uint32_t)(j >> 5)) >> (j & 31)) & 1u) << 31;
}
inline float FlipSign(float x, uint32_t bit) {
  uint32_t u; std::memcpy(&u, &x, 4); u ^= bit; std::memcpy(&x, &u, 4); return x;
}
inline bool IsFinite(float x) {
  uint32_t u; std::memcpy(&u, &x, 4); return (u & 0x7F800000u) != 0x7F800000u;
}

}  // namespace
}  // namespace THC_ISA
}  // namespace detail
}  // namespace thc
