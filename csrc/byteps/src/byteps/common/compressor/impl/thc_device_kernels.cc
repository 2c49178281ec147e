// byteps-thc-build: torch
// byteps-thc: the CUDA kernels' device of a THC partition (thc_device.h), in the CUDA worker's
// torch plugin only: the library that the kernels (csrc/thc/cuda, compiled by nvcc) are linked
// into (byteps_thc_build.extra_objects).
//
// The kernels run on the partition's GPU. Its workspaces (the rotated residual, the kernels'
// scratch, the norm, two status words and their pinned host copies) are allocated once, at
// Bind. Norm and Encode are enqueued on BytePS's device-to-host copy stream, so that the
// payload's COPYD2H, enqueued after the encode on the same stream, follows it, and the copy's
// wait for the stream is the only wait of the encode; the encode's status word travels up with
// it (EncodeStatus). Norm waits for its 8 bytes (the norm round needs them on the host). Decode
// is enqueued on the host-to-device stream after the sums' copy and waits for itself: the
// output must be complete when the partition finishes. Every error the kernels flag on the
// device becomes the Status the CPU core would return; a CUDA error becomes device_error().
#ifndef BYTEPS_CPU_ONLY
#include <cmath>

#include "thc/cuda/thc_cuda.h"
#include "thc_device_cuda.h"

namespace byteps {
namespace common {
namespace compressor {
namespace thcdevice {
namespace {

namespace tc = thc::cuda;

class CudaDevice : public CudaMemory {
 public:
  using CudaMemory::CudaMemory;
  const char* name() const override { return "cuda"; }

  std::string Bind(const thc::Config& cfg, size_t d, DataType dtype, uint32_t rank,
                   bool error_feedback, int /*threads*/) override {
    const thc::Geometry geo = thc::MakeGeometry(cfg, d);
    code_.bits = cfg.bits;
    code_.granularity = cfg.granularity;
    code_.clip = cfg.clip;
    code_.seed = cfg.seed;
    code_.rotation_block = geo.block;  // the core's block: the kernels lay the partition out alike
    if (cfg.table.size() != (size_t{1} << cfg.bits)) return "the table does not have 2^bits levels";
    for (size_t i = 0; i < cfg.table.size(); ++i) code_.table[i] = cfg.table[i];
    std::string err = tc::ValidateCode(code_);
    if (!err.empty()) return err;
    if (tc::MakeGeometry(code_, d).padded != geo.padded) return "the kernels' geometry differs";
    dtype_ = dtype == BYTEPS_FLOAT16 ? tc::kFloat16 : tc::kFloat32;
    d_ = d;
    rank_ = rank;
    const size_t ws = tc::WorkspaceFloats(code_, d) * sizeof(float);
    if (ws && !(workspace_ = reinterpret_cast<float*>(Allocate(ws)))) return error_;
    if (error_feedback) {
      if (!(residual_ = reinterpret_cast<float*>(Allocate(geo.padded * sizeof(float)))))
        return error_;
      if (!Ok(cudaMemset(residual_, 0, geo.padded * sizeof(float)), "cudaMemset")) return error_;
    }
    if (!(words_ = reinterpret_cast<Words*>(Allocate(sizeof(Words))))) return error_;
    if (!Ok(cudaMemset(words_, 0, sizeof(Words)), "cudaMemset")) return error_;
    if (!(host_ = static_cast<Words*>(Pinned(sizeof(Words))))) return error_;
    return "";
  }

  thc::Status Norm(const void* grad, double* norm) override {
    if (!Launch(grad, residual_, &words_->norm)) return thc::Status::kBadArgument;
    if (!Read(encode_)) return thc::Status::kBadArgument;
    const int flags = host_->encode_status;
    if (flags & tc::kStatusNonFiniteInput) {
      // NaN or only Infs decides the agreed norm (and the result): the plain sum of squares
      // (no residual, no rotation) is NaN exactly when some value is
      if (residual_ && (!Launch(grad, nullptr, &words_->norm) || !Read(encode_)))
        return thc::Status::kBadArgument;
      *norm = std::isnan(host_->norm) ? std::nan("") : HUGE_VAL;
      return thc::Status::kNonFinite;
    }
    if (flags & tc::kStatusOverflow) return thc::Status::kOverflow;
    *norm = host_->norm;
    return thc::Status::kOk;
  }

