// byteps-thc CUDA: the tile kernel shared by encode, decode and the multi-pass transform.
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
//   Src::kGrad    x = grad + residual, zero past d, signs applied     (encode, first kernel)
//   Src::kScratch fp32 workspace (between the passes of a large block)
//   Src::kSums    z = float(S) * m1 + m0 from the aggregated lanes   (decode, first kernel)
//   Dst::kScratch fp32 workspace
//   Dst::kQuant   scale, clip, stochastic rounding, packing, error e (encode, last kernel)
//   Dst::kResidual residual = sign * (w / B)                         (encode, error feedback)
//   Dst::kOut     out = sign * w, fp32 and optionally the input dtype (decode, last kernel)
#pragma once

#include <atomic>
#include <cstdint>

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

enum class Src : int { kGrad = 0, kScratch = 1, kSums = 2 };
enum class Dst : int { kScratch = 0, kQuant = 1, kResidual = 2, kOut = 3 };

// Error-feedback handling of Dst::kQuant.
constexpr int kEfNone = 0;     // no error feedback
constexpr int kEfInTile = 1;   // the tile is whole blocks: transform e here, write the residual
constexpr int kEfScratch = 2;  // large block: write e to the workspace for the passes that follow

struct TileParams {
  // tile geometry
  int log_c = 0;       // log2 of the columns of a tile (LT for a row tile)
  int lo = 0;          // the global bit of local bit log_c
  int tb = 0, te = 0;  // local bits to transform, [tb, te)
  uint32_t num_tiles = 0;
  bool first = false;  // first kernel of a chain: handles M = 0 and records a bad M
  int ef_mode = kEfNone;
  uint64_t d = 0, padded = 0, payload_bytes = 0;  // of this launch's range (a chunk)
  uint64_t j_base = 0;  // coordinate of the range's first element (signs, uniforms)
  // data
  const void* src = nullptr;       // grad (Src::kGrad), workspace, or sums
  const float* res_in = nullptr;   // residual added to grad (Src::kGrad), may be null
  float* scratch = nullptr;        // workspace (Dst::kScratch, kEfScratch)
  float* res_out = nullptr;        // residual written (Dst::kResidual, kEfInTile, M = 0)
  uint8_t* payload = nullptr;
  float* out = nullptr;
  void* out_cast = nullptr;
  int out_dtype = kFloat32;
  // code
  int bits = 4, levels = 16;
  uint32_t granularity = 30;
  double clip = 0;
  double sqrt_padded = 0, sqrt_block = 0;
  float inv_block = 1.f;
  uint32_t num_workers = 1;
  uint32_t sign_key = 0, round_key = 0;
  const double* max_norm_dev = nullptr;
  double max_norm = 0;
  const int* status = nullptr;
  int* status_out = nullptr;
  uint32_t table[256];
  float inv_gap[256];  // IG[i] = float(1 / (TBL[i+1] - TBL[i])) (binary64, rounded once)
};

