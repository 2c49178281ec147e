// byteps-thc CUDA: the norm family (docs/ALGORITHM.md, "Norm"). Without error feedback
// ||grad||_2, accumulated in binary64 (any order: not bit-exact), and the non-finite flag. With
// error feedback (or with block_scale, one norm per block) the tile kernels (rotate.cu) accumulate
// the sums of y^2 between NormBegin and NormEnd, both here.
#include "common.cuh"
#include "kernels.cuh"

namespace thc {
namespace cuda {
namespace detail {

constexpr int kNormThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kNormThreads)
    NormKernel(const T* __restrict__ grad, uint64_t d, double* __restrict__ acc,
               int* __restrict__ status) {
  double sum = 0.0;
  bool bad = false;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t j = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < d;
       j += stride) {
    const float x = ToFloat(grad[j]);
    bad |= !isfinite(x);
    const double v = static_cast<double>(x);
    sum = __dadd_rn(sum, __dmul_rn(v, v));
  }
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, off);
  __shared__ double warp_sums[kNormThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_sums[warp] = sum;
  const int any_bad = __syncthreads_or(bad);
  if (warp == 0) {
    sum = lane < kNormThreads / 32 ? warp_sums[lane] : 0.0;
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, off);
    if (lane == 0) {
      atomicAdd(acc, sum);
      if (any_bad) atomicOr(status, kStatusNonFiniteInput);
    }
  }
}

__global__ void NormFinalize(double* norm, uint64_t count, double block) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t k = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < count;
       k += stride)
    norm[k] = sqrt(norm[k] / block);
}

template <typename T>
cudaError_t LaunchNormT(const NormArgs& a, int blocks, cudaStream_t stream) {
  NormKernel<T>
      <<<blocks, kNormThreads, 0, stream>>>(static_cast<const T*>(a.grad), a.d, a.norm, a.status);
  return cudaGetLastError();
}

cudaError_t NormBegin(double* norm, uint64_t count, int* status, cudaStream_t stream) {
  cudaError_t err = cudaMemsetAsync(status, 0, sizeof(int), stream);
  if (err == cudaSuccess) err = cudaMemsetAsync(norm, 0, count * sizeof(double), stream);
  return err;
}

cudaError_t NormEnd(double* norm, uint64_t count, double block, cudaStream_t stream) {
  const uint64_t want = (count + kNormThreads - 1) / kNormThreads;
  const int blocks = static_cast<int>(want < 1024 ? (want > 0 ? want : 1) : 1024);
  NormFinalize<<<blocks, kNormThreads, 0, stream>>>(norm, count, block);
  return cudaGetLastError();
}

cudaError_t LaunchNormKernels(const NormArgs& a, cudaStream_t stream) {
  cudaError_t err = NormBegin(a.norm, 1, a.status, stream);
  if (err != cudaSuccess) return err;
  // Enough blocks to fill any current GPU a few times over; each then loops.
  const uint64_t want = (a.d + kNormThreads * 8 - 1) / (kNormThreads * 8);
  const int blocks = static_cast<int>(want < 2048 ? (want > 0 ? want : 1) : 2048);
  switch (a.dtype) {
    case kFloat16: err = LaunchNormT<__half>(a, blocks, stream); break;
    case kBFloat16: err = LaunchNormT<__nv_bfloat16>(a, blocks, stream); break;
    default: err = LaunchNormT<float>(a, blocks, stream); break;
  }
  if (err != cudaSuccess) return err;
  return NormEnd(a.norm, 1, 1.0, stream);
}

}  // namespace detail
}  // namespace cuda
}  // namespace thc
