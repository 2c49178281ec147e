// byteps-thc CUDA: the CPU-emulation test module (see emulate.h). tests/unit/test_cuda.py builds
//   g++ -DTHC_CUDA_EMULATE -x c++ encode.cu decode.cu hadamard.cu launch.cu emulate.cc
//       ../../python/binding_cuda.cc
// into a module `_thc_cuda_emu` with the same functions as byteps_thc._C.cuda, whose "device
// pointers" are host pointers. Norm and aggregate are not emulated (their launchers fail).
#ifdef THC_CUDA_EMULATE
#include <pybind11/pybind11.h>

#include "kernels.cuh"

namespace thc {
namespace cuda {
namespace detail {

cudaError_t LaunchNormKernels(const NormArgs&, cudaStream_t) { return cudaErrorNotSupported; }
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
