// byteps-thc codec core: the aggregate kernel family (included by aggregate*.cc).
//
// sums[i] += TBL[index i] for one payload: unpack the b-bit LSB-first stream, look the index up,
// add into unsigned 8/16/32-bit lanes (the lane width is chosen so nothing overflows). Integer
// arithmetic only, so every path gives the same bits. The common b = 4 case looks the 16-entry
// table up with a byte shuffle (pshufb), 64 (AVX2) or 128 (AVX-512) indices a step.
#pragma once

#include "internal.h"
#include "simd.h"

namespace thc {
namespace detail {
namespace THC_ISA {
namespace {

constexpr size_t kUnpack = 1024;  // indices unpacked at a time by the generic path

// idx[0, n) from the stream at bit offset 0 of `in` (n a multiple of 8 except at the very end).
void Unpack(const uint8_t* in, size_t n, int bits, uint8_t* idx) {
  if (bits == 8) {
    std::memcpy(idx, in, n);
    return;
  }
  size_t i = 0;
  size_t o = 0;
#if defined(__BMI2__)
  const size_t in_bytes = (n * (size_t)bits + 7) / 8;
  const uint64_t mask = 0x0101010101010101ull * ((1u << bits) - 1);
  for (; i + 8 <= n && o + 8 <= in_bytes; i += 8, o += (size_t)bits) {
    uint64_t x;
    std::memcpy(&x, in + o, 8);
    const uint64_t spread = _pdep_u64(x, mask);
    std::memcpy(idx + i, &spread, 8);
  }
#endif
  uint64_t acc = 0;
  int nb = 0;
  const uint32_t m = (1u << bits) - 1;
  for (; i < n; ++i) {
    while (nb < bits) {
      acc |= (uint64_t)in[o++] << nb;
      nb += 8;
    }
    idx[i] = (uint8_t)(acc & m);
    acc >>= bits;
    nb -= bits;
  }
}

template <class T>
void AddGeneric(const uint8_t* payload, size_t n, int bits, const uint32_t* tbl, T* s) {
  uint8_t idx[kUnpack];
  T t[256];
  const int levels = 1 << bits;
  for (int i = 0; i < levels; ++i) t[i] = (T)tbl[i];
  if (bits == 4) {  // two indices a byte: no unpack buffer
    size_t i = 0;
    for (; i + 2 <= n; i += 2) {
      const uint8_t b = payload[i / 2];
      s[i] += t[b & 15];
      s[i + 1] += t[b >> 4];
    }
    if (i < n) s[i] += t[payload[i / 2] & 15];
    return;
  }
  for (size_t i = 0; i < n; i += kUnpack) {
    const size_t m = (n - i) < kUnpack ? (n - i) : kUnpack;
    Unpack(payload + i / 8 * (size_t)bits, m, bits, idx);  // i is a multiple of 8
    T* out = s + i;
    for (size_t k = 0; k < m; ++k) out[k] += t[idx[k]];
  }
}

#if THC_W == 16
// Two vectors of bytes a, b interleaved per 128-bit lane, put back in element order.
inline void Interleave8(__m512i a, __m512i b, __m512i* o0, __m512i* o1) {
  const __m512i lo = _mm512_unpacklo_epi8(a, b), hi = _mm512_unpackhi_epi8(a, b);
  *o0 = _mm512_permutex2var_epi64(lo, _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), hi);
  *o1 = _mm512_permutex2var_epi64(lo, _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15), hi);
}

// b = 4: 128 indices (64 payload bytes) a step. Returns how many elements were done.
template <int kLane>
size_t AddNibbles(const uint8_t* payload, size_t n, const uint32_t* tbl, void* sums) {
  alignas(16) uint8_t lo_t[16], hi_t[16];
  for (int i = 0; i < 16; ++i) {
    lo_t[i] = (uint8_t)tbl[i];
    hi_t[i] = (uint8_t)(tbl[i] >> 8);
  }
  const __m512i tl = _mm512_broadcast_i32x4(_mm_load_si128((const __m128i*)lo_t));
  const __m512i th = _mm512_broadcast_i32x4(_mm_load_si128((const __m128i*)hi_t));
  const __m512i nib = _mm512_set1_epi8(0x0F);
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    const __m512i x = _mm512_loadu_si512(payload + i / 2);
    const __m512i lo = _mm512_and_si512(x, nib);
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), nib);
    __m512i q0, q1;  // indices of elements i .. i+63, i+64 .. i+127
    Interleave8(lo, hi, &q0, &q1);
    if constexpr (kLane == 8) {
      uint8_t* s = static_cast<uint8_t*>(sums) + i;
      _mm512_storeu_si512(s, _mm512_add_epi8(_mm512_loadu_si512(s), _mm512_shuffle_epi8(tl, q0)));
      _mm512_storeu_si512(s + 64,
                          _mm512_add_epi8(_mm512_loadu_si512(s + 64), _mm512_shuffle_epi8(tl, q1)));
    } else {
      uint16_t* s = static_cast<uint16_t*>(sums) + i;
      const __m512i qs[2] = {q0, q1};
      for (int h = 0; h < 2; ++h) {
        __m512i v0, v1;
        Interleave8(_mm512_shuffle_epi8(tl, qs[h]), _mm512_shuffle_epi8(th, qs[h]), &v0, &v1);
        uint16_t* p = s + 64 * h;
        _mm512_storeu_si512(p, _mm512_add_epi16(_mm512_loadu_si512(p), v0));
        _mm512_storeu_si512(p + 32, _mm512_add_epi16(_mm512_loadu_si512(p + 32), v1));
      }
    }
  }
  return i;
}
#elif THC_W == 8
inline void Interleave8(__m256i a, __m256i b, __m256i* o0, __m256i* o1) {
  const __m256i lo = _mm256_unpacklo_epi8(a, b), hi = _mm256_unpackhi_epi8(a, b);
  *o0 = _mm256_permute2x128_si256(lo, hi, 0x20);
  *o1 = _mm256_permute2x128_si256(lo, hi, 0x31);
}

