// byteps-thc CUDA: the launchers each kernel-family file defines, for launch.cu (the one place
// that checks arguments, plans passes and dispatches on dtype, bits and block size).
#pragma once

#include "thc_cuda.h"

namespace thc {
namespace cuda {
namespace detail {

// The norm without error feedback: clears status and norm, sum of grad^2, sqrt (norm.cu).
cudaError_t LaunchNormKernels(const NormArgs& a, cudaStream_t stream);
// The norm with error feedback (and with block_scale) runs tile kernels between these two
// (norm.cu): clear norm[0, count) and *status; then norm[k] = sqrt(norm[k] / block).
cudaError_t NormBegin(double* norm, uint64_t count, int* status, cudaStream_t stream);
cudaError_t NormEnd(double* norm, uint64_t count, double block, cudaStream_t stream);
cudaError_t LaunchAggregateKernel(const Code& code, const AggregateArgs& a, uint64_t padded,
                                  cudaStream_t stream);

}  // namespace detail
}  // namespace cuda
}  // namespace thc
