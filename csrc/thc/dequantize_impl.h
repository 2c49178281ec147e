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
// uint32 above 2^24). Widening to int32 first keeps GCC on vector instructions.
inline vf ToFloat(const uint8_t* p) {
  typedef uint8_t v8 __attribute__((vector_size(THC_W)));
  v8 x;
  std::memcpy(&x, p, sizeof x);
  return __builtin_convertvector(__builtin_convertvector(x, vi), vf);
}
inline vf ToFloat(const uint16_t* p) {
  typedef uint16_t v16 __attribute__((vector_size(THC_W * 2)));
  v16 x;
  std::memcpy(&x, p, sizeof x);
  return __builtin_convertvector(__builtin_convertvector(x, vi), vf);
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
