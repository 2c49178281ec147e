// byteps-thc: what the THC and LHC compressors share. See max_round_compressor.h.
#include "max_round_compressor.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

namespace byteps {
namespace common {
namespace compressor {
namespace {

// The first NaN among n floats (bit test: BytePS's -Ofast may fold std::isnan to false).
bool HasNaN(const float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, x + i, 4);
    if ((b & 0x7FFFFFFFu) > 0x7F800000u) return true;
  }
  return false;
}

}  // namespace

std::string DtypeError(const char* codec, const CodecDtypes& ok, DataType dtype) {
  for (int t : ok.dtypes)
    if (t == dtype) return "";
  return std::string(codec) + " compresses " + ok.names + " tensors, not BytePS dtype " +
         std::to_string(static_cast<int>(dtype));
}

MaxRoundCompressor::MaxRoundCompressor(size_t size, DataType dtype, std::string invalid)
    : Compressor(size, dtype), invalid_(std::move(invalid)) {
  norm_reply_.resize(sizeof(thcwire::PullHeader) + thcwire::kMaxErrorBytes);
}

MaxRoundCompressor::~MaxRoundCompressor() = default;

size_t MaxRoundCompressor::ElementBytes(int dtype) {
  return dtype == BYTEPS_FLOAT64 ? 8 : dtype == BYTEPS_FLOAT16 ? 2 : 4;
}

std::string MaxRoundCompressor::TakeError() {
  std::string e;
  e.swap(error_);
  return e;
}

void MaxRoundCompressor::FillNonFinite(char* out, bool nan) const {
  if (_dtype == BYTEPS_FLOAT16) {
    const uint16_t v = nan ? 0x7E00u : 0x7C00u;
    for (size_t i = 0; i < d_; ++i) std::memcpy(out + 2 * i, &v, 2);
  } else if (_dtype == BYTEPS_FLOAT64) {
    const uint64_t v = nan ? 0x7FF8000000000000ull : 0x7FF0000000000000ull;
    for (size_t i = 0; i < d_; ++i) std::memcpy(out + 8 * i, &v, 8);
  } else {
    const uint32_t v = nan ? 0x7FC00000u : 0x7F800000u;
    for (size_t i = 0; i < d_; ++i) std::memcpy(out + 4 * i, &v, 4);
  }
}

std::string MaxRoundCompressor::CheckBind(uint64_t key, size_t bytes, size_t* d,
                                          bool* again) const {
  if (!invalid_.empty()) return invalid_;
  const size_t elem = ElementBytes(_dtype);
  if (bytes == 0 || bytes % elem) return "partition of " + std::to_string(bytes) + " bytes";
  *d = bytes / elem;
  *again = bound();
  if (*again && (key != key_ || *d != d_)) {
    return "compressor bound to key " + std::to_string(key_) + " (" + std::to_string(d_) +
           " elements) used for key " + std::to_string(key) + " (" + std::to_string(*d) + ")";
  }
  return "";
}

std::string MaxRoundCompressor::CheckGradient(const tensor_t& grad) const {
  const size_t bytes = d_ * ElementBytes(_dtype);
  if (grad.size == bytes) return "";
  return "a gradient of " + std::to_string(grad.size) + " bytes for a partition of " +
         std::to_string(bytes);
}

std::string MaxRoundCompressor::CheckCompress(const tensor_t& grad) const {
  if (!bound()) return "compress before the THC_NORM stage bound the partition";
  return CheckGradient(grad);
}

void MaxRoundCompressor::ClassifyNonFinite(const float* x, double* value,
                                           std::string* nonfinite) const {
  const bool nan = HasNaN(x, d_);
  *value = nan ? std::numeric_limits<double>::quiet_NaN() : HUGE_VAL;
  *nonfinite = nan ? "NaN" : "Inf";
}

std::string MaxRoundCompressor::CheckMaxReply(size_t bytes, const char* what,
                                              thcwire::PullHeader* h, double* value) const {
  const std::string round(what);
  if (bytes < sizeof(*h)) return round + " reply of " + std::to_string(bytes) + " bytes";
  std::memcpy(h, norm_reply_.data(), sizeof(*h));
  if (h->magic != thcwire::kPullMagic || sizeof(*h) + h->payload_bytes != bytes)
    return "malformed " + round + " reply (" + std::to_string(bytes) + " bytes)";
  if (h->status != 0) return std::string(norm_reply_.data() + sizeof(*h), h->payload_bytes);
  if (h->payload_bytes != sizeof(double)) return round + " reply without a double";
  std::memcpy(value, norm_reply_.data() + sizeof(*h), sizeof(double));
  return "";
}

std::string MaxRoundCompressor::CheckPullReply(size_t size, const char* a_codec,
                                               thcwire::PullHeader* h) const {
  std::ostringstream os;
  if (!bound()) {
    os << "decompress before the partition was bound";
  } else if (size < sizeof(*h) || size > recv_.size()) {
    os << "pulled " << size << " bytes, not " << a_codec << " reply (a " << sizeof(*h)
       << "-byte header and at most " << recv_.size() - sizeof(*h) << " bytes)";
  } else {
    std::memcpy(h, recv_.data(), sizeof(*h));
    if (h->magic != thcwire::kPullMagic) {
      os << "the pulled bytes are not " << a_codec << " reply (magic 0x" << std::hex << h->magic
         << ")";
    } else if (sizeof(*h) + h->payload_bytes != size) {
      os << "truncated reply: its header says " << h->payload_bytes << " bytes follow, "
         << size - sizeof(*h) << " did";
    } else if (h->status != 0) {
      os << "the server failed round " << h->round << ": "
         << std::string(recv_.data() + sizeof(*h), h->payload_bytes);
    }
  }
  return os.str();
}

}  // namespace compressor
}  // namespace common
}  // namespace byteps
