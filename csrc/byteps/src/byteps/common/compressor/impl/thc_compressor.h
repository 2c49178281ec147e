// byteps-thc: THC in BytePS's compressor registry (worker side), name "thc".
//
// One instance per partition (BytePS creates one per key). It owns the partition's codec, on the
// partition's device (thc_device.h: the CPU core on the host by default; it keeps THC's own
// error-feedback residual, so BytePS's EF decorator is never stacked on it), and the buffers the
// pipeline needs:
//   THC_NORM stage (common/thc_stage.cc): Bind() the key, LocalNorm(), the max-norm round;
//   COMPRESS: Compress() = header + thc::Encoder::Encode with the max norm;
//   PULL:     into ReceiveBuffer() (the integer sums can be larger than the partition's bytes);
//   DECOMPRESS: Decompress() = thc::DecodePacked (the sums packed in SumBits bits each) of the
//               sum, n folded into its last scale (BytePS's pull returns sums; push_pull with
//               average=True divides by n).
// Nothing here aborts on a worker's input or a peer's reply: a call that fails says why (Bind,
// LocalNorm, ParseNormReply return the message; Compress and Decompress leave it for TakeError),
// and the stages (common/thc_stage.cc) fail the push_pull with it (common/failure.h). The
// plumbing LHC's compressor shares (buffers, checks, registration) is max_round_compressor.h.
#ifndef BYTEPS_COMPRESSOR_THC_COMPRESSOR_H
#define BYTEPS_COMPRESSOR_THC_COMPRESSOR_H

#include <memory>
#include <string>
#include <vector>

#include "max_round_compressor.h"
#include "thc_device.h"
#include "thc_wire.h"

namespace byteps {
namespace common {
namespace compressor {

class ThcCompressor : public MaxRoundCompressor {
 public:
  ThcCompressor(size_t size, DataType dtype, thcwire::ThcSettings settings);
  // A compressor that could not be made (invalid kwargs, a dtype THC does not take): Bind()
  // returns `error`, so the push_pull fails with it instead of the process.
  ThcCompressor(size_t size, DataType dtype, std::string error);
  ~ThcCompressor() override;

  // On failure: the 16-byte header alone (the server then fails the round for every worker, so
  // nobody waits for this one), and TakeError() says why.
  tensor_t Compress(tensor_t grad) override;
  // On failure (the server's error, a malformed reply): nothing decoded, TakeError() says why.
  tensor_t Decompress(tensor_t compressed) override;

  // ---- THC_NORM stage (MaxRound) ----
  // Binds the partition on first use: its BytePS key (mixed into the seed), its length in bytes,
  // this worker's rank (the rounding stream) and the partition's name (for messages).
  // Returns "" or an error message. Later calls must agree.
  std::string Bind(uint64_t key, size_t bytes, uint32_t rank, const std::string& name) override;
  bool bound() const override { return bound_; }
  // ||grad + residual||_2 of the partition (it rotates the gradient with error feedback, and
  // Compress() reuses that); "" or what went wrong, in words. A NaN in the gradient gives a NaN
  // norm, an Inf (or a rotation that overflows float32) +inf, and *nonfinite then says which
  // ("" for a finite norm). Nothing of the encoder's state (residual, step) changes.
  std::string LocalNorm(tensor_t grad, double* norm, std::string* nonfinite) override;
  void set_max_norm(double m) override { max_norm_ = m; }
  double max_norm() const { return max_norm_; }
  bool nonfinite_error() const override { return settings_.nonfinite_error; }
  // Checks a norm-round reply; "" and *max_norm set, or the server's/the format's error.
  std::string ParseNormReply(size_t bytes, double* max_norm) const override;

  const thcwire::ThcSettings& settings() const { return settings_; }

  // ---- the device stages (thc_device.h) ----
  // Before Bind(): the partition's codec runs on `device` (default: the host's CPU core). When
  // its memory is not the host's, Compress() leaves the payload on the device and Decompress()
  // reads the sums there; the plan's copies between them are these:
  void UseDevice(std::unique_ptr<thcdevice::Device> device);
  bool copies() const { return device_ && !device_->host_memory(); }
  const char* device_name() const { return device_ ? device_->name() : "host"; }
  struct Copy {
    void* dst = nullptr;
    const void* src = nullptr;
    size_t bytes = 0;  // 0: nothing to copy
  };
  // COPYD2H: the payload of the last successful Compress() into the push buffer, after the
  // header that Compress() wrote; nothing after a failed one (its header-only push goes out).
  Copy PayloadCopy();
  // After COPYD2H (which waited for the device): "" or what the device found during the encode
  // (a CUDA device records it on the device); the caller then fails the partition and pushes
  // the header alone.
  std::string AfterPayloadCopy();
  // A skipped step's NaN/+inf result, written where the decode would write it (the device's
  // memory with copies()).
  void FillNonFinite(char* out, bool nan) const override;
  // COPYH2D: checks the pulled reply of `bytes` bytes (a failure is kept for Decompress() to
  // report) and returns the copy of its packed sums to the device; nothing for a failed reply.
  Copy SumsCopy(size_t bytes);
  // What the copies carry for this partition with n workers (the plan's log line).
  size_t payload_bytes() const { return geo_.payload_bytes; }
  size_t sums_bytes(uint32_t num_workers) const;

 private:
  std::string EncodeError(thc::Status st) const;
  // "" when the pulled reply of `bytes` bytes in recv_ is this partition's sums (*h its header),
  // else what is wrong with it or the server's error.
  std::string CheckReply(size_t bytes, thcwire::PullHeader* h) const;

  thcwire::ThcSettings settings_;
  thc::Config cfg_;  // the partition's (seed mixed with the key)
  std::unique_ptr<thcdevice::Device> device_;
  thc::Geometry geo_{};
  bool bound_ = false;
  uint8_t* payload_dev_ = nullptr;  // with copies(): the payload and the sums on the device
  uint8_t* sums_dev_ = nullptr;
  bool payload_ready_ = false;  // Compress() succeeded and PayloadCopy() has not run
  std::string reply_error_;     // SumsCopy()'s check of the reply, for Decompress()
  thcwire::PullHeader reply_{};
  double max_norm_ = 0.0;
};

}  // namespace compressor
}  // namespace common
}  // namespace byteps

#endif  // BYTEPS_COMPRESSOR_THC_COMPRESSOR_H
