// byteps-thc: what the worker's max round (common/thc_stage.cc) needs of a compressor.
//
// THC and LHC both fix a partition's scale from one value per worker reduced by max over the
// workers before they encode: THC the norm ||grad + residual||_2, LHC max |grad + residual|. The
// round is one mechanism for both: the THC_NORM stage binds the partition, asks LocalNorm(),
// pushes NormPush (fingerprint, value) under the partition's key with thcwire::kThcNormRequest,
// pulls the max (the server's NormPush, thc_server.cc) and hands it back by set_max_norm(); a NaN
// or Inf skips the step on every worker (or fails it), exactly as for THC. The compressors
// (ThcCompressor, LhcCompressor) implement this interface beside BytePS's Compressor, through
// their common base MaxRoundCompressor (max_round_compressor.h), and the stage reaches them by
// dynamic_cast.
#ifndef BYTEPS_COMPRESSOR_MAX_ROUND_H
#define BYTEPS_COMPRESSOR_MAX_ROUND_H

#include <cstddef>
#include <cstdint>
#include <string>

#include "../common.h"
#include "thc_wire.h"

namespace byteps {
namespace common {
namespace compressor {

class MaxRound {
 public:
  virtual ~MaxRound() = default;

  // The codec's name in messages ("THC", "LHC").
  virtual const char* codec_name() const { return "THC"; }
  // Binds the partition on first use (key, bytes, rank, name); "" or the error. Later calls must
  // agree.
  virtual std::string Bind(uint64_t key, size_t bytes, uint32_t rank, const std::string& name) = 0;
  virtual bool bound() const = 0;
  // This worker's value for the max round; *nonfinite names what the gradient had ("NaN", "Inf")
  // when the value is not finite. "" or the error.
  virtual std::string LocalNorm(tensor_t grad, double* norm, std::string* nonfinite) = 0;
  virtual void set_max_norm(double m) = 0;
  virtual uint64_t fingerprint() const = 0;
  virtual bool nonfinite_error() const = 0;
  virtual uint64_t CountNonfiniteSkip() = 0;
  virtual void FillNonFinite(char* out, bool nan) const = 0;
  virtual thcwire::NormPush* norm_push() = 0;
  virtual char* norm_reply() = 0;
  virtual size_t norm_reply_capacity() const = 0;
  // Checks the round's reply: "" and *max_norm set, or the server's / the format's error.
  virtual std::string ParseNormReply(size_t bytes, double* max_norm) const = 0;
  // The PULL stage's buffer (a reply can be larger than the partition's bytes).
  virtual char* receive_buffer() = 0;
  virtual size_t receive_capacity() const = 0;
  // Why the last Compress/Decompress failed ("" if it did not); clears it.
  virtual std::string TakeError() = 0;
};

}  // namespace compressor
}  // namespace common
}  // namespace byteps

#endif  // BYTEPS_COMPRESSOR_MAX_ROUND_H
