// byteps-thc CUDA: device helpers every kernel family shares (random streams, dtype loads,
// the exact float operations of docs/ALGORITHM.md). Not part of the public interface.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/hash.h"
#include "thc_cuda.h"

#ifdef THC_CUDA_EMULATE
#include "emulate.h"  // CPU emulation for tests without a GPU (never in the real build)
#else
#define THC_DYNAMIC_SMEM(name) extern __shared__ float4 name[]
#endif

namespace thc {
namespace cuda {
namespace detail {

// -- random streams (docs/ALGORITHM.md, "Random streams") -------------------------------------
// The hashes are the CPU cores' (common/hash.h: host and device under nvcc).
using ::codec::Hash32;
using ::codec::SplitMix64;
__host__ __device__ inline uint32_t SignKey(uint64_t seed) {
  return static_cast<uint32_t>(SplitMix64(seed));
}
__host__ __device__ inline uint32_t RoundKey(uint64_t seed, uint32_t rank, uint64_t step) {
  return static_cast<uint32_t>(SplitMix64(SplitMix64(seed ^ 0x5448435F524E4421ull) ^
                                          SplitMix64(::codec::RankStep(rank, step))));
}

// Sign bit (0 or 0x80000000) of padded coordinate j.
__device__ __forceinline__ uint32_t SignMask(uint32_t sign_key, uint64_t j) {
  const uint32_t word = Hash32(sign_key ^ static_cast<uint32_t>(j >> 5));
  return ((word >> (static_cast<uint32_t>(j) & 31u)) & 1u) << 31;
}
__device__ __forceinline__ float FlipSign(float v, uint32_t mask) {
  return __uint_as_float(__float_as_uint(v) ^ mask);
}
// u_j in [0, 1), an exact multiple of 2^-24.
__device__ __forceinline__ float Uniform(uint32_t round_key, uint64_t j) {
  const uint32_t h = Hash32(round_key ^ static_cast<uint32_t>(j));
  return __fmul_rn(__uint2float_rn(h >> 8), 5.9604644775390625e-08f);
}

// -- dtype loads / stores (exact widening to binary32) ----------------------------------------
__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

__device__ __forceinline__ void StoreCast(void* out, uint64_t j, float v, int dtype) {
  if (dtype == kFloat16) {
    static_cast<__half*>(out)[j] = __float2half_rn(v);
  } else if (dtype == kBFloat16) {
    static_cast<__nv_bfloat16*>(out)[j] = __float2bfloat16_rn(v);
  } else {
    static_cast<float*>(out)[j] = v;
  }
}

}  // namespace detail
}  // namespace cuda
}  // namespace thc
