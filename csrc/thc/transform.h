// byteps-thc codec core: the Walsh-Hadamard transform's building blocks, shared by the kernel
// families (hadamard_impl.h: the transform alone; quantize_impl.h and dequantize_impl.h: the
// fused encode and decode pipelines). Internal linkage, like simd.h.
//
// Hu of a block of n = 2^k floats as stages h = 1, 2, 4, ..., n/2 (docs/ALGORITHM.md). Every
// element sees the stages in increasing h; only independent butterflies are reordered, so the
// bits equal the stage-by-stage definition. Layout of the work:
//   * in-vector stages h < W: one lane shuffle and one add per stage and vector (AVX-512, AVX2: an
//     exact fused multiply-add by +-1; otherwise a sign flip and an add);
//   * stages between vectors are done several at a time in registers ("radix" passes: load 2^S
//     vectors h apart, do S stages, store), so each pass over memory does S stages;
//   * blocks larger than kLeaf are cache-blocked recursively: transform each of the 2^S
//     sub-blocks fully (they fit L1, then L2), then one radix pass for the top S stages.
// The pipelines (BlockT) take the first pass's input from a source functor and hand the last
// pass's output vectors to a sink functor, so that loading, signs, quantisation, packing and the
// residual happen in registers inside the transform's own passes over memory.
#pragma once

#include <type_traits>

#include "internal.h"
#include "simd.h"

