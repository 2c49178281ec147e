// byteps-thc CUDA: the tile kernel shared by norm, encode, decode and the multi-pass transform.
//
// A tile is 2^LT floats held in shared memory by one thread block of kThreads threads. Its local
// index l = r * C + c (C = 2^log_c columns, R = 2^(LT - log_c) rows) maps to the padded
// coordinate j = base + r * 2^lo + c, so one tile is either a run of consecutive coordinates
// (a "row tile": log_c = LT; it may hold several rotation blocks) or C consecutive columns of
// R coordinates 2^lo apart (a "column tile", for the high bits of a block larger than a tile).
// The Walsh-Hadamard stages of local bits [tb, te) run in shared memory, in increasing order,
// four bits per pass: each thread takes 16 elements that differ only in the pass's four bits into
// registers, does those butterflies, and writes them back (docs/ALGORITHM.md allows regrouping
// independent butterflies as long as every element sees h = 1, 2, 4, ... in order).
//
// A kernel is a source (what fills the tile) and a destination (what is done with the result):
//   Src::kGrad    x = grad, zero past d, signs applied; flags a NaN/Inf grad (first kernel)
//   Src::kScratch fp32 workspace (between the passes of a large block)
//   Src::kSums    z = float(S) * m1 + m0 from the aggregated lanes   (decode, first kernel)
//   Dst::kScratch fp32 workspace
//   Dst::kNorm    y = w + r (error feedback), sum of y^2 in binary64 (norm, last kernel)
//   Dst::kQuant   y = w + r, scale, clip, stochastic rounding, packing, new state r = y - deq
//                 (encode, last kernel)
//   Dst::kOut     out = sign * w, fp32 and optionally the input dtype (decode, last kernel)
// The error-feedback state r is kept rotated (docs/ALGORITHM.md, "Error-feedback state"): it is
// added after the transform and rewritten as it is, so the encode runs one transform.
//
// Scales. A "scale segment" is the run of coordinates that share one max norm: the whole
// partition (one M), or with block_scale one rotation block (M_k, and the norm's sum of y^2 per
// block). Segment of coordinate j: (j_base + j) >> scale_log (scale_log 63 for one M: always
// segment 0). A tile holds one segment, or, a row tile of blocks smaller than itself, up to
// kMaxSegments; each kernel first reads the M of its tile's segments and derives their scales
// (SegmentScale) into shared memory, so one M is the case of a single segment, not another path.
#pragma once

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "common.cuh"

