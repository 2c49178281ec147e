// byteps-thc CUDA: the launchers each kernel-family file defines, for launch.cu (the one place
// that checks arguments, plans passes and dispatches on dtype, bits and block size).
#pragma once

#include "thc_cuda.h"

namespace thc {
namespace cuda {
namespace detail {

cudaError_t LaunchNormKernels(const NormArgs& a, cudaStream_t stream);
cudaError_t LaunchAggregateKernel(const Code& code, const AggregateArgs& a, uint64_t padded,
                                  cudaStream_t stream);

}  // namespace detail
}  // namespace cuda
}  // namespace thc
