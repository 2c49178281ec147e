// byteps-thc codec core: the decode pointwise kernel family (included by dequantize*.cc).
//
// LoadSums (z = float(S) * m1 + m0, before the transform) and ScaleSigned (sign * (w * scale),
// after it; the decoder uses scale 1, the encoder's residual 1/B, both exact), and DecodeChunk:
// both fused into the transform's first and last passes (transform.h) where it can.
//
// The sums arrive as one stream (docs/ALGORITHM.md, "Publish"): sum j is bits [j*w, (j+1)*w) of
// an LSB-first byte stream, w = sum_bits in 1..32. Lanes of 8, 16 or 32 bits are that stream with
// w equal to the lane width, so the aggregator's lanes and the server's packed reply go through
// the same decode; a packed stream is unpacked in the first pass's load, in registers.
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

// Sum j of the stream (any w <= 32): at most w + 7 <= 39 bits from its first byte, never read
// past the stream's `bytes`.
inline uint32_t SumAt(const uint8_t* s, size_t bytes, size_t j, int w) {
  const size_t bit = j * (size_t)w, at = bit >> 3;
  uint64_t word = 0;
  std::memcpy(&word, s + at, bytes - at < 8 ? bytes - at : 8);
  return (uint32_t)((word >> (bit & 7)) & (w == 32 ? 0xFFFFFFFFull : (uint64_t{1} << w) - 1));
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

void LoadSums(const uint8_t* sums, int sum_bits, size_t bytes, size_t n, float m1, float m0,
              float* v) {
  switch (sum_bits) {
    case 8: LoadSumsT(sums, n, m1, m0, v); return;
    case 16: LoadSumsT(reinterpret_cast<const uint16_t*>(sums), n, m1, m0, v); return;
    case 32: LoadSumsT(reinterpret_cast<const uint32_t*>(sums), n, m1, m0, v); return;
  }
  for (size_t i = 0; i < n; ++i) {
    float z = (float)SumAt(sums, bytes, i, sum_bits) * m1;
    v[i] = z + m0;
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

// Sources of the decode's first pass: z = float(S) * m1 + m0 for W sums from element i (a
// multiple of W), in registers.
template <class T>
struct LaneSource {  // the stream at w = 8, 16, 32: lanes
  const T* s;
  vf a, b;
  inline vf operator()(size_t i) const {
    if ((i * sizeof(T) & 63) == 0) PrefetchRead(s + i + kPrefetch);
    vf z = ToFloat(s + i) * a;
    return z + b;
  }
  void Flush() const {}
};

// w <= kMaxShuffleBits: the W sums from element i (a multiple of 8, so they start on a byte)
// are gathered by one byte shuffle per 8 sums, then shifted and masked per lane. Sum g of a
// group of 8 starts at bit g*w of the group's first byte: byte (g*w)/8, shift (g*w)%8; its
// dword takes bytes (g*w)/8 .. +3 of the group's 16, which fit while (7w)/8 + 3 <= 15.
constexpr int kMaxShuffleBits = 14;

struct PackedSource {
  const uint8_t* s;
  size_t bytes;  // of the stream from s
  int w;
  vf a, b;
  vu ctl, shift, mask;  // per lane: its 4 bytes' shuffle indices, shift, w-bit mask
  static constexpr size_t kReach = 16 + (W == 16 ? kMaxShuffleBits : 0);  // bytes one load reads

  PackedSource(const uint8_t* s_, size_t bytes_, int w_, float m1, float m0)
      : s(s_), bytes(bytes_), w(w_), a(BroadcastF(m1)), b(BroadcastF(m0)) {
    for (int l = 0; l < W; ++l) {
      const int bit = (l & 7) * w;
      uint32_t c = 0;
      for (int k = 0; k < 4; ++k) c |= (uint32_t)((bit >> 3) + k) << (8 * k);
      ctl[l] = c;
      shift[l] = (uint32_t)(bit & 7);
      mask[l] = (1u << w) - 1;
    }
  }
  // 8 sums from p (AVX2) or 8 from p and 8 from p + w (AVX-512), as dwords.
  inline vu Unpack(const uint8_t* p) const {
#if THC_W == 16
    __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)p));
    v = _mm512_mask_broadcast_i32x4(v, 0xFF00, _mm_loadu_si128((const __m128i*)(p + w)));
    v = _mm512_shuffle_epi8(v, (__m512i)ctl);
    return (vu)_mm512_srlv_epi32(v, (__m512i)shift) & mask;
#elif THC_W == 8
    __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)p));
    v = _mm256_shuffle_epi8(v, (__m256i)ctl);
    return (vu)_mm256_srlv_epi32(v, (__m256i)shift) & mask;
