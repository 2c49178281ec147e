// byteps-thc LHC core: the kernel family (included by kernels*.cc with LHC_ISA and LHC_W).
//
// Vectors are GCC/Clang vector extensions of LHC_W 32-bit lanes (the vocabulary is
// common/simd.h); the same source compiled with different -m flags gives the portable, AVX2 and
// AVX-512 kernels. Everything is integer or exact (a float add, compares on bits), so every
// build gives the reference's bits. Helpers live in an anonymous namespace inside lhc::detail::LHC_ISA: copies built with different flags
// are never merged by the linker.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "internal.h"

#if !defined(LHC_ISA) || !defined(LHC_W)
#error "define LHC_ISA and LHC_W before including kernels_impl.h"
#endif
#define CODEC_SIMD_ISA LHC_ISA
#define CODEC_SIMD_W LHC_W
#include "common/simd.h"

namespace lhc {
namespace detail {
namespace LHC_ISA {
namespace {

using ::codec::Hash32;
using ::codec::simd::LHC_ISA::Hash32V;
using ::codec::simd::LHC_ISA::LoadF;
using ::codec::simd::LHC_ISA::LoadU;
using ::codec::simd::LHC_ISA::MoveMask;
using ::codec::simd::LHC_ISA::StoreF;
using ::codec::simd::LHC_ISA::StoreU;
using ::codec::simd::LHC_ISA::vf;
using ::codec::simd::LHC_ISA::vi;
using ::codec::simd::LHC_ISA::vq;
using ::codec::simd::LHC_ISA::vu;
using ::codec::simd::LHC_ISA::W;

inline uint32_t Max(uint32_t a, uint32_t b) { return a > b ? a : b; }

}  // namespace

int Prepare(const float* x, const float* r, float* a, size_t d, uint32_t* max_mag) {
  const uint32_t kAbs = 0x7FFFFFFFu, kExp = 0x7F800000u;
  vu bad_x = vu{}, bad_a = vu{}, mx = vu{};
  size_t i = 0;
  for (; i + W <= d; i += W) {
    const vf xv = LoadF(x + i);
    const vu xb = (vu)xv;
    bad_x |= (vu)((xb & kExp) == kExp);
    if (r) {
      const vf av = xv + LoadF(r + i);
      StoreF(a + i, av);
      const vu ab = (vu)av;
      bad_a |= (vu)((ab & kExp) == kExp);
      const vu mag = ab & kAbs;
      mx = mx > mag ? mx : mag;
    } else {
      const vu mag = xb & kAbs;
      mx = mx > mag ? mx : mag;
    }
  }
  uint32_t bx = 0, ba = 0, m = 0;
  for (int l = 0; l < W; ++l) {
    bx |= bad_x[l];
    ba |= bad_a[l];
    m = Max(m, mx[l]);
  }
  for (; i < d; ++i) {
    uint32_t xb;
    std::memcpy(&xb, x + i, 4);
    bx |= (xb & kExp) == kExp;
    uint32_t vb = xb;
    if (r) {
      a[i] = x[i] + r[i];
      std::memcpy(&vb, a + i, 4);
      ba |= (vb & kExp) == kExp;
    }
    m = Max(m, vb & kAbs);
  }
  *max_mag = m;
  if (bx) return 1;
  return ba ? 2 : 0;
}

size_t NonzeroBitmap(const float* v, size_t d, uint64_t* words) {
  const size_t nw = (d + 63) / 64;
  size_t count = 0;
  for (size_t w = 0; w < nw; ++w) {
    const size_t base = w * 64;
    uint64_t word = 0;
    if (base + 64 <= d) {
      for (int k = 0; k < 64; k += W) {
        const vu b = LoadU(v + base + k) & 0x7FFFFFFFu;
        word |= (uint64_t)MoveMask((vi)(b != 0)) << k;
      }
    } else {
      for (size_t k = 0; base + k < d; ++k) {
        uint32_t b;
        std::memcpy(&b, v + base + k, 4);
        word |= (uint64_t)((b & 0x7FFFFFFFu) != 0) << k;
      }
    }
    words[w] = word;
    count += (size_t)__builtin_popcountll(word);
  }
  return count;
}

void OrAdd(uint64_t* words, const uint8_t* in_words, size_t nwords, uint32_t* y,
           const uint8_t* in_y, size_t m) {
  // a vector of W 32-bit lanes covers W / 2 bitmap words
  size_t i = 0;
  for (; i + W / 2 <= nwords; i += W / 2)
    StoreU(words + i, LoadU(words + i) | LoadU(in_words + 8 * i));
  for (; i < nwords; ++i) {
    uint64_t w;
    std::memcpy(&w, in_words + 8 * i, 8);
    words[i] |= w;
  }
  size_t b = 0;
  for (; b + W <= m; b += W) StoreU(y + b, LoadU(y + b) + LoadU(in_y + 4 * b));
  for (; b < m; ++b) {
    uint32_t v;
    std::memcpy(&v, in_y + 4 * b, 4);
    y[b] += v;
  }
}

void BucketsK(const uint32_t* keys, const uint32_t* idx, size_t n, uint32_t sub, uint32_t* b,
              uint8_t* neg) {
  size_t i = 0;
  for (; i + W <= n; i += W) {
    const vu iv = LoadU(idx + i);
    vu bj[3];
    vu sg = vu{};
    for (int j = 0; j < 3; ++j) {
      const vu h = Hash32V(iv ^ keys[j]);
      const vq wide = __builtin_convertvector(h, vq) * (uint64_t)sub;
      bj[j] = __builtin_convertvector(wide >> 32, vu) + (uint32_t)j * sub;
      sg |= (h & 1u) << (uint32_t)j;
    }
    for (int l = 0; l < W; ++l) {
      b[3 * (i + l)] = bj[0][l];
      b[3 * (i + l) + 1] = bj[1][l];
      b[3 * (i + l) + 2] = bj[2][l];
      neg[i + l] = (uint8_t)sg[l];
    }
  }
  for (; i < n; ++i) {
    uint8_t s = 0;
    for (uint32_t j = 0; j < 3; ++j) {
      const uint32_t h = Hash32(idx[i] ^ keys[j]);
      b[3 * i + j] = (uint32_t)(((uint64_t)h * sub) >> 32) + j * sub;
      s |= (uint8_t)((h & 1u) << j);
    }
    neg[i] = s;
  }
}

}  // namespace LHC_ISA
}  // namespace detail
}  // namespace lhc
