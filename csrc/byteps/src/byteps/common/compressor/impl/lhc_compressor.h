// byteps-thc: LHC in BytePS's compressor registry (worker side), name "lhc".
//
// One instance per partition (BytePS creates one per key). It owns the partition's lhc::Encoder
// (which keeps LHC's own top-k residual, so BytePS's EF decorator is never stacked on it) and the
// buffers the pipeline needs:
//   THC_NORM stage (common/thc_stage.cc, max_round.h): Bind() the key, LocalNorm() = max |v| of
//             gradient + residual, THC's max round gives the max over the workers and n;
//   COMPRESS: Compress() = lhc::Encoder::Encode at the shared scale (bitmap + int32 sketch);
//   PULL:     into receive_buffer() (thcwire::PullHeader + the aggregated payload);
//   DECOMPRESS: Decompress() = lhc::Decode (peeling), the exact mean, times n (BytePS's pull
//             returns sums; push_pull with average=True divides by n again).
// A peeling failure is the same on every worker (the same sums): the exact fallback round
// (lhc_wire.h) sends each worker's values at the unresolved indices and completes the decode;
// it is counted and logged, never lossy.
// Nothing here aborts on a worker's input or a peer's reply. The plumbing THC's compressor
// shares (buffers, checks, registration) is max_round_compressor.h.
#ifndef BYTEPS_COMPRESSOR_LHC_COMPRESSOR_H
#define BYTEPS_COMPRESSOR_LHC_COMPRESSOR_H

#include <memory>
#include <string>
#include <vector>

#include "lhc_wire.h"
#include "max_round_compressor.h"

namespace byteps {
namespace common {
namespace compressor {

class LhcCompressor : public MaxRoundCompressor {
 public:
  LhcCompressor(size_t size, DataType dtype, lhcwire::LhcSettings settings);
  // A compressor that could not be made: Bind() returns `error` (the push_pull fails with it).
  LhcCompressor(size_t size, DataType dtype, std::string error);
  ~LhcCompressor() override;

  // On failure: the 24-byte header alone with count 0 (the server fails the round for every
  // worker), and TakeError() says why.
  tensor_t Compress(tensor_t grad) override;
  // On failure (the server's error, a malformed reply, unresolved indices): nothing returned,
  // TakeError() says why.
  tensor_t Decompress(tensor_t compressed) override;

  // ---- MaxRound ----
  const char* codec_name() const override { return "LHC"; }
  std::string Bind(uint64_t key, size_t bytes, uint32_t rank, const std::string& name) override;
  bool bound() const override { return encoder_ != nullptr; }
  std::string LocalNorm(tensor_t grad, double* max_abs, std::string* nonfinite) override;
  void set_max_norm(double m) override { max_abs_ = m; }
  bool nonfinite_error() const override { return settings_.nonfinite_error; }
  // Also takes n, the number of workers, from the reply (the scale needs it).
  std::string ParseNormReply(size_t bytes, double* max_abs) const override;

  // ---- the exact fallback round (lhcwire::kLhcFallbackRequest, common/lhc_stage.cc) ----
  // True after a Decompress whose peeling left indices unresolved: the push_pull is not done
  // yet; the resolved values are in the output, the push below holds this worker's values at
  // the unresolved indices.
  bool fallback_pending() const { return fallback_pending_; }
  char* fallback_push() { return fb_push_.data(); }
  size_t fallback_push_bytes() const { return fb_push_.size(); }
  char* fallback_reply() { return fb_reply_.data(); }
  size_t fallback_reply_capacity() const { return fb_reply_.size(); }
  // Checks the round's reply and writes the exact values at the unresolved indices (times n,
  // as Decompress); "" or what went wrong. Clears the pending state either way.
  std::string CompleteFallback(size_t bytes);
  // Fallback rounds of this partition so far, and the indices they carried.
  uint64_t fallback_rounds() const { return fallback_rounds_; }
  uint64_t fallback_indices() const { return fallback_indices_; }

 private:
  lhcwire::LhcSettings settings_;
  bool fallback_pending_ = false;
  uint64_t fallback_rounds_ = 0;
  uint64_t fallback_indices_ = 0;
  std::vector<uint32_t> fb_idx_;  // the unresolved indices, ascending
  float* fb_out_ = nullptr;       // where Decompress wrote the resolved values
  uint32_t fb_n_ = 0;
  std::vector<char> fb_push_;
  std::vector<char> fb_reply_;
  lhc::Geometry geo_;
  uint64_t pseed_ = 0;
  std::unique_ptr<lhc::Encoder> encoder_;
  double max_abs_ = 0.0;
  mutable uint32_t num_workers_ = 0;  // from the max round's reply
};

}  // namespace compressor
}  // namespace common
}  // namespace byteps

#endif  // BYTEPS_COMPRESSOR_LHC_COMPRESSOR_H
