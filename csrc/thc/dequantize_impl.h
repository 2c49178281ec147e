// byteps-thc codec core: the decode pointwise kernel family (included by dequantize*.cc).
//
// LoadSums (z = float(S) * m1 + m0, before the transform) and ScaleSigned (sign * (w * scale),
// after it; the decoder uses scale 1, the encoder's residual 1/B, both exact), and DecodeChunk:
// both fused into the transform's first and last passes (transform.h) where it can.
#pragma once

#include "internal.h"
#include "transform.h"

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

namespace {

template <class T>
struct SumsSource {  // z = float(S) * m1 + m0
  const T* s;
  vf a, b;
  inline vf operator()(size_t i) const {
    if ((i * sizeof(T) & 63) == 0) PrefetchRead(s + i + kPrefetch);
    vf z = ToFloat(s + i) * a;
    return z + b;
  }
  void Flush() const {}
};

// out = sign * w for the chunk's first nvalid coordinates (the rest is the partition's padding).
struct SignedSink {
  float* out;
  size_t nvalid;
  const uint32_t* signs;  // the chunk's sign words
  inline void operator()(size_t i, vf v) const {
    if (__builtin_expect(i + W <= nvalid, 1)) {
      if ((i & 15) == 0) PrefetchWrite(out + i + kPrefetch);
      StoreF(out + i, FlipSigns(v, signs, i));
    } else if (i < nvalid) {
      StoreValid(i, FlipSigns(v, signs, i));
    }
  }
  __attribute__((noinline)) void StoreValid(size_t i, vf v) const {
    alignas(64) float t[W];
    StoreF(t, v);
    for (size_t l = 0; i + l < nvalid && l < (size_t)W; ++l) out[i + l] = t[l];
  }
};

template <class T>
void DecodePipeline(const T* sums, size_t nvalid, size_t n, uint64_t j0, size_t block,
                    uint32_t key, float m1, float m0, float* work, float* out, int threads) {
  SumsSource<T> src{sums, BroadcastF(m1), BroadcastF(m0)};
  SignedSink sink{out, nvalid, ChunkSignWords(key, j0, n)};
  if (threads > 1 && n == block && block > kLeaf) {
    BlockToThreads<true>(work, 0, block, [&](size_t) { return src; },
                         [&](size_t) { return sink; }, threads);
    return;
  }
  for (size_t b = 0; b < n; b += block) BlockTo<true>(work, b, block, src, sink);
}

}  // namespace

void DecodeChunk(const void* sums, int lane_bits, size_t nvalid, size_t n, uint64_t j0,
                 size_t block, uint32_t sign_key, float m1, float m0, float* work, float* out,
                 int threads) {
  // sign * (w * 1) == sign * w: the pipeline skips the multiply by one. Blocks of any size
  // (the last pass hands the sink each stream's lines in a row, so its strided stores to out
  // are whole lines; see RadixPassTo).
  if (W >= 8 && block >= kMinPipelineBlock) {
    auto run = [&](auto* lanes) {
      DecodePipeline(lanes, nvalid, n, j0, block, sign_key, m1, m0, work, out, threads);
    };
    switch (lane_bits) {
      case 8: run(static_cast<const uint8_t*>(sums)); return;
      case 16: run(static_cast<const uint16_t*>(sums)); return;
      default: run(static_cast<const uint32_t*>(sums)); return;
    }
  }
  LoadSums(sums, lane_bits, n, m1, m0, work);
  for (size_t b = 0; b < n; b += block) BlockFwht(work + b, block);
  ScaleSigned(work, nvalid, j0, sign_key, 1.0f, out);
}

}  // namespace THC_ISA
}  // namespace detail
}  // namespace thc