// b = 4: 64 indices (32 payload bytes) a step. Returns how many elements were done.
template <int kLane>
size_t AddNibbles(const uint8_t* payload, size_t n, const uint32_t* tbl, void* sums) {
  alignas(16) uint8_t lo_t[16], hi_t[16];
  for (int i = 0; i < 16; ++i) {
    lo_t[i] = (uint8_t)tbl[i];
    hi_t[i] = (uint8_t)(tbl[i] >> 8);
  }
  const __m256i tl = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i*)lo_t));
  const __m256i th = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i*)hi_t));
  const __m256i nib = _mm256_set1_epi8(0x0F);
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m256i x = _mm256_loadu_si256((const __m256i*)(payload + i / 2));
    const __m256i lo = _mm256_and_si256(x, nib);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), nib);
    __m256i q0, q1;
    Interleave8(lo, hi, &q0, &q1);
    if constexpr (kLane == 8) {
      __m256i* s = (__m256i*)(static_cast<uint8_t*>(sums) + i);
      _mm256_storeu_si256(s, _mm256_add_epi8(_mm256_loadu_si256(s), _mm256_shuffle_epi8(tl, q0)));
      _mm256_storeu_si256(s + 1,
                          _mm256_add_epi8(_mm256_loadu_si256(s + 1), _mm256_shuffle_epi8(tl, q1)));
    } else {
      uint16_t* s = static_cast<uint16_t*>(sums) + i;
      const __m256i qs[2] = {q0, q1};
      for (int h = 0; h < 2; ++h) {
        __m256i v0, v1;
        Interleave8(_mm256_shuffle_epi8(tl, qs[h]), _mm256_shuffle_epi8(th, qs[h]), &v0, &v1);
        __m256i* p = (__m256i*)(s + 32 * h);
        _mm256_storeu_si256(p, _mm256_add_epi16(_mm256_loadu_si256(p), v0));
        _mm256_storeu_si256(p + 1, _mm256_add_epi16(_mm256_loadu_si256(p + 1), v1));
      }
    }
  }
  return i;
}
#endif

template <class T>
void AddLanes(const uint8_t* payload, size_t n, int bits, const uint32_t* tbl, T* s) {
  size_t done = 0;
#if THC_W >= 8
  if constexpr (sizeof(T) <= 2) {
    if (bits == 4) done = AddNibbles<8 * sizeof(T)>(payload, n, tbl, s);
  }
#endif
  AddGeneric(payload + done / 8 * (size_t)bits, n - done, bits, tbl, s + done);
}

}  // namespace

void AddIndices(const uint8_t* payload, size_t n, int bits, const uint32_t* tbl, int lane_bits,
                void* sums) {
  switch (lane_bits) {
    case 8: AddLanes(payload, n, bits, tbl, static_cast<uint8_t*>(sums)); break;
    case 16: AddLanes(payload, n, bits, tbl, static_cast<uint16_t*>(sums)); break;
    default: AddLanes(payload, n, bits, tbl, static_cast<uint32_t*>(sums)); break;
  }
}

}  // namespace THC_ISA
}  // namespace detail
}  // namespace thc