namespace thc {
namespace cuda {
namespace detail {

constexpr int kThreads = 256;
// Tiles: 2^12 floats (17 KiB of shared memory) and 2^14 (66 KiB, within every sm_80+ part's
// per-block limit, and three blocks to a Hopper multiprocessor).
constexpr int kSmallTile = 12;
constexpr int kLargeTile = 14;
constexpr int kLogE = 4;  // bits per register pass
constexpr int kE = 1 << kLogE;
// Scale segments one tile may hold: a 2^12 tile of blocks of kMinScaleBlock (a 2^14 tile holds
// blocks of 2^13 or more, or lies within one block); one-block partitions hold one.
constexpr int kMaxSegments = (1 << kSmallTile) / static_cast<int>(kMinScaleBlock);

enum class Src : int { kGrad = 0, kScratch = 1, kSums = 2 };
// Src::kSums's lane type for the server's published stream (docs/ALGORITHM.md, "Publish"):
// sums of TileParams::sum_bits bits each, LSB first, packed without gaps.
struct PackedSums {};
enum class Dst : int { kScratch = 0, kQuant = 1, kNorm = 2, kOut = 3 };

// The scales of one scale segment, derived from its M (SegmentScale).
struct SegScale {
  float c1, c0;  // Dst::kQuant: t = y * c1 + c0 (both 0 for M = 0: every index 0);
                 // Src::kSums: z = S * c1 + c0
  float k1, k0;  // Dst::kQuant with error feedback: dequant = TBL[q] * k1 + k0 (0 for M = 0)
  int live;      // M > 0 (Dst::kOut: a segment of M = 0 decodes to +0)
};

struct TileParams {
  // tile geometry
  int log_c = 0;       // log2 of the columns of a tile (LT for a row tile)
  int lo = 0;          // the global bit of local bit log_c
  int tb = 0, te = 0;  // local bits to transform, [tb, te)
  uint32_t num_tiles = 0;
  bool first = false;       // first kernel of a chain: records a bad M
  bool zero_at_m0 = false;  // decode: M = 0 writes zeros (the first kernel) and skips the rest
  uint64_t d = 0, padded = 0, payload_bytes = 0;  // of this launch's range (a chunk)
  uint64_t j_base = 0;  // coordinate of the range's first element (signs, uniforms)
  // data
  const void* src = nullptr;      // grad (Src::kGrad), workspace, or sums
  const float* res_in = nullptr;  // rotated state r added to y (Dst::kQuant, kNorm); may be null
  float* res_out = nullptr;       // new state written (Dst::kQuant); null without error feedback
  float* scratch = nullptr;       // workspace (Dst::kScratch)
  uint8_t* payload = nullptr;
  float* out = nullptr;
  void* out_cast = nullptr;
  int out_dtype = kFloat32;
  double* norm_acc = nullptr;  // Dst::kNorm: sum of y^2 (binary64, atomically added)
  // code
  int bits = 4, levels = 16;
  uint32_t granularity = 30;
  double clip = 0;
  // sqrt of the scale's d_pad (the partition's; with block_scale the block's: each block is a
  // partition of its own) and of the rotation block
  double sqrt_padded = 0, sqrt_block = 0;
  int scale_log = 63;  // segment of coordinate j: (j_base + j) >> scale_log (see the top)
  uint32_t num_workers = 1;
  int sum_bits = 0;  // Src::kSums with PackedSums: the width of one sum, 1..32
  uint32_t sign_key = 0, round_key = 0;
  const double* max_norm_dev = nullptr;  // M of segment k at [k] (one M: [0]), or null
  double max_norm = 0;                   // M of every segment when max_norm_dev is null
  const int* status = nullptr;           // skip the kernel when *status != 0 (null: no check)
  int* status_out = nullptr;             // where flags are recorded (may be null)
  uint32_t table[256];
  float inv_gap[256];  // IG[i] = float(1 / (TBL[i+1] - TBL[i])) (binary64, rounded once)
};

template <int LT>
struct TileTraits {
  static constexpr int kTile = 1 << LT;
  // One float of padding every 32 keeps the register passes and the 8-wide groups free of bank
  // conflicts.
  static constexpr int kSmemFloats = kTile + kTile / 32;
  // Then 2 KiB: the table and 1/gap (Dst::kQuant), or 256 binary64 partial sums (Dst::kNorm);
  // then the scales of the tile's segments.
  static constexpr size_t kSmemBytes =
      kSmemFloats * sizeof(float) + 256 * 8 + kMaxSegments * sizeof(SegScale);
};

__device__ __forceinline__ uint32_t Pad(uint32_t l) { return l + (l >> 5); }

__device__ __forceinline__ void Butterfly(float& a, float& b) {
  const float s = __fadd_rn(a, b);
  const float t = __fsub_rn(a, b);
  a = s;
  b = t;
}

// Stages of local bits [tb, te) on the tile in shared memory, increasing. Ends with a barrier.
template <int LT>
__device__ void TileFwht(float* s, int tb, int te) {
  constexpr int kGroups = (1 << LT) / kE;
  for (int pb = tb; pb < te; pb += kLogE) {
    const int ws = pb < LT - kLogE ? pb : LT - kLogE;  // window of four bits holding [pb, ..)
    const int s_lo = pb - ws;
    const int s_hi = (te < pb + kLogE ? te : pb + kLogE) - ws;
    const uint32_t low = (1u << ws) - 1u;
    for (uint32_t grp = threadIdx.x; grp < kGroups; grp += kThreads) {
      const uint32_t l0 = (grp & low) | ((grp >> ws) << (ws + kLogE));
      float v[kE];
#pragma unroll
      for (int k = 0; k < kE; ++k) v[k] = s[Pad(l0 + (static_cast<uint32_t>(k) << ws))];
#pragma unroll
      for (int sb = 0; sb < kLogE; ++sb) {
        if (sb >= s_lo && sb < s_hi) {
#pragma unroll
          for (int k = 0; k < kE; ++k) {
            if (!(k & (1 << sb))) Butterfly(v[k], v[k | (1 << sb)]);
          }
        }
      }
#pragma unroll
      for (int k = 0; k < kE; ++k) s[Pad(l0 + (static_cast<uint32_t>(k) << ws))] = v[k];
    }
    __syncthreads();
  }
}

struct TileMap {
  uint64_t base;
  int log_c, lo;
  __device__ __forceinline__ uint64_t operator()(uint32_t l) const {
    return base + (static_cast<uint64_t>(l >> log_c) << lo) + (l & ((1u << log_c) - 1u));
  }
};

template <int LT>
__device__ __forceinline__ TileMap MakeMap(const TileParams& p, uint32_t tile) {
  const int rbits = LT - p.log_c;
  const int chunk_bits = p.lo - p.log_c;  // column chunks per 2^lo
  const uint64_t blk = static_cast<uint64_t>(tile) >> chunk_bits;
  const uint64_t chunk = tile & ((uint64_t{1} << chunk_bits) - 1u);
  return TileMap{(blk << (p.lo + rbits)) + (chunk << p.log_c), p.log_c, p.lo};
}

__device__ __forceinline__ void Flag(int* status, int bit) {
  if (status) atomicOr(status, bit);
}

// The scales kernel <S, D> derives from M, the max norm of one scale segment (docs/ALGORITHM.md,
// encode steps 3-7 and decode, with d_pad = the segment's). Returns 0, or the flag that refuses
// M: kStatusNonFiniteNorm (M not finite, or negative), kStatusOverflow (Dst::kQuant with error
// feedback: k1 or k0 not finite, a huge M, so every new r_j of the segment would be).
template <Src S, Dst D>
__device__ __forceinline__ int SegmentScale(const TileParams& p, double M, SegScale* sc) {
  sc->c1 = sc->c0 = sc->k1 = sc->k0 = 0.f;
  sc->live = M > 0.0;
  if (!(M >= 0.0 && M <= 1.7976931348623157e308)) return kStatusNonFiniteNorm;  // NaN, Inf, < 0
  const double G = static_cast<double>(p.granularity), Tc = p.clip;
  if constexpr (D == Dst::kQuant) {
    if (M != 0.0) {
      sc->c1 = static_cast<float>(G / (2.0 * Tc) * p.sqrt_padded / M / p.sqrt_block);
      sc->c0 = static_cast<float>(G / 2.0);
    }
    sc->k1 = static_cast<float>(2.0 * Tc / G * M / p.sqrt_padded * p.sqrt_block);
    sc->k0 = static_cast<float>(-Tc * M / p.sqrt_padded * p.sqrt_block);
    if (p.res_out && !(isfinite(sc->k1) && isfinite(sc->k0))) return kStatusOverflow;
  }
  if constexpr (S == Src::kSums) {
    sc->c1 = static_cast<float>(2.0 * Tc / G / static_cast<double>(p.num_workers) * M /
                                p.sqrt_padded / p.sqrt_block);
    sc->c0 = static_cast<float>(-Tc * M / p.sqrt_padded / p.sqrt_block);
  }
  return 0;
}

// M of segment k, read where it lives.
__device__ __forceinline__ double SegmentNorm(const TileParams& p, uint64_t k) {
  return p.max_norm_dev ? p.max_norm_dev[k] : p.max_norm;
}

// Sum j of a decode's source: a lane of type T, or bits [j*w, j*w + w) of the packed stream.
template <typename T>
__device__ __forceinline__ uint32_t SumAt(const TileParams& p, uint64_t j) {
  if constexpr (std::is_same<T, PackedSums>::value) {
    const uint8_t* bytes = static_cast<const uint8_t*>(p.src);
    const uint64_t bit = j * static_cast<uint64_t>(p.sum_bits);
    const int shift = static_cast<int>(bit & 7);
    const int nbytes = (shift + p.sum_bits + 7) >> 3;  // at most 5; none past the stream's end
    uint64_t v = 0;
    for (int b = 0; b < nbytes; ++b) v |= static_cast<uint64_t>(bytes[(bit >> 3) + b]) << (8 * b);
    const uint64_t mask = p.sum_bits == 32 ? 0xFFFFFFFFull : ((uint64_t{1} << p.sum_bits) - 1);
    return static_cast<uint32_t>((v >> shift) & mask);
  } else {
    return static_cast<const T*>(p.src)[j];
  }
}

template <int LT, Src S, Dst D, typename T>
__global__ void __launch_bounds__(kThreads, 4) TileKernel(const __grid_constant__ TileParams p) {
  constexpr int kTile = 1 << LT;
  THC_DYNAMIC_SMEM(smem_raw);
  float* s = reinterpret_cast<float*>(smem_raw);
  uint32_t* tbl = reinterpret_cast<uint32_t*>(s + TileTraits<LT>::kSmemFloats);
  float* ig = reinterpret_cast<float*>(tbl + 256);
  double* partial = reinterpret_cast<double*>(tbl);  // Dst::kNorm: the block's sums (no table)
  SegScale* seg = reinterpret_cast<SegScale*>(tbl + 512);

  // The status word may be flagged by this very launch (another block, or a thread of this one):
  // one vote, so that the whole block returns or none of it does (the barriers below need all).
  if (p.status && __syncthreads_or(*p.status != 0)) return;
  const TileMap map = MakeMap<LT>(p, blockIdx.x);
  const uint32_t tid = threadIdx.x;

  // The tile's scale segments [seg0, seg0 + nseg) and their scales. A bad M refuses the tile: the
  // first kernel of a chain records it. With error feedback, k1 or k0 not finite (a huge M)
  // refuses the encode's tile before anything is written.
  const uint64_t seg0 = (p.j_base + map(0)) >> p.scale_log;
  const uint64_t j_end = map(kTile - 1) < p.padded ? map(kTile - 1) : p.padded - 1;
  const uint32_t nseg = static_cast<uint32_t>(((p.j_base + j_end) >> p.scale_log) - seg0 + 1);
  int refused = 0, live = 0;
  for (uint32_t k = tid; k < nseg; k += kThreads) {
    refused |= SegmentScale<S, D>(p, SegmentNorm(p, seg0 + k), &seg[k]);
    live |= seg[k].live;
  }
  if (__syncthreads_or(refused)) {
    const int bad_norm = __syncthreads_or(refused & kStatusNonFiniteNorm);
    if (tid == 0 && (!bad_norm || p.first))
      Flag(p.status_out, bad_norm ? kStatusNonFiniteNorm : kStatusOverflow);
    return;
  }
  // Segment of the tile's element l (relative to seg0).
  auto seg_of = [&](uint64_t j) {
    return static_cast<uint32_t>(((p.j_base + j) >> p.scale_log) - seg0);
  };

  // Decode with M = 0 returns zeros: the first kernel of a chain (a row tile: consecutive
  // coordinates) writes them, the others return; a tile whose segments all have M = 0 likewise.
  // (Encode with M = 0 runs the whole path: the payload is zeros and the new state is y, which
  // needs the transform.)
  if (p.zero_at_m0 && !__syncthreads_or(live)) {
    if (!p.first) return;
    for (uint32_t l = tid; l < kTile; l += kThreads) {
      const uint64_t j = map(l);
      if (j >= p.d) break;
      if (p.out) p.out[j] = 0.f;
      if (p.out_cast) StoreCast(p.out_cast, j, 0.f, p.out_dtype);
    }
    return;
  }

  if constexpr (D == Dst::kQuant) {
    for (int i = tid; i < 256; i += kThreads) {
      tbl[i] = p.table[i];
      ig[i] = p.inv_gap[i];
    }
  }

  // -- source --------------------------------------------------------------------------------
  if constexpr (S == Src::kGrad) {
    const T* grad = static_cast<const T*>(p.src);
    bool bad = false;
    for (uint32_t l = tid; l < kTile; l += kThreads) {
      const uint64_t j = map(l);
      float x = 0.f;
      if (j < p.d) {
        x = ToFloat(grad[j]);
        bad |= !isfinite(x);
      }
      s[Pad(l)] = FlipSign(x, SignMask(p.sign_key, p.j_base + j));
    }
    if (bad) Flag(p.status_out, kStatusNonFiniteInput);
  } else if constexpr (S == Src::kScratch) {
    const float* src = static_cast<const float*>(p.src);
    for (uint32_t l = tid; l < kTile; l += kThreads) {
      const uint64_t j = map(l);
      s[Pad(l)] = j < p.padded ? src[j] : 0.f;
    }
  } else {  // Src::kSums: z = S * m1 + m0 with the segment's m1, m0
    for (uint32_t l = tid; l < kTile; l += kThreads) {
      const uint64_t j = map(l);
      float z = 0.f;
      if (j < p.padded) {
        const SegScale& c = seg[seg_of(j)];
        z = __fadd_rn(__fmul_rn(__uint2float_rn(SumAt<T>(p, j)), c.c1), c.c0);
      }
      s[Pad(l)] = z;
    }
  }
  __syncthreads();

  TileFwht<LT>(s, p.tb, p.te);

  // -- destination ---------------------------------------------------------------------------
  if constexpr (D == Dst::kScratch) {
    for (uint32_t l = tid; l < kTile; l += kThreads) {
      const uint64_t j = map(l);
      if (j < p.padded) p.scratch[j] = s[Pad(l)];
    }
  } else if constexpr (D == Dst::kNorm) {
    // y = w + r back into the tile (coalesced), zeros past d_pad.
    bool bad = false;
    for (uint32_t l = tid; l < kTile; l += kThreads) {
      const uint64_t j = map(l);
      float y = 0.f;
      if (j < p.padded) {
        y = s[Pad(l)];
        if (p.res_in) y = __fadd_rn(y, p.res_in[j]);
        bad |= !isfinite(y);
      }
      s[Pad(l)] = y;
    }
    // Without a residual y is the input, whose NaN/Inf the source has flagged as such.
    const int any_bad = __syncthreads_or(bad) && p.res_in;
    // Each thread sums y^2 of kRun consecutive elements (one segment: segments hold at least
    // kMinScaleBlock >= kRun of them), into the table area (not used here); then a tree over the
    // threads of each segment, and one atomic add per segment.
    constexpr int kRun = kTile / kThreads;
    double sum = 0.0;
    for (int k = 0; k < kRun; ++k) {
      const double v = static_cast<double>(s[Pad(tid * kRun + k)]);
      sum = __dadd_rn(sum, __dmul_rn(v, v));
    }
    partial[tid] = sum;
    __syncthreads();
    uint32_t per_seg = kThreads;  // threads of one segment
    if (nseg > 1) per_seg = (1u << p.scale_log) / kRun;
    for (uint32_t h = 1; h < per_seg; h <<= 1) {
      if (!(tid & (2 * h - 1))) partial[tid] = __dadd_rn(partial[tid], partial[tid + h]);
      __syncthreads();
    }
    if (!(tid & (per_seg - 1)) && tid / per_seg < nseg)
      atomicAdd(p.norm_acc + seg0 + tid / per_seg, partial[tid]);
    if (tid == 0 && any_bad) Flag(p.status_out, kStatusOverflow);
  } else if constexpr (D == Dst::kOut) {
    for (uint32_t l = tid; l < kTile; l += kThreads) {
      const uint64_t j = map(l);
      if (j < p.d) {
        // a segment of M = 0 decodes to +0 (a tile of such segments only returned above)
        const float v =
            seg[seg_of(j)].live ? FlipSign(s[Pad(l)], SignMask(p.sign_key, p.j_base + j)) : 0.f;
        if (p.out) p.out[j] = v;
        if (p.out_cast) StoreCast(p.out_cast, j, v, p.out_dtype);
      }
    }
  } else {  // Dst::kQuant
    const float gmax = static_cast<float>(p.granularity);
    const int bits = p.bits, levels = p.levels;
    const bool ef = p.res_out != nullptr;
    bool bad = false;  // a non-finite y or new r_j in this thread's coordinates
    for (uint32_t g8 = tid; g8 < kTile / 8; g8 += kThreads) {
      const uint32_t l = g8 * 8;  // 8 consecutive local elements = 8 consecutive coordinates
      const uint64_t j0 = map(l);
      if (j0 >= p.padded) continue;
      const uint64_t left = p.padded - j0;
      const int nvalid = left < 8 ? static_cast<int>(left) : 8;
      // the group's scales (8 consecutive coordinates: one segment). With M = 0, c1 = c0 = 0
      // gives t = 0, so index 0, and k1 = k0 = 0 the new state y - 0 = y.
      const SegScale& sc = seg[seg_of(j0)];
      const float c1 = sc.c1, c0 = sc.c0, k1 = sc.k1, k0 = sc.k0;
      float y[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) y[k] = s[Pad(l + k)];
      if (p.res_in) {  // y = Hu(sign * x) + r
        const float* r = p.res_in + j0;
        if (nvalid == 8 && !(reinterpret_cast<uintptr_t>(r) & 15)) {
          const float4 a = reinterpret_cast<const float4*>(r)[0];
          const float4 b = reinterpret_cast<const float4*>(r)[1];
          y[0] = __fadd_rn(y[0], a.x), y[1] = __fadd_rn(y[1], a.y);
          y[2] = __fadd_rn(y[2], a.z), y[3] = __fadd_rn(y[3], a.w);
          y[4] = __fadd_rn(y[4], b.x), y[5] = __fadd_rn(y[5], b.y);
          y[6] = __fadd_rn(y[6], b.z), y[7] = __fadd_rn(y[7], b.w);
        } else {
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            if (k < nvalid) y[k] = __fadd_rn(y[k], r[k]);
          }
        }
      }
      uint64_t word = 0;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        float t = __fadd_rn(__fmul_rn(y[k], c1), c0);
        t = fminf(fmaxf(t, 0.f), gmax);  // a NaN t (Inf * 0) becomes 0
        const uint32_t tk = static_cast<uint32_t>(t);
        int i = 0;  // largest i with TBL[i] <= trunc(t)
        for (int step = levels >> 1; step > 0; step >>= 1) {
          if (tbl[i + step] <= tk) i += step;
        }
        if (i > levels - 2) i = levels - 2;
        const float pr = __fmul_rn(__fsub_rn(t, __uint2float_rn(tbl[i])), ig[i]);
        const uint32_t q =
            static_cast<uint32_t>(i) + (Uniform(p.round_key, p.j_base + j0 + k) < pr ? 1u : 0u);
        if (k < nvalid) {
          word |= static_cast<uint64_t>(q) << (k * bits);
          bad |= !isfinite(y[k]);
        }
        if (ef) {
          const float deq = __fadd_rn(__fmul_rn(__uint2float_rn(tbl[q]), k1), k0);
          const float e = __fsub_rn(y[k], deq);
          if (k < nvalid) bad |= !isfinite(e);
          s[Pad(l + k)] = e;  // this thread's own elements: written out below, tile by tile
        }
      }
      uint8_t* dst = p.payload + (j0 >> 3) * bits;
      const uintptr_t addr = reinterpret_cast<uintptr_t>(dst);
      if (nvalid == 8 && bits == 8 && !(addr & 7)) {
        *reinterpret_cast<uint64_t*>(dst) = word;
      } else if (nvalid == 8 && bits == 4 && !(addr & 3)) {
        *reinterpret_cast<uint32_t*>(dst) = static_cast<uint32_t>(word);
      } else if (nvalid == 8 && bits == 2 && !(addr & 1)) {
        *reinterpret_cast<uint16_t*>(dst) = static_cast<uint16_t>(word);
      } else {
        const int nbytes = (nvalid * bits + 7) / 8;
        for (int b = 0; b < nbytes; ++b) dst[b] = static_cast<uint8_t>(word >> (8 * b));
      }
    }
    if (ef) {
      // The new state, coalesced, and only when this tile's y and r are all finite: a tile
      // that overflows keeps its old state (the norm of the same step, which computes the same
      // y, has normally flagged it already, and then no encode kernel runs at all).
      const int any_bad = __syncthreads_or(bad);
      if (any_bad) {
        if (tid == 0) Flag(p.status_out, kStatusOverflow);
      } else {
        for (uint32_t l = tid; l < kTile; l += kThreads) {
          const uint64_t j = map(l);
          if (j < p.padded) p.res_out[j] = s[Pad(l)];
        }
      }
    } else if (bad) {
      Flag(p.status_out, kStatusOverflow);
    }
  }
}

// Host side: launch one tile kernel over p.num_tiles tiles (defined with the instantiations).
template <int LT, Src S, Dst D, typename T>
cudaError_t LaunchTile(const TileParams& p, cudaStream_t stream);

// block_scale: the check of all `count` M_k of a call, launched before its tile kernels. Flags
// what SegmentScale<S, D> refuses (kStatusNonFiniteNorm, kStatusOverflow) into status_out; the
// tile kernels that follow on the stream read status and skip, so that a bad M_k anywhere
// leaves every output as it was.
constexpr int kCheckThreads = 256;
template <Src S, Dst D>
__global__ void __launch_bounds__(kCheckThreads)
    ScaleCheckKernel(const __grid_constant__ TileParams p, uint64_t count) {
  if (p.status && *p.status != 0) return;
  int refused = 0;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * kCheckThreads;
  for (uint64_t k = static_cast<uint64_t>(blockIdx.x) * kCheckThreads + threadIdx.x; k < count;
       k += stride) {
    SegScale sc;
    refused |= SegmentScale<S, D>(p, SegmentNorm(p, k), &sc);
  }
  if (refused) Flag(p.status_out, refused);
}

template <Src S, Dst D>
cudaError_t LaunchScaleCheck(const TileParams& p, uint64_t count, cudaStream_t stream);

#ifdef THC_CUDA_EMULATE
#define THC_DEFINE_LAUNCH_TILE(LT, S, D, T)                                \
  template <>                                                              \
  cudaError_t LaunchTile<LT, S, D, T>(const TileParams& p, cudaStream_t) { \
    thc_emu::Launch(p.num_tiles, kThreads, TileTraits<LT>::kSmemBytes,     \
                    [&p] { TileKernel<LT, S, D, T>(p); });                 \
    return cudaSuccess;                                                    \
  }
#else
// Above 48 KiB of shared memory a kernel must opt in, once per device (before any stream
// capture: the first launch on a device does it, so warm up before capturing a CUDA graph).
#define THC_DEFINE_LAUNCH_TILE(LT, S, D, T)                                                 \
  template <>                                                                               \
  cudaError_t LaunchTile<LT, S, D, T>(const TileParams& p, cudaStream_t stream) {           \
    constexpr size_t smem = TileTraits<LT>::kSmemBytes;                                     \
    if (smem > 48 * 1024) {                                                                 \
      static std::atomic<uint64_t> opted{0};                                                \
      int dev = 0;                                                                          \
      cudaError_t err = cudaGetDevice(&dev);                                                \
      if (err != cudaSuccess) return err;                                                   \
      const uint64_t bit = dev < 64 ? (uint64_t{1} << dev) : 0;                             \
      if (!bit || !(opted.load(std::memory_order_acquire) & bit)) {                         \
        err = cudaFuncSetAttribute(TileKernel<LT, S, D, T>,                                 \
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem); \
        if (err != cudaSuccess) return err;                                                 \
        opted.fetch_or(bit, std::memory_order_acq_rel);                                     \
      }                                                                                     \
    }                                                                                       \
    TileKernel<LT, S, D, T><<<p.num_tiles, kThreads, smem, stream>>>(p);                    \
    return cudaGetLastError();                                                              \
  }
#endif

#ifdef THC_CUDA_EMULATE
#define THC_DEFINE_LAUNCH_SCALE_CHECK(S, D)                                                   \
  template <>                                                                                 \
  cudaError_t LaunchScaleCheck<S, D>(const TileParams& p, uint64_t count, cudaStream_t) {     \
    const unsigned grid = static_cast<unsigned>((count + kCheckThreads - 1) / kCheckThreads); \
    thc_emu::Launch(grid < 1 ? 1 : grid, kCheckThreads, 0,                                    \
                    [&p, count] { ScaleCheckKernel<S, D>(p, count); });                       \
    return cudaSuccess;                                                                       \
  }
#else
#define THC_DEFINE_LAUNCH_SCALE_CHECK(S, D)                                                      \
  template <>                                                                                    \
  cudaError_t LaunchScaleCheck<S, D>(const TileParams& p, uint64_t count, cudaStream_t stream) { \
    const uint64_t want = (count + kCheckThreads - 1) / kCheckThreads;                           \
    const unsigned grid = static_cast<unsigned>(want < 1 ? 1 : (want < 1024 ? want : 1024));     \
    ScaleCheckKernel<S, D><<<grid, kCheckThreads, 0, stream>>>(p, count);                        \
    return cudaGetLastError();                                                                   \
  }
#endif

// The instantiations for both tile sizes; and those for each gradient type (kernels that read the
// gradient) or each lane width of the sums (kernels that read the sums).
#define THC_DEFINE_LAUNCH_TILES(S, D, T)      \
  THC_DEFINE_LAUNCH_TILE(kSmallTile, S, D, T) \
  THC_DEFINE_LAUNCH_TILE(kLargeTile, S, D, T)
#define THC_DEFINE_LAUNCH_TILES_PER_GRAD_TYPE(S, D) \
  THC_DEFINE_LAUNCH_TILES(S, D, float)              \
  THC_DEFINE_LAUNCH_TILES(S, D, __half)             \
  THC_DEFINE_LAUNCH_TILES(S, D, __nv_bfloat16)
#define THC_DEFINE_LAUNCH_TILES_PER_SUM_LANE(S, D) \
  THC_DEFINE_LAUNCH_TILES(S, D, uint8_t)           \
  THC_DEFINE_LAUNCH_TILES(S, D, uint16_t)          \
  THC_DEFINE_LAUNCH_TILES(S, D, uint32_t)          \
  THC_DEFINE_LAUNCH_TILES(S, D, PackedSums)

}  // namespace detail
}  // namespace cuda
}  // namespace thc