#else
    vu r;
    for (int l = 0; l < W; ++l) r[l] = SumAt(p, 16, (size_t)l, w);
    return r;
#endif
  }
  inline vf operator()(size_t i) const {
    const size_t at = i * (size_t)w / 8;
    if ((i & 63) == 0) {
      const uint8_t* ahead = s + (i + kPrefetch) * (size_t)w / 8;
      PrefetchRead(ahead);
      PrefetchRead(ahead + 64);
    }
    const vu x = __builtin_expect(at + kReach <= bytes, 1) ? Unpack(s + at) : Tail(at);
    const vf z = __builtin_convertvector((vi)x, vf) * a;  // x < 2^14: exact
    return z + b;
  }
  // The stream's last vectors: a load of kReach bytes would read past its end.
  __attribute__((noinline)) vu Tail(size_t at) const {
    alignas(64) uint8_t t[kReach] = {};
    std::memcpy(t, s + at, bytes - at < kReach ? bytes - at : kReach);
    return Unpack(t);
  }
  void Flush() const {}
};

struct BitSource {  // any other w: one sum at a time (n * g >= 2^14: from 547 workers at g = 30)
  const uint8_t* s;
  size_t bytes;
  int w;
  vf a, b;
  inline vf operator()(size_t i) const {
    vu x;
    for (int l = 0; l < W; ++l) x[l] = SumAt(s, bytes, i + (size_t)l, w);
    const vf hi = __builtin_convertvector((vi)(x >> 16), vf) * 65536.0f;  // as ToFloat(uint32)
    const vf z = (hi + __builtin_convertvector((vi)(x & 0xFFFFu), vf)) * a;
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

template <class Src>
void DecodePipeline(Src src, size_t nvalid, size_t n, uint64_t j0, size_t block, uint32_t key,
                    float* work, float* out, int threads) {
  SignedSink sink{out, nvalid, ChunkSignWords(key, j0, n)};
  if (threads > 1 && n == block && block > kLeaf) {
    BlockToThreads<true>(
        work, 0, block, [&](size_t) { return src; }, [&](size_t) { return sink; }, threads);
    return;
  }
  for (size_t b = 0; b < n; b += block) BlockTo<true>(work, b, block, src, sink);
}

}  // namespace

void DecodeChunk(const uint8_t* sums, int sum_bits, size_t bytes, size_t nvalid, size_t n,
                 uint64_t j0, size_t block, uint32_t sign_key, float m1, float m0, float* work,
                 float* out, int threads) {
  // sign * (w * 1) == sign * w: the pipeline skips the multiply by one. Blocks of any size
  // (the last pass hands the sink each stream's lines in a row, so its strided stores to out
  // are whole lines; see RadixPassTo).
  if (W >= 8 && block >= kMinPipelineBlock) {
    auto run = [&](auto src) {
      DecodePipeline(src, nvalid, n, j0, block, sign_key, work, out, threads);
    };
    const vf a = BroadcastF(m1), b = BroadcastF(m0);
    switch (sum_bits) {
      case 8: run(LaneSource<uint8_t>{sums, a, b}); return;
      case 16: run(LaneSource<uint16_t>{reinterpret_cast<const uint16_t*>(sums), a, b}); return;
      case 32: run(LaneSource<uint32_t>{reinterpret_cast<const uint32_t*>(sums), a, b}); return;
    }
    if (sum_bits <= kMaxShuffleBits) run(PackedSource(sums, bytes, sum_bits, m1, m0));
    else run(BitSource{sums, bytes, sum_bits, a, b});
    return;
  }
  LoadSums(sums, sum_bits, bytes, n, m1, m0, work);
  for (size_t b = 0; b < n; b += block) BlockFwht(work + b, block);
  ScaleSigned(work, nvalid, j0, sign_key, 1.0f, out);
}

}  // namespace THC_ISA
}  // namespace detail
}  // namespace thc
