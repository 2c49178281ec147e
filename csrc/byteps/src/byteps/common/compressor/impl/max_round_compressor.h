// byteps-thc: what the THC and LHC compressors share (worker side): the plumbing of a codec
// that takes part in the max round (max_round.h).
//
// One instance per partition. MaxRoundCompressor holds the partition's binding (key, name,
// element count, fingerprint), the buffers of the norm round and of the pull, the error of the
// last Compress/Decompress and the count of skipped steps; it checks what every codec checks
// the same way (the partition's size, a gradient's size, a reply's header) with the same
// messages, naming the codec. The codecs (ThcCompressor, LhcCompressor) add their encoder and
// what their own wire format says. Nothing here aborts on a worker's input or a peer's reply.
#ifndef BYTEPS_COMPRESSOR_MAX_ROUND_COMPRESSOR_H
#define BYTEPS_COMPRESSOR_MAX_ROUND_COMPRESSOR_H

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../compressor.h"
#include "max_round.h"
#include "thc_wire.h"

namespace byteps {
namespace common {
namespace compressor {

class MaxRoundCompressor : public Compressor, public MaxRound {
 public:
  ~MaxRoundCompressor() override;

  // ---- MaxRound: the buffers and counters ----
  uint64_t fingerprint() const override { return fingerprint_; }
  uint64_t CountNonfiniteSkip() override { return ++nonfinite_skips_; }
  // Writes the partition's elements (in its dtype) as NaN, or as +inf when !nan.
  void FillNonFinite(char* out, bool nan) const override;
  thcwire::NormPush* norm_push() override { return &norm_push_; }
  char* norm_reply() override { return norm_reply_.data(); }
  size_t norm_reply_capacity() const override { return norm_reply_.size(); }
  char* receive_buffer() override { return recv_.data(); }
  size_t receive_capacity() const override { return recv_.size(); }
  std::string TakeError() override;

  uint64_t key() const { return key_; }

  // Bytes of one element of a BytePS dtype the codecs take (float16, float32, float64).
  static size_t ElementBytes(int dtype);

 protected:
  // invalid: "" or why the compressor could not be made; then Bind() fails with it.
  MaxRoundCompressor(size_t size, DataType dtype, std::string invalid);

  // Bind's first half: "" with *d the partition's elements and *again = true when bound already
  // (to this key and size), or with *again = false when the caller binds it now (then it sets
  // key_, name_, d_ and the rest); else the error.
  std::string CheckBind(uint64_t key, size_t bytes, size_t* d, bool* again) const;
  // "" when grad is the bound partition's size, else the message.
  std::string CheckGradient(const tensor_t& grad) const;
  // Compress's precondition: "" when bound and grad is the partition's size, else the message.
  std::string CheckCompress(const tensor_t& grad) const;
  // A gradient the encoder called not finite: *value NaN if x has a NaN, else +inf; *nonfinite
  // "NaN" or "Inf". x holds the partition's d_ floats.
  void ClassifyNonFinite(const float* x, double* value, std::string* nonfinite) const;
  // The max round's reply of `bytes` bytes in norm_reply(): "" with *h and *value (the max over
  // the workers) set, or the server's or the format's error. `what` names the round in messages
  // ("norm", "max-round").
  std::string CheckMaxReply(size_t bytes, const char* what, thcwire::PullHeader* h,
                            double* value) const;
  // The header of a pulled reply of `size` bytes in recv_: "" and *h, or the error. `a_codec`
  // names the codec with its article ("a THC", "an LHC").
  std::string CheckPullReply(size_t size, const char* a_codec, thcwire::PullHeader* h) const;

  std::string invalid_;  // non-empty: the compressor could not be made, Bind() fails with it
  std::string error_;    // why the last Compress/Decompress failed
  uint64_t nonfinite_skips_ = 0;
  uint64_t key_ = 0;
  std::string name_;
  size_t d_ = 0;  // elements of the partition (0 until bound)
  uint64_t fingerprint_ = 0;
  std::vector<char> send_;
  std::vector<char> recv_;
  thcwire::NormPush norm_push_{};
  std::vector<char> norm_reply_;
};

// The dtypes a codec takes: a set of BytePS dtypes and their names for the message.
struct CodecDtypes {
  std::vector<int> dtypes;
  const char* names;  // "float32, float16 and float64"
};
// "" when `dtype` is one of `ok`, else "<codec> compresses <names> tensors, not BytePS dtype N".
std::string DtypeError(const char* codec, const CodecDtypes& ok, DataType dtype);

// The registry's factory of a max-round codec C: the kwargs parsed by `parse` (errors prefixed
// "invalid <codec> compressor kwargs: "), then the dtype checked against `ok`. An invalid
// compressor still stands in, C(size, dtype, error), so that the push_pull fails with the
// message instead of the process.
template <class C, class Settings>
std::unique_ptr<Compressor> MakeMaxRoundCompressor(
    const kwargs_t& kwargs, size_t size, DataType dtype, const char* codec,
    std::string (*parse)(const thcwire::Kwargs&, Settings*), const CodecDtypes& ok) {
  Settings settings;
  std::string err = parse(kwargs, &settings);
  if (!err.empty()) {
    err = std::string("invalid ") + codec + " compressor kwargs: " + err;
  } else {
    err = DtypeError(codec, ok, dtype);
  }
  if (!err.empty()) return std::unique_ptr<Compressor>(new C(size, dtype, std::move(err)));
  return std::unique_ptr<Compressor>(new C(size, dtype, std::move(settings)));
}

}  // namespace compressor
}  // namespace common
}  // namespace byteps

#endif  // BYTEPS_COMPRESSOR_MAX_ROUND_COMPRESSOR_H
