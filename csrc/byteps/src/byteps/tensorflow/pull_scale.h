// byteps-thc: the TensorFlow push_pull op's scaling of its output (patch 0092 calls it).
//
// A THC or LHC pull yields the mean over the workers, any other pull the sum (thc_stage.h,
// PullYieldsMean); the op has an `average` attr, and PushPullScale turns the two into one
// PullScale (multiply by n, divide by n, or nothing). Only the op can apply it: the tensor's
// context, which decides, is initialised when the op first runs. The scaling is TensorFlow's own
// x * m and x / n in the output's dtype: half through float, integers floor-divided.
// Header-only: the TF plugin compiles BytePS's sources and ops.cc, none of ours.
#ifndef BYTEPS_TENSORFLOW_PULL_SCALE_H
#define BYTEPS_TENSORFLOW_PULL_SCALE_H

#include <cstdint>
#include <type_traits>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"

#if HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "../common/common.h"  // CPU_DEVICE_ID
#include "../common/thc_stage.h"

namespace byteps {
namespace tensorflow {

// x[i] = x[i] * multiply / divide in T, in place (integers: the floor of the quotient; n > 0).
template <typename T>
void ScaleValues(T* x, int64_t count, const common::PullScale& s) {
  const T m = static_cast<T>(s.multiply), n = static_cast<T>(s.divide);
  for (int64_t i = 0; i < count; ++i) {
    T v = x[i];
    if (s.multiply != 1) v = static_cast<T>(v * m);
    if (s.divide != 1) {
      if constexpr (std::is_integral<T>::value) {
        T q = static_cast<T>(v / n);
        v = (q * n != v && v < 0) ? static_cast<T>(q - 1) : q;  // floor: n > 0
      } else {
        v = static_cast<T>(v / n);
      }
    }
    x[i] = v;
  }
}

// The scale on `count` values of `dtype` in host memory; an error names a dtype it cannot scale.
inline ::tensorflow::Status ScaleHost(void* data, int64_t count, ::tensorflow::DataType dtype,
                                      const common::PullScale& s) {
  switch (dtype) {
    case ::tensorflow::DT_FLOAT: ScaleValues(static_cast<float*>(data), count, s); break;
    case ::tensorflow::DT_DOUBLE: ScaleValues(static_cast<double*>(data), count, s); break;
    case ::tensorflow::DT_HALF: ScaleValues(static_cast<Eigen::half*>(data), count, s); break;
    case ::tensorflow::DT_INT32: ScaleValues(static_cast<int32_t*>(data), count, s); break;
    case ::tensorflow::DT_INT64: ScaleValues(static_cast<int64_t*>(data), count, s); break;
    default:  // the op's attr T admits no other dtype
      return ::tensorflow::errors::InvalidArgument(
          "push_pull cannot scale a tensor of dtype ", ::tensorflow::DataTypeString(dtype),
          " to its average: use int32, int64, float16, float32 or float64");
  }
  return absl::OkStatus();
}

// The scale on the op's output 0, on `device` (CPU_DEVICE_ID or a GPU).
inline ::tensorflow::Status ScaleOutput(::tensorflow::OpKernelContext* context, int device,
                                        const common::PullScale& s) {
  if (s.identity()) return absl::OkStatus();
  ::tensorflow::Tensor* out = context->mutable_output(0);
  const auto bytes = out->tensor_data();
  void* data = const_cast<char*>(bytes.data());
#if HAVE_CUDA
  if (device != CPU_DEVICE_ID) {  // untested here: a host round trip keeps it correct
    std::vector<char> host(bytes.size());
    cudaMemcpy(host.data(), data, host.size(), cudaMemcpyDeviceToHost);
    auto st = ScaleHost(host.data(), out->NumElements(), out->dtype(), s);
    cudaMemcpy(data, host.data(), host.size(), cudaMemcpyHostToDevice);
    return st;
  }
#endif
  (void)device;
  return ScaleHost(data, out->NumElements(), out->dtype(), s);
}

}  // namespace tensorflow
}  // namespace byteps

#endif  // BYTEPS_TENSORFLOW_PULL_SCALE_H
