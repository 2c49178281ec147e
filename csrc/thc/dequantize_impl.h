// byteps-thc codec core: the decode pointwise kernel family (included by dequantize*.cc).
//
// LoadSums (z = float(S) * m1 + m0, before the transform) and ScaleSigned (sign * (w * scale),
// after it; the decoder uses scale 1, the encoder's residual 1/B, both exact).
#pragma once

#include "internal.h"
#include "simd.h"

namespace thc {
namespace detail {
namespace THC_ISA {
namespace {

// float(S) for W lanes of uint8 / uint16 / uint32 (exact conversion, correctly rounded for
// uint32 above 2^24); explicit widening, which GCC's generic conversion would scalarise.
inline vf ToFloat(const uint8_t* p) {
#if THC_W == 16
  return (vf)_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p)));
#elif THC_W == 8
  return (vf)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p)));
#else
  vf r;
  for (int l = 0; l < W; ++l) r[l] = (float)p[l];
  return r;
#endif
}
inline vf ToFloat(const uint16_t* p) {
#if THC_W == 16
  return (vf)_mm512_cvtepi32_ps(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)));
#elif THC_W == 8
  return (vf)_mm256_cvtepi32_ps(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)));
#else
  vf r;
  for (int l = 0; l < W; ++l) r[l] = (float)p[l];
  return r;
#endif
}
inline vf ToFloat(const uint32_t* p) {
  const vu x = LoadU(p);
  // hi * 2^16 and lo are exact; their sum is rounded once, as float(x) is.
  const vf hi = __builtin_convertvector((vi)(x >> 16), vf) * 65536.0f;
  return hi + __builtin_convertvector((vi)(x & 0xFFFFu), vf);
}

template <class T>
void LoadSumsT(const T* s, size_t n, float m1, float m0, float* v) {
  const vf a = BroadcastF(m1), b = BroadcastF(m0);
  size_t i = 0;
  for (; i + W <= n; i += W) {
    vf z = ToFloat(s + i) * a;
    z = z + b;
    StoreF(v + i, z);
  }
  for (; i < n; ++i) {
    float z = (float)s[i] * m1;
    v[i] = z + m0;
  }
}

}  // namespace

void LoadSums(const void* sums, int lane_bits, size_t n, float m1, float m0, float* v) {
  switch (lane_bits) {
    case 8: LoadSumsT(static_cast<const uint8_t*>(sums), n, m1, m0, v); break;
    case 16: LoadSumsT(static_cast<const uint16_t*>(sums), n, m1, m0, v); break;
    default: LoadSumsT(static_cast<const uint32_t*>(sums), n, m1, m0, v); break;
  }
}

void ScaleSigned(const float* w, size_t n, uint64_t j0, uint32_t sign_key, float scale,
                 float* out) {
  const vf sc = BroadcastF(scale);
  size_t i = 0;
  for (; i + W <= n; i += W)
    StoreF(out + i, AsF(AsU(LoadF(w + i) * sc) ^ SignBitsV(sign_key, j0 + i)));
  for (; i < n; ++i) out[i] = FlipSign(w[i] * scale, SignBit(sign_key, j0 + i));
}

}  // namespace THC_ISA
}  // namespace detail
}  // namespace thc