namespace thc {
namespace detail {
namespace THC_ISA {
namespace {

// Tuning knobs (measured on Zen 4 with AVX-512: leaves of 1024..4096 and radix 3 or 4 are within
// noise; AVX2: a leaf of 2048 does the 14 stages between vectors of a 2^20 block in 5 passes
// after the first instead of 6, and was faster on a Xeon; overridable with -D).
#ifndef THC_LEAF
#define THC_LEAF (THC_W == 8 ? 2048 : 1024)
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
  vf s = (H == 1)
             ? __builtin_shufflevector(x, x, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14)
         : (H == 2)
             ? __builtin_shufflevector(x, x, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13)
         : (H == 4)
             ? __builtin_shufflevector(x, x, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11)
             : __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
#else
#error "THC_W must be 4, 8 or 16"
#endif
#if THC_W == 16
  // One fused multiply-add with a +-1 factor: the product is exact, so fma(x, +-1, s) rounds
  // s +- x once, exactly as the add does (signed zeros too); it runs on the multiply pipes,
  // leaving the add pipes to the stages between vectors.
  return (vf)_mm512_fmadd_ps((__m512)x, (__m512)AsF(NegMask<H>() | AsU(BroadcastF(1.0f))),
                             (__m512)s);
#elif THC_W == 8 && defined(THC_FMA)
  return (vf)_mm256_fmadd_ps((__m256)x, (__m256)AsF(NegMask<H>() | AsU(BroadcastF(1.0f))),
                             (__m256)s);
#else
  return s + AsF(AsU(x) ^ NegMask<H>());
#endif
}

__attribute__((always_inline)) inline vf AllInVector(vf x) {
  x = InVector<1>(x);
  x = InVector<2>(x);
  if constexpr (W >= 8) x = InVector<4>(x);
  if constexpr (W >= 16) x = InVector<8>(x);
  return x;
}

// S stages across 2^S register vectors r[0..2^S): distances 1, 2, 4, ... in register index.
template <int S, class V = vf>
__attribute__((always_inline)) inline void RegisterStages(V* r) {
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
      RegisterStages<S, V>(r);
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
  if (n < (size_t)W) {
    ScalarFwht(x, n);
    return;
  }
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
  if (n <= kLeaf) {
    LeafFwht(x, n);
    return;
  }
  int levels = 0;  // stages above the leaf
  for (size_t m = n; m > kLeaf; m >>= 1) ++levels;
  const int s = levels < kMaxRadix ? levels : kMaxRadix;
  const size_t sub = n >> s;
  for (size_t i = 0; i < n; i += sub) BlockFwht(x + i, sub);
  RadixPassS(x, n, sub, s);
}

// ---- pipelines: a source for the first pass, a sink for the last ----
// Positions are element offsets from a base pointer w (the chunk); every pass writes back to w
// except the last, which calls the sink: sink(i, v) for the W values of elements i..i+W-1.
// Sources and sinks are passed by value (copies the compiler keeps in registers: through a
// reference, every store of a float could alias them and force reloads); a source's Flush()
// runs at the end of each first pass, for what it accumulates (the non-finite check).

// Software prefetch distance of the pipelines' streams from and to memory (gradient, residual,
// output): one block of 1024 ahead, or the same offset further along a strided stream. The
// kernels compute on L1-resident data between these loads and stores, so the hardware
// prefetchers alone leave the core waiting on L3 (measured: a third of the encode's time).
constexpr size_t kPrefetch = 1024;
template <class T>
inline void PrefetchRead(const T* p) {
  __builtin_prefetch(p, 0, 3);
}
template <class T>
inline void PrefetchWrite(T* p) {
  __builtin_prefetch(p, 1, 3);
}

// The signs of a chunk as words, once per chunk and vectorised: words[k] = hash32(key ^ (j0/32 + k))
// (docs/ALGORITHM.md; j0 a multiple of 32), so that flipping a vector's signs in a pipeline is a
// load of its bits and one masked xor (AVX-512) instead of a scalar hash per vector. In a
// per-thread buffer, valid until the thread's next call.
inline const uint32_t* ChunkSignWords(uint32_t key, uint64_t j0, size_t n) {
  thread_local AlignedArray<uint32_t> words;
  const size_t nw = (n + 31) / 32;
  if (words.size() < nw + W) words.resize(nw + W);
  uint32_t* out = words.data();
  const uint32_t base = (uint32_t)(j0 >> 5);
  size_t k = 0;
  for (; k + W <= nw; k += W)
    StoreU(out + k, Hash32V(BroadcastU(key) ^ (BroadcastU(base + (uint32_t)k) + Iota())));
  for (; k < nw; ++k) out[k] = Hash32(key ^ (base + (uint32_t)k));
  return out;
}

// x with the signs of chunk elements i .. i+W-1 applied (i a multiple of W).
inline vf FlipSigns(vf x, const uint32_t* words, size_t i) {
#if THC_W == 16
  uint16_t bits;  // little-endian: the 16 bits of elements i .. i+15
  std::memcpy(&bits, reinterpret_cast<const uint16_t*>(words) + (i >> 4), 2);
  return (vf)_mm512_mask_xor_epi32((__m512i)x, (__mmask16)bits, (__m512i)x,
                                   _mm512_set1_epi32((int)0x80000000u));
#else
  return AsF(AsU(x) ^ (((BroadcastU(words[i >> 5] >> (i & 31)) >> Iota()) & 1u) << 31));
#endif
}

struct StoreTo {  // the sink of every pass but the last
  float* w;
  inline void operator()(size_t i, const vf& v) const { std::memcpy(w + i, &v, sizeof v); }
};
struct LoadFrom {  // a source that is the buffer itself
  const float* w;
  inline vf operator()(size_t i) const { return LoadF(w + i); }
  void Flush() const {}
};

// Floats of each stream the last pass of a pipeline hands its sink in one go (see RadixPassTo).
constexpr size_t kSinkTile = 64;

// Stages h, 2h, ..., h*2^(S-1) over w[base, base + n), results to sink.
// A pass into the buffer itself stores each register group's 2^S vectors where they came from.
// The last pass of a pipeline (any other sink) goes through a small tile in L1 instead: the
// stages fill kSinkTile floats of each of the 2^S streams, then the sink takes the streams one
// after another, kSinkTile floats each. So every stream the sink writes (a streaming store of
// the new residual, the output) gets whole cache lines in a row: with 2^S interleaved streams
// of half-line (AVX2) stores, the write-combining buffers are flushed half full and every line
// costs two partial writes to memory. And the sink's constants (its lookup tables are up to 14
// AVX2 registers) stay in registers through its own loop instead of competing with the 2^S
// vectors of the stages.
// [o_lo, o_hi): the offsets within each span that this call does (all of [0, h) by default;
// BlockToThreads splits them, in multiples of min(h, kSinkTile)).
template <int S, class Sink>
void RadixPassTo(float* w, size_t base, size_t n, size_t h, Sink sink, size_t o_lo = 0,
                 size_t o_hi = (size_t)-1) {
  const size_t span = h << S;
  if (o_hi > h) o_hi = h;
  if constexpr (std::is_same_v<Sink, StoreTo>) {
    for (size_t b = base; b < base + n; b += span) {
      float* p = w + b;
      for (size_t o = o_lo; o < o_hi; o += W) {
        vf r[1 << S];
#pragma GCC unroll 16
        for (int m = 0; m < (1 << S); ++m) std::memcpy(&r[m], p + o + m * h, sizeof(vf));
        RegisterStages<S>(r);
#pragma GCC unroll 16
        for (int m = 0; m < (1 << S); ++m) std::memcpy(p + o + m * h, &r[m], sizeof(vf));
      }
    }
  } else {
    alignas(64) float tile[1 << S][kSinkTile];
    const size_t step = h < kSinkTile ? h : kSinkTile;  // h and kSinkTile: powers of two >= W
    for (size_t b = base; b < base + n; b += span) {
      const float* p = w + b;
      for (size_t o = o_lo; o < o_hi; o += step) {
        for (size_t q = 0; q < step; q += W) {
          vf r[1 << S];
#pragma GCC unroll 16
          for (int m = 0; m < (1 << S); ++m) std::memcpy(&r[m], p + o + q + m * h, sizeof(vf));
          RegisterStages<S>(r);
#pragma GCC unroll 16
          for (int m = 0; m < (1 << S); ++m) std::memcpy(&tile[m][q], &r[m], sizeof(vf));
        }
        for (int m = 0; m < (1 << S); ++m)
          for (size_t q = 0; q < step; q += W) sink(b + o + m * h + q, LoadF(&tile[m][q]));
      }
    }
  }
}

template <class Sink>
void RadixPassSTo(float* w, size_t base, size_t n, size_t h, int s, Sink sink, size_t o_lo = 0,
                  size_t o_hi = (size_t)-1) {
  switch (s) {
    case 1: RadixPassTo<1>(w, base, n, h, sink, o_lo, o_hi); break;
    case 2: RadixPassTo<2>(w, base, n, h, sink, o_lo, o_hi); break;
    case 3: RadixPassTo<3>(w, base, n, h, sink, o_lo, o_hi); break;
    default: RadixPassTo<kMaxRadix>(w, base, n, h, sink, o_lo, o_hi); break;
  }
}

// First pass of a leaf (n a multiple of 8W): the source's vectors, their in-vector stages
// (unless kInVec is false: the source already did them), 3 stages between neighbours.
template <bool kInVec, class Src, class Sink>
void FirstPassTo(size_t base, size_t n, Src src, Sink sink) {
  for (size_t i = base; i < base + n; i += 8 * W) {
    vf r[8];
#pragma GCC unroll 8
    for (int m = 0; m < 8; ++m) {
      r[m] = src(i + m * W);
      if constexpr (kInVec) r[m] = AllInVector(r[m]);
    }
    RegisterStages<3>(r);
#pragma GCC unroll 8
    for (int m = 0; m < 8; ++m) sink(i + m * W, r[m]);
  }
  src.Flush();
}

// Hu of w[base, base + n), 8W <= n <= kLeaf, with the same stage grouping as LeafFwht.
template <bool kInVec, class Src, class Sink>
void LeafTo(float* w, size_t base, size_t n, Src src, Sink sink) {
  StoreTo keep{w};
  if (n == 8 * (size_t)W) {
    FirstPassTo<kInVec>(base, n, src, sink);
    return;
  }
  FirstPassTo<kInVec>(base, n, src, keep);
  size_t h = 8 * W;
  while (h < n) {
    int s = 0;
    while (s < kMaxRadix && (h << (s + 1)) <= n) ++s;
    if ((h << s) == n) RadixPassSTo(w, base, n, h, s, sink);
    else RadixPassSTo(w, base, n, h, s, keep);
    h <<= s;
  }
}

// Hu of one block w[base, base + n), n >= 8W a power of two, cache-blocked as BlockFwht.
template <bool kInVec, class Src, class Sink>
void BlockTo(float* w, size_t base, size_t n, Src src, Sink sink) {
  if (n <= kLeaf) {
    LeafTo<kInVec>(w, base, n, src, sink);
    return;
  }
  int levels = 0;
  for (size_t m = n; m > kLeaf; m >>= 1) ++levels;
  const int s = levels < kMaxRadix ? levels : kMaxRadix;
  const size_t sub = n >> s;
  StoreTo keep{w};
  for (size_t i = 0; i < n; i += sub) BlockTo<kInVec>(w, base + i, sub, src, keep);
  RadixPassSTo(w, base, n, sub, s, sink);
}

// fn(i) for i < tasks on up to `threads` threads (RunTasks), in this thread when threads <= 1.
template <class F>
void ForTasks(int threads, size_t tasks, F& fn) {
  if (threads <= 1 || tasks <= 1) {
    for (size_t i = 0; i < tasks; ++i) fn(i);
    return;
  }
  RunTasks(threads, tasks, [](void* c, size_t i) { (*static_cast<F*>(c))(i); }, &fn);
}

// Sub-blocks of BlockTo's top pass (2^s, s <= kMaxRadix).
constexpr size_t kMaxSubBlocks = size_t{1} << kMaxRadix;

// BlockTo of one block of n > kLeaf floats on `threads` threads, with BlockTo's operations on
// every element (only independent work is spread): first the 2^s sub-blocks below the top pass,
// each transformed wholly by one task into w (task i's source: make_src(i), so that what a
// source accumulates stays per task), then the top pass, its offsets split into `threads`
// ranges of whole sink tiles (task k's sink: make_sink(k)); each top task ends with a store
// fence for its streaming stores. The second phase starts when the first is done.
template <bool kInVec, class MakeSrc, class MakeSink>
void BlockToThreads(float* w, size_t base, size_t n, MakeSrc make_src, MakeSink make_sink,
                    int threads) {
  int levels = 0;
  for (size_t m = n; m > kLeaf; m >>= 1) ++levels;
  const int s = levels < kMaxRadix ? levels : kMaxRadix;
  const size_t sub = n >> s;
  auto lower = [&](size_t i) { BlockTo<kInVec>(w, base + i * sub, sub, make_src(i), StoreTo{w}); };
  ForTasks(threads, (size_t)1 << s, lower);
  const size_t unit = sub < kSinkTile ? sub : kSinkTile, units = sub / unit;
  const size_t parts = (size_t)threads < units ? (size_t)threads : units;
  auto top = [&](size_t k) {
    RadixPassSTo(w, base, n, sub, s, make_sink(k), k * units / parts * unit,
                 (k + 1) * units / parts * unit);
    StreamFence();
  };
  ForTasks(threads, parts, top);
}

// The smallest block the pipelines take (smaller blocks run the kernels one after another).
constexpr size_t kMinPipelineBlock = kLeaf >= 8 * W ? 8 * W : (size_t)-1;

}  // namespace
}  // namespace THC_ISA
}  // namespace detail
}  // namespace thc
