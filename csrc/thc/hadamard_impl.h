// byteps-thc codec core: the Walsh-Hadamard kernel family (included by hadamard*.cc).
//
// Hu of a block of n = 2^k floats as stages h = 1, 2, 4, ..., n/2 (docs/ALGORITHM.md). Every
// element sees the stages in increasing h; only independent butterflies are reordered, so the
// bits equal the stage-by-stage definition. Layout of the work:
//   * in-vector stages h < W: one lane shuffle, one sign flip and one add per stage and vector
//     (b + a == a + b and a + (-b) == a - b exactly in IEEE arithmetic);
//   * stages between vectors are done several at a time in registers ("radix" passes: load 2^S
//     vectors h apart, do S stages, store), so each pass over memory does S stages;
//   * blocks larger than kLeaf are cache-blocked recursively: transform each of the 2^S
//     sub-blocks fully (they fit L1, then L2), then one radix pass for the top S stages.
#pragma once

#include "simd.h"

namespace thc {
namespace detail {
namespace THC_ISA {
namespace {

// Tuning knobs (measured on Zen 4: leaves of 1024..4096 and radix 3 or 4 are within noise;
// the sweep is kept overridable with -D for other machines).
#ifndef THC_LEAF
#define THC_LEAF 1024
#endif
#ifndef THC_RADIX16
#define THC_RADIX16 3
#endif
constexpr size_t kLeaf = THC_LEAF;  // floats finished in L1 before going up
// Stages per register pass: 2^3 streams, within the 8 ways of L1/L2 when the stride is a
// multiple of 4 KiB (more streams could evict a line between its load and its store).
constexpr int kMaxRadix = W >= 16 ? THC_RADIX16 : 3;

template <int H>
inline vu NegMask() {
  vu m;
  for (int l = 0; l < W; ++l) m[l] = (l & H) ? 0x80000000u : 0u;
  return m;
}

// Stage h inside a vector: lane l gets x[l ^ h] + (+-x[l]).
template <int H>
inline vf InVector(vf x) {
#if THC_W == 4
  vf s = (H == 1) ? __builtin_shufflevector(x, x, 1, 0, 3, 2)
                  : __builtin_shufflevector(x, x, 2, 3, 0, 1);
#elif THC_W == 8
  vf s = (H == 1)   ? __builtin_shufflevector(x, x, 1, 0, 3, 2, 5, 4, 7, 6)
         : (H == 2) ? __builtin_shufflevector(x, x, 2, 3, 0, 1, 6, 7, 4, 5)
                    : __builtin_shufflevector(x, x, 4, 5, 6, 7, 0, 1, 2, 3);
#elif THC_W == 16
  vf s = (H == 1)   ? __builtin_shufflevector(x, x, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12,
                                              15, 14)
         : (H == 2) ? __builtin_shufflevector(x, x, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15,
                                              12, 13)
         : (H == 4) ? __builtin_shufflevector(x, x, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9,
                                              10, 11)
                    : __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4,
                                              5, 6, 7);
#else
#error "THC_W must be 4, 8 or 16"
#endif
  return s + AsF(AsU(x) ^ NegMask<H>());
}

inline vf AllInVector(vf x) {
  x = InVector<1>(x);
  x = InVector<2>(x);
  if constexpr (W >= 8) x = InVector<4>(x);
  if constexpr (W >= 16) x = InVector<8>(x);
  return x;
}

// S stages across 2^S register vectors r[0..2^S): distances 1, 2, 4, ... in register index.
template <int S>
inline void RegisterStages(vf* r) {
#pragma GCC unroll 8
  for (int st = 0; st < S; ++st) {
    const int d = 1 << st;
#pragma GCC unroll 16
    for (int m = 0; m < (1 << S); ++m) {
      if (m & d) continue;
      const vf a = r[m], b = r[m + d];
      r[m] = a + b;
      r[m + d] = a - b;
    }
  }
}

// Stages h, 2h, ..., h*2^(S-1) over x[0, n); h a multiple of the vector V's width, n a
// multiple of h*2^S.
template <int S, class V>
void RadixPassV(float* x, size_t n, size_t h) {
  constexpr size_t kW = sizeof(V) / sizeof(float);
  const size_t span = h << S;
  for (size_t base = 0; base < n; base += span) {
    float* p = x + base;
    for (size_t o = 0; o < h; o += kW) {
      V r[1 << S];
#pragma GCC unroll 16
      for (int m = 0; m < (1 << S); ++m) std::memcpy(&r[m], p + o + m * h, sizeof(V));
#pragma GCC unroll 8
      for (int st = 0; st < S; ++st) {
        const int d = 1 << st;
#pragma GCC unroll 16
        for (int m = 0; m < (1 << S); ++m) {
          if (m & d) continue;
          const V a = r[m], b = r[m + d];
          r[m] = a + b;
          r[m + d] = a - b;
        }
      }
#pragma GCC unroll 16
      for (int m = 0; m < (1 << S); ++m) std::memcpy(p + o + m * h, &r[m], sizeof(V));
    }
  }
}

template <int S>
void RadixPass(float* x, size_t n, size_t h) {
  RadixPassV<S, vf>(x, n, h);
}

void RadixPassS(float* x, size_t n, size_t h, int s) {
  switch (s) {
    case 1: RadixPass<1>(x, n, h); break;
    case 2: RadixPass<2>(x, n, h); break;
    case 3: RadixPass<3>(x, n, h); break;
    default: RadixPass<kMaxRadix>(x, n, h); break;
  }
}

void ScalarFwht(float* x, size_t n) {
  for (size_t h = 1; h < n; h <<= 1)
    for (size_t i = 0; i < n; i += 2 * h)
      for (size_t k = i; k < i + h; ++k) {
        const float a = x[k], b = x[k + h];
        x[k] = a + b;
        x[k + h] = a - b;
      }
}

// All stages of a block of n <= kLeaf floats (n a power of two).
void LeafFwht(float* x, size_t n) {
  if (n < (size_t)W) { ScalarFwht(x, n); return; }
  // Pass 1: in-vector stages, then up to 3 stages between neighbouring vectors.
  const size_t vecs = n / W;
  if (vecs >= 8) {
    for (size_t i = 0; i < n; i += 8 * W) {
      vf r[8];
#pragma GCC unroll 8
      for (int m = 0; m < 8; ++m) r[m] = AllInVector(LoadF(x + i + m * W));
      RegisterStages<3>(r);
#pragma GCC unroll 8
      for (int m = 0; m < 8; ++m) StoreF(x + i + m * W, r[m]);
    }
  } else {
    vf r[8];
    for (size_t m = 0; m < vecs; ++m) r[m] = AllInVector(LoadF(x + m * W));
    if (vecs == 2) RegisterStages<1>(r);
    if (vecs == 4) RegisterStages<2>(r);
    for (size_t m = 0; m < vecs; ++m) StoreF(x + m * W, r[m]);
    return;
  }
  // The rest, kMaxRadix stages per pass while in L1.
  size_t h = 8 * W;
  while (h < n) {
    int s = 0;
    while (s < kMaxRadix && (h << (s + 1)) <= n) ++s;
    RadixPassS(x, n, h, s);
    h <<= s;
  }
}

// Cache-blocked transform of one block of n floats (a power of two).
void BlockFwht(float* x, size_t n) {
  if (n <= kLeaf) { LeafFwht(x, n); return; }
  int levels = 0;  // stages above the leaf
  for (size_t m = n; m > kLeaf; m >>= 1) ++levels;
  const int s = levels < kMaxRadix ? levels : kMaxRadix;
  const size_t sub = n >> s;
  for (size_t i = 0; i < n; i += sub) BlockFwht(x + i, sub);
  RadixPassS(x, n, sub, s);
}

}  // namespace

void Fwht(float* x, size_t n, size_t block) {
  for (size_t i = 0; i < n; i += block) BlockFwht(x + i, block);
}

}  // namespace THC_ISA
}  // namespace detail
}  // namespace thc
