// byteps-thc CUDA: the CPU-emulation test module (see emulate.h). tests/unit/test_cuda.py builds
//   g++ -DTHC_CUDA_EMULATE -x c++ rotate.cu encode.cu decode.cu hadamard.cu launch.cu emulate.cc
//       ../../python/binding_cuda.cc
// into a module `_thc_cuda_emu` with the same functions as byteps_thc._C.cuda, whose "device
// pointers" are host pointers. The norm with error feedback and block_scale's norms (tile
// kernels) are emulated; the one norm without error feedback (norm.cu's grid-stride kernel) and
// aggregate are not (their launchers fail).
#ifdef THC_CUDA_EMULATE
#include <pybind11/pybind11.h>

#include <cmath>

#include "kernels.cuh"

namespace thc {
namespace cuda {
namespace detail {

cudaError_t LaunchNormKernels(const NormArgs&, cudaStream_t) { return cudaErrorNotSupported; }
cudaError_t NormBegin(double* norm, uint64_t count, int* status, cudaStream_t) {
  for (uint64_t k = 0; k < count; ++k) norm[k] = 0.0;
  *status = 0;
  return cudaSuccess;
}
cudaError_t NormEnd(double* norm, uint64_t count, double block, cudaStream_t) {
  for (uint64_t k = 0; k < count; ++k) norm[k] = std::sqrt(norm[k] / block);
  return cudaSuccess;
}
cudaError_t LaunchAggregateKernel(const Code&, const AggregateArgs&, uint64_t, cudaStream_t) {
  return cudaErrorNotSupported;
}

}  // namespace detail
}  // namespace cuda
}  // namespace thc

namespace thc_python {
void RegisterCuda(pybind11::module_& m);
}

PYBIND11_MODULE(_thc_cuda_emu, m) { thc_python::RegisterCuda(m); }
#endif
