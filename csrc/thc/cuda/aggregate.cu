// byteps-thc CUDA: the aggregate family (docs/ALGORITHM.md, "Aggregate"): unpack b-bit indices,
// look up the table, add into integer lanes. Integer arithmetic only: bit-exact.
#include "common.cuh"
#include "kernels.cuh"

namespace thc {
namespace cuda {
namespace detail {

constexpr int kAggThreads = 256;

struct AggParams {
  const uint8_t* payloads;
  uint64_t stride, padded;
  uint32_t count;
  int bits;
  bool accumulate;
  void* sums;
  uint32_t table[256];
};

// One thread: 8 consecutive coordinates (b bytes of every payload).
template <typename L>
__global__ void __launch_bounds__(kAggThreads)
    AggregateKernel(const __grid_constant__ AggParams p) {
  __shared__ uint32_t tbl[256];
  for (int i = threadIdx.x; i < 256; i += kAggThreads) tbl[i] = p.table[i];
  __syncthreads();
  L* sums = static_cast<L*>(p.sums);
  const uint64_t groups = (p.padded + 7) / 8;
  const int bits = p.bits;
  const uint32_t mask = (1u << bits) - 1u;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t g = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups;
       g += stride) {
    const uint64_t j0 = g * 8;
    const int nvalid = p.padded - j0 < 8 ? static_cast<int>(p.padded - j0) : 8;
    const int nbytes = (nvalid * bits + 7) / 8;
    uint32_t acc[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) acc[k] = (p.accumulate && k < nvalid) ? sums[j0 + k] : 0u;
    for (uint32_t w = 0; w < p.count; ++w) {
      const uint8_t* src = p.payloads + w * p.stride + g * bits;
      uint64_t word = 0;
      for (int b = 0; b < nbytes; ++b) word |= static_cast<uint64_t>(src[b]) << (8 * b);
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[k] += tbl[(word >> (k * bits)) & mask];
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      if (k < nvalid) sums[j0 + k] = static_cast<L>(acc[k]);
    }
  }
}

cudaError_t LaunchAggregateKernel(const Code& code, const AggregateArgs& a, uint64_t padded,
                                  cudaStream_t stream) {
  AggParams p;
  p.payloads = a.payloads;
  p.stride = a.stride;
  p.padded = padded;
  p.count = a.count;
  p.bits = code.bits;
  p.accumulate = a.accumulate;
  p.sums = a.sums;
  for (int i = 0; i < 256; ++i) p.table[i] = code.table[i];
  const uint64_t groups = (padded + 7) / 8;
  const uint64_t want = (groups + kAggThreads - 1) / kAggThreads;
  const int blocks = static_cast<int>(want < 4096 ? (want > 0 ? want : 1) : 4096);
  switch (a.lane_bits) {
    case 8: AggregateKernel<uint8_t><<<blocks, kAggThreads, 0, stream>>>(p); break;
    case 16: AggregateKernel<uint16_t><<<blocks, kAggThreads, 0, stream>>>(p); break;
    default: AggregateKernel<uint32_t><<<blocks, kAggThreads, 0, stream>>>(p); break;
  }
  return cudaGetLastError();
}

}  // namespace detail
}  // namespace cuda
}  // namespace thc