  thc::Status Encode(const void* grad, double max_norm, uint8_t* payload) override {
    tc::EncodeArgs a;
    a.grad = grad;
    a.dtype = dtype_;
    a.residual = residual_;
    a.d = d_;
    a.rank = rank_;
    a.step = step_;
    a.max_norm = max_norm;
    a.payload = payload;
    a.workspace = workspace_;
    a.status = &words_->encode_status;  // as the norm left it (clear: it succeeded)
    a.status_out = &words_->encode_status;
    if (!Ok(cudaSetDevice(gpu_), "cudaSetDevice") || !Ok(tc::LaunchEncode(code_, a, encode_)) ||
        !Ok(cudaMemcpyAsync(&host_->encode_status, &words_->encode_status, sizeof(int),
                            cudaMemcpyDeviceToHost, encode_),
            "cudaMemcpyAsync"))
      return thc::Status::kBadArgument;
    return thc::Status::kOk;
  }

  thc::Status EncodeStatus() override {
    const thc::Status st = FromFlags(host_->encode_status);
    if (st == thc::Status::kOk) ++step_;  // as the core's encoder: a step that was sent
    return st;
  }

  // `bytes` were checked against the geometry by the compressor (CheckReply).
  thc::Status Decode(const uint8_t* sums, size_t /*bytes*/, int sum_bits, uint32_t num_workers,
                     double max_norm, void* out) override {
    tc::DecodeArgs a;
    a.sums = sums;
    a.sum_bits = sum_bits;
    a.num_workers = num_workers;
    a.d = d_;
    a.max_norm = max_norm;
    if (dtype_ == tc::kFloat32) {
      a.out = static_cast<float*>(out);
    } else {
      a.out_cast = out;
      a.out_dtype = dtype_;
    }
    a.workspace = workspace_;
    a.status_out = &words_->decode_status;
    if (!Ok(cudaSetDevice(gpu_), "cudaSetDevice") ||
        !Ok(cudaMemsetAsync(&words_->decode_status, 0, sizeof(int), decode_), "cudaMemsetAsync") ||
        !Ok(tc::LaunchDecode(code_, a, decode_)) ||
        !Ok(cudaMemcpyAsync(&host_->decode_status, &words_->decode_status, sizeof(int),
                            cudaMemcpyDeviceToHost, decode_),
            "cudaMemcpyAsync") ||
        !Ok(cudaStreamSynchronize(decode_), "cudaStreamSynchronize"))
      return thc::Status::kBadArgument;
    return FromFlags(host_->decode_status);
  }

 private:
  // The device words; their pinned host copies have the same layout.
  struct Words {
    double norm;
    int encode_status;  // the norm clears it, the norm and the encode flag it
    int decode_status;
  };

  static thc::Status FromFlags(int flags) {
    if (flags & (tc::kStatusNonFiniteInput | tc::kStatusNonFiniteNorm))
      return thc::Status::kNonFinite;
    return flags ? thc::Status::kOverflow : thc::Status::kOk;
  }

  bool Launch(const void* grad, const float* residual, double* norm) {
    tc::NormArgs a;
    a.grad = grad;
    a.dtype = dtype_;
    a.residual = residual;
    a.d = d_;
    a.norm = norm;
    a.workspace = workspace_;
    a.status = &words_->encode_status;
    return Ok(cudaSetDevice(gpu_), "cudaSetDevice") && Ok(tc::LaunchNorm(code_, a, encode_));
  }

  // The norm and the encode's status word to the host, waiting for `stream`.
  bool Read(cudaStream_t stream) {
    return Ok(cudaMemcpyAsync(host_, words_, sizeof(Words), cudaMemcpyDeviceToHost, stream),
              "cudaMemcpyAsync") &&
           Ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }

  tc::Code code_;
  tc::DType dtype_ = tc::kFloat32;
  size_t d_ = 0;
  uint32_t rank_ = 0;
  uint64_t step_ = 0;
  float* residual_ = nullptr;  // the rotated state r, d_pad floats; null without error feedback
  float* workspace_ = nullptr;
  Words* words_ = nullptr;
  Words* host_ = nullptr;
};

}  // namespace

std::unique_ptr<Device> MakeKernelDevice(int gpu, void* encode_stream, void* decode_stream) {
  return std::unique_ptr<Device>(new CudaDevice(gpu, encode_stream, decode_stream));
}

}  // namespace thcdevice
}  // namespace compressor
}  // namespace common
}  // namespace byteps

#endif  // !BYTEPS_CPU_ONLY