template <int LT>
struct TileTraits {
  static constexpr int kTile = 1 << LT;
  // One float of padding every 32 keeps the register passes and the 8-wide groups free of bank
  // conflicts.
  static constexpr int kSmemFloats = kTile + kTile / 32;
  static constexpr size_t kSmemBytes = kSmemFloats * sizeof(float) + 256 * 8;
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

template <int LT, Src S, Dst D, typename T>
__global__ void __launch_bounds__(kThreads, 4) TileKernel(const __grid_constant__ TileParams p) {
  constexpr int kTile = 1 << LT;
  THC_DYNAMIC_SMEM(smem_raw);
  float* s = reinterpret_cast<float*>(smem_raw);
  uint32_t* tbl = reinterpret_cast<uint32_t*>(s + TileTraits<LT>::kSmemFloats);
  float* ig = reinterpret_cast<float*>(tbl + 256);

  if (p.status && *p.status) return;
  double M;
  if (!ReadMaxNorm(p.max_norm_dev, p.max_norm, &M)) {
    if (p.first && blockIdx.x == 0 && threadIdx.x == 0 && p.status_out)
      atomicOr(p.status_out, kStatusNonFiniteNorm);
    return;
  }
  const TileMap map = MakeMap<LT>(p, blockIdx.x);
  const uint32_t tid = threadIdx.x;

  // M = 0: encode sends zeros and keeps x as the residual; decode returns zeros. Only the first
  // kernel of a chain (a row tile: consecutive coordinates) acts, the others return.
  if (M == 0.0) {
    if (!p.first) return;
    if constexpr (S == Src::kGrad) {
      const T* grad = static_cast<const T*>(p.src);
      if (p.res_out) {
        for (uint32_t l = tid; l < kTile; l += kThreads) {
          const uint64_t j = map(l);
          if (j >= p.d) break;
          float x = ToFloat(grad[j]);
          if (p.res_in) x = __fadd_rn(x, p.res_in[j]);
          p.res_out[j] = x;
        }
      }
      const uint64_t b0 = (map.base * p.bits) >> 3;
      const uint64_t b1 = ((map.base + kTile) * p.bits + 7) >> 3;
      const uint64_t end = b1 < p.payload_bytes ? b1 : p.payload_bytes;
      for (uint64_t b = b0 + tid; b < end; b += kThreads) p.payload[b] = 0;
    } else {
      for (uint32_t l = tid; l < kTile; l += kThreads) {
        const uint64_t j = map(l);
        if (j >= p.d) break;
        if (p.out) p.out[j] = 0.f;
        if (p.out_cast) StoreCast(p.out_cast, j, 0.f, p.out_dtype);
      }
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
    for (uint32_t l = tid; l < kTile; l += kThreads) {
      const uint64_t j = map(l);
      float x = 0.f;
      if (j < p.d) {
        x = ToFloat(grad[j]);
        if (p.res_in) x = __fadd_rn(x, p.res_in[j]);
      }
      s[Pad(l)] = FlipSign(x, SignMask(p.sign_key, p.j_base + j));
    }
  } else if constexpr (S == Src::kScratch) {
    const float* src = static_cast<const float*>(p.src);
    for (uint32_t l = tid; l < kTile; l += kThreads) {
      const uint64_t j = map(l);
      s[Pad(l)] = j < p.padded ? src[j] : 0.f;
    }
  } else {  // Src::kSums
    const T* sums = static_cast<const T*>(p.src);
    const double G = static_cast<double>(p.granularity), Tc = p.clip;
    const float m1 = static_cast<float>(2.0 * Tc / G / static_cast<double>(p.num_workers) * M /
                                        p.sqrt_padded / p.sqrt_block);
    const float m0 = static_cast<float>(-Tc * M / p.sqrt_padded / p.sqrt_block);
    for (uint32_t l = tid; l < kTile; l += kThreads) {
      const uint64_t j = map(l);
      float z = 0.f;
      if (j < p.padded) z = __fadd_rn(__fmul_rn(__uint2float_rn(sums[j]), m1), m0);
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
  } else if constexpr (D == Dst::kResidual) {
    for (uint32_t l = tid; l < kTile; l += kThreads) {
      const uint64_t j = map(l);
      if (j < p.d) p.res_out[j] = FlipSign(__fmul_rn(s[Pad(l)], p.inv_block), SignMask(p.sign_key, p.j_base + j));
    }
  } else if constexpr (D == Dst::kOut) {
    for (uint32_t l = tid; l < kTile; l += kThreads) {
      const uint64_t j = map(l);
      if (j < p.d) {
        const float v = FlipSign(s[Pad(l)], SignMask(p.sign_key, p.j_base + j));
        if (p.out) p.out[j] = v;
        if (p.out_cast) StoreCast(p.out_cast, j, v, p.out_dtype);
      }
    }
  } else {  // Dst::kQuant
    const double G = static_cast<double>(p.granularity), Tc = p.clip;
    const float c1 = static_cast<float>(G / (2.0 * Tc) * p.sqrt_padded / M / p.sqrt_block);
    const float c0 = static_cast<float>(G / 2.0);
    const float k1 = static_cast<float>(2.0 * Tc / G * M / p.sqrt_padded * p.sqrt_block);
    const float k0 = static_cast<float>(-Tc * M / p.sqrt_padded * p.sqrt_block);
    const float gmax = static_cast<float>(p.granularity);
    const int bits = p.bits, levels = p.levels;
    for (uint32_t g8 = tid; g8 < kTile / 8; g8 += kThreads) {
      const uint32_t l = g8 * 8;  // 8 consecutive local elements = 8 consecutive coordinates
      const uint64_t j0 = map(l);
      if (j0 >= p.padded) continue;
      const uint64_t left = p.padded - j0;
      const int nvalid = left < 8 ? static_cast<int>(left) : 8;
      uint64_t word = 0;
      float e[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float y = s[Pad(l + k)];
        float t = __fadd_rn(__fmul_rn(y, c1), c0);
        t = fminf(fmaxf(t, 0.f), gmax);
        const uint32_t tk = static_cast<uint32_t>(t);
        int i = 0;  // largest i with TBL[i] <= trunc(t)
        for (int step = levels >> 1; step > 0; step >>= 1) {
          if (tbl[i + step] <= tk) i += step;
        }
        if (i > levels - 2) i = levels - 2;
        const float pr = __fmul_rn(__fsub_rn(t, __uint2float_rn(tbl[i])), ig[i]);
        const uint32_t q = static_cast<uint32_t>(i) + (Uniform(p.round_key, p.j_base + j0 + k) < pr ? 1u : 0u);
        if (k < nvalid) word |= static_cast<uint64_t>(q) << (k * bits);
        e[k] = __fsub_rn(y, __fadd_rn(__fmul_rn(__uint2float_rn(tbl[q]), k1), k0));
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
      if (p.ef_mode == kEfInTile) {
#pragma unroll
        for (int k = 0; k < 8; ++k) s[Pad(l + k)] = e[k];
      } else if (p.ef_mode == kEfScratch) {
        float4* w = reinterpret_cast<float4*>(p.scratch + j0);  // j0 % 8 == 0, nvalid == 8
        w[0] = make_float4(e[0], e[1], e[2], e[3]);
        w[1] = make_float4(e[4], e[5], e[6], e[7]);
      }
    }
    if (p.ef_mode == kEfInTile) {
      __syncthreads();
      TileFwht<LT>(s, p.tb, p.te);
      for (uint32_t l = tid; l < kTile; l += kThreads) {
        const uint64_t j = map(l);
        if (j < p.d)
          p.res_out[j] = FlipSign(__fmul_rn(s[Pad(l)], p.inv_block), SignMask(p.sign_key, p.j_base + j));
      }
    }
  }
}

// Host side: launch one tile kernel over p.num_tiles tiles (defined with the instantiations).
template <int LT, Src S, Dst D, typename T>
cudaError_t LaunchTile(const TileParams& p, cudaStream_t stream);

#ifdef THC_CUDA_EMULATE
#define THC_DEFINE_LAUNCH_TILE(LT, S, D, T)                                                     \
  template <>                                                                                 \
  cudaError_t LaunchTile<LT, S, D, T>(const TileParams& p, cudaStream_t) {                    \
    thc_emu::Launch(p.num_tiles, kThreads, TileTraits<LT>::kSmemBytes,                        \
                    [&p] { TileKernel<LT, S, D, T>(p); });                                    \
    return cudaSuccess;                                                                       \
  }
#else
// Above 48 KiB of shared memory a kernel must opt in, once per device (before any stream
// capture: the first launch on a device does it, so warm up before capturing a CUDA graph).
#define THC_DEFINE_LAUNCH_TILE(LT, S, D, T)                                                     \
  template <>                                                                                 \
  cudaError_t LaunchTile<LT, S, D, T>(const TileParams& p, cudaStream_t stream) {             \
    constexpr size_t smem = TileTraits<LT>::kSmemBytes;                                       \
    if (smem > 48 * 1024) {                                                                   \
      static std::atomic<uint64_t> opted{0};                                                  \
      int dev = 0;                                                                            \
      cudaError_t err = cudaGetDevice(&dev);                                                  \
      if (err != cudaSuccess) return err;                                                     \
      const uint64_t bit = dev < 64 ? (uint64_t{1} << dev) : 0;                               \
      if (!bit || !(opted.load(std::memory_order_acquire) & bit)) {                          \
        err = cudaFuncSetAttribute(TileKernel<LT, S, D, T>,                                   \
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);   \
        if (err != cudaSuccess) return err;                                                   \
        opted.fetch_or(bit, std::memory_order_acq_rel);                                       \
      }                                                                                       \
    }                                                                                         \
    TileKernel<LT, S, D, T><<<p.num_tiles, kThreads, smem, stream>>>(p);                      \
    return cudaGetLastError();                                                                \
  }
#endif

}  // namespace detail
}  // namespace cuda
}  // namespace thc
