// byteps-thc-build: worker
// byteps-thc: MakeCudaDevice (thc_device.h), and the device it falls back to: the CPU codec core
// on host copies of a partition that the kernels do not lay out (the CPU core's default tiling
// with a smaller last block; float64) or where they are not linked (the TensorFlow and MXNet
// plugins): the gradient is copied to the host once a step (in Norm; Encode reuses it), the
// payload goes to the device and the plan's copies move it as for the kernels, and the decode's
// result is copied to the GPU.
#include "thc_device.h"

#ifndef BYTEPS_CPU_ONLY
#include "thc_device_cuda.h"

namespace byteps {
namespace common {
namespace compressor {
namespace thcdevice {
namespace {

class StagedDevice : public CudaMemory {
 public:
  using CudaMemory::CudaMemory;
  const char* name() const override { return "cuda, host codec"; }

  std::string Bind(const thc::Config& cfg, size_t d, DataType dtype, uint32_t rank,
                   bool error_feedback, int threads) override {
    host_codec_ = MakeHostDevice(/*host_memory=*/true);
    bytes_ = d * (dtype == BYTEPS_FLOAT16 ? 2 : dtype == BYTEPS_FLOAT64 ? 8 : 4);
    const thc::Geometry geo = thc::MakeGeometry(cfg, d);
    grad_.assign(bytes_, 0);
    payload_.assign(geo.payload_bytes, 0);
    sums_.assign(geo.padded * sizeof(uint32_t), 0);
    return host_codec_->Bind(cfg, d, dtype, rank, error_feedback, threads);
  }

  thc::Status Norm(const void* grad, double* norm) override {
    if (!Ok(cudaSetDevice(gpu_), "cudaSetDevice") ||
        !Ok(cudaMemcpyAsync(grad_.data(), grad, bytes_, cudaMemcpyDeviceToHost, encode_),
            "cudaMemcpyAsync") ||
        !Ok(cudaStreamSynchronize(encode_), "cudaStreamSynchronize"))
      return thc::Status::kBadArgument;
    return host_codec_->Norm(grad_.data(), norm);
  }

  thc::Status Encode(const void* /*grad: the copy Norm made*/, double max_norm,
                     uint8_t* payload) override {
    thc::Status st = host_codec_->Encode(grad_.data(), max_norm, payload_.data());
    if (st != thc::Status::kOk) return st;
    if (!Ok(cudaSetDevice(gpu_), "cudaSetDevice") ||
        !Ok(cudaMemcpyAsync(payload, payload_.data(), payload_.size(), cudaMemcpyHostToDevice,
                            encode_),
            "cudaMemcpyAsync") ||
        !Ok(cudaStreamSynchronize(encode_), "cudaStreamSynchronize"))
      return thc::Status::kBadArgument;
    return st;
  }

  thc::Status Decode(const uint8_t* sums, size_t bytes, int sum_bits, uint32_t num_workers,
                     double max_norm, void* out) override {
    if (bytes > sums_.size()) return thc::Status::kBadArgument;
    if (!Ok(cudaSetDevice(gpu_), "cudaSetDevice") ||
        !Ok(cudaMemcpyAsync(sums_.data(), sums, bytes, cudaMemcpyDeviceToHost, decode_),
            "cudaMemcpyAsync") ||
        !Ok(cudaStreamSynchronize(decode_), "cudaStreamSynchronize"))
      return thc::Status::kBadArgument;
    thc::Status st =
        host_codec_->Decode(sums_.data(), bytes, sum_bits, num_workers, max_norm, grad_.data());
    if (st != thc::Status::kOk) return st;
    Upload(out, grad_.data(), bytes_);
    return error_.empty() ? st : thc::Status::kBadArgument;
  }

 private:
  std::unique_ptr<Device> host_codec_;
  size_t bytes_ = 0;
  std::vector<uint8_t> grad_, payload_, sums_;  // host copies
};

}  // namespace

// Replaced by thc_device_kernels.cc's in the library that links the kernels.
__attribute__((weak)) std::unique_ptr<Device> MakeKernelDevice(int, void*, void*) {
  return nullptr;
}

std::unique_ptr<Device> MakeCudaDevice(const thc::Config& cfg, size_t d, DataType dtype, int gpu,
                                       void* encode_stream, void* decode_stream,
                                       std::string* error) {
  error->clear();
  std::unique_ptr<Device> device;
  if ((dtype == BYTEPS_FLOAT32 || dtype == BYTEPS_FLOAT16) && !cfg.block_scale &&
      thc::MakeGeometry(cfg, d).tail_block == 0)
    device = MakeKernelDevice(gpu, encode_stream, decode_stream);
  if (!device) device.reset(new StagedDevice(gpu, encode_stream, decode_stream));
  return device;
}

}  // namespace thcdevice
}  // namespace compressor
}  // namespace common
}  // namespace byteps

#else  // a CPU-only worker has no GPU tensors

namespace byteps {
namespace common {
namespace compressor {
namespace thcdevice {

std::unique_ptr<Device> MakeCudaDevice(const thc::Config&, size_t, DataType, int, void*, void*,
                                       std::string* error) {
  *error = "this worker is built CPU-only (BYTEPS_THC_CPU_ONLY=1): it has no GPU";
  return nullptr;
}

}  // namespace thcdevice
}  // namespace compressor
}  // namespace common
}  // namespace byteps

#endif  // BYTEPS_CPU_ONLY
