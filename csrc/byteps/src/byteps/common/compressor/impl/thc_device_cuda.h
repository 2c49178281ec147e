// byteps-thc: what the CUDA devices of a THC partition share (thc_device.h): device memory
// allocated once, the partition's GPU and BytePS's two copy streams, and the text of the last
// CUDA error. CUDA workers only (not included under BYTEPS_CPU_ONLY).
#ifndef BYTEPS_COMPRESSOR_THC_DEVICE_CUDA_H
#define BYTEPS_COMPRESSOR_THC_DEVICE_CUDA_H

#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "thc_device.h"

namespace byteps {
namespace common {
namespace compressor {
namespace thcdevice {

// Device memory, the partition's GPU and its streams, and the CUDA error of the last failure.
class CudaMemory : public Device {
 public:
  CudaMemory(int gpu, void* encode_stream, void* decode_stream)
      : gpu_(gpu),
        encode_(*static_cast<cudaStream_t*>(encode_stream)),
        decode_(*static_cast<cudaStream_t*>(decode_stream)) {}
  ~CudaMemory() override {
    cudaSetDevice(gpu_);
    for (void* p : buffers_) cudaFree(p);
    for (void* p : pinned_) cudaFreeHost(p);
  }

  bool host_memory() const override { return false; }
  std::string device_error() const override { return error_; }

  uint8_t* Allocate(size_t bytes) override {
    void* p = nullptr;
    if (!Ok(cudaSetDevice(gpu_), "cudaSetDevice") ||
        !Ok(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc"))
      return nullptr;
    buffers_.push_back(p);
    return static_cast<uint8_t*>(p);
  }

  void Upload(void* dst, const void* src, size_t bytes) override {
    if (Ok(cudaSetDevice(gpu_), "cudaSetDevice") &&
        Ok(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, decode_), "cudaMemcpyAsync"))
      Ok(cudaStreamSynchronize(decode_), "cudaStreamSynchronize");
  }

 protected:
  // False (and error_ set, naming the call and the GPU) when e is not cudaSuccess.
  bool Ok(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return true;
    error_ = std::string(what) + " on GPU " + std::to_string(gpu_) + ": " + cudaGetErrorString(e);
    return false;
  }
  bool Ok(const std::string& launch_error) {
    if (launch_error.empty()) return true;
    error_ = launch_error + " (GPU " + std::to_string(gpu_) + ")";
    return false;
  }
  void* Pinned(size_t bytes) {
    void* p = nullptr;
    if (!Ok(cudaMallocHost(&p, bytes), "cudaMallocHost")) return nullptr;
    std::memset(p, 0, bytes);
    pinned_.push_back(p);
    return p;
  }

  const int gpu_;
  const cudaStream_t encode_, decode_;
  std::string error_;

 private:
  std::vector<void*> buffers_, pinned_;
};

// The CUDA kernels' device (thc_device_kernels.cc) for a partition whose geometry and dtype they
// take: blocks of one size, float32 or float16. nullptr in the libraries that do not link the
// kernels (all but the CUDA worker's torch plugin).
std::unique_ptr<Device> MakeKernelDevice(int gpu, void* encode_stream, void* decode_stream);

}  // namespace thcdevice
}  // namespace compressor
}  // namespace common
}  // namespace byteps

#endif  // BYTEPS_COMPRESSOR_THC_DEVICE_CUDA_H
