// byteps-thc: THC in BytePS's compressor registry (worker side). See thc_compressor.h.
#include "thc_compressor.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "../compressor_registry.h"

namespace byteps {
namespace common {
namespace compressor {
namespace {

CompressorRegistry::Register reg(
    "thc_compressor",
    [](const kwargs_t& kwargs, size_t size, DataType dtype) -> std::unique_ptr<Compressor> {
      thcwire::ThcSettings settings;
      std::string err = thcwire::ParseThcKwargs(kwargs, &settings);
      if (!err.empty()) {
        err = "invalid THC compressor kwargs: " + err;
      } else if (dtype != BYTEPS_FLOAT32 && dtype != BYTEPS_FLOAT16 && dtype != BYTEPS_FLOAT64) {
        err = "THC compresses float32, float16 and float64 tensors, not BytePS dtype " +
              std::to_string(static_cast<int>(dtype));
      }
      // An invalid one still stands in, so that the push_pull fails with the message.
      if (!err.empty()) return std::unique_ptr<Compressor>(new ThcCompressor(size, dtype, err));
      return std::unique_ptr<Compressor>(new ThcCompressor(size, dtype, std::move(settings)));
    });

size_t ElementBytes(int dtype) {
  return dtype == BYTEPS_FLOAT64 ? 8 : dtype == BYTEPS_FLOAT16 ? 2 : 4;
}

// IEEE binary16 <-> binary32, round to nearest even.
float HalfToFloat(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FFu, bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (man << 13);
  } else if (exp) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man) {  // subnormal: normalise
    int e = -1;
    do {
      ++e;
      man <<= 1;
    } while (!(man & 0x400u));
    bits = sign | ((112 - e) << 23) | ((man & 0x3FFu) << 13);
  } else {
    bits = sign;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7FFFFFFFu;
  if (absx >= 0x7F800000u) return sign | 0x7C00u | (absx > 0x7F800000u ? 0x200u : 0);  // inf/nan
  if (absx >= 0x477FF000u) return sign | 0x7C00u;  // rounds to >= 65520: overflow to inf
  if (absx < 0x38800000u) {                         // subnormal half (or zero)
    if (absx < 0x33000000u) return sign;            // < 2^-25: rounds to zero
    uint32_t e = absx >> 23, man = (absx & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 126 - e;  // 14 + (113 - e) ... places the value in units of 2^-24
    uint32_t q = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) ++q;
    return sign | q;
  }
  uint32_t q = ((absx >> 13) - (112u << 10)), rem = absx & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (q & 1))) ++q;
  return sign | q;
}

}  // namespace

ThcCompressor::ThcCompressor(size_t size, DataType dtype, thcwire::ThcSettings settings)
    : Compressor(size, dtype), settings_(std::move(settings)) {
  norm_reply_.resize(sizeof(thcwire::PullHeader) + thcwire::kMaxErrorBytes);
}

ThcCompressor::ThcCompressor(size_t size, DataType dtype, std::string error)
    : Compressor(size, dtype), invalid_(std::move(error)) {
  norm_reply_.resize(sizeof(thcwire::PullHeader) + thcwire::kMaxErrorBytes);
}

ThcCompressor::~ThcCompressor() = default;

std::string ThcCompressor::TakeError() {
  std::string e;
  e.swap(error_);
  return e;
}

void ThcCompressor::FillNonFinite(char* out, bool nan) const {
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

std::string ThcCompressor::Bind(uint64_t key, size_t bytes, uint32_t rank,
                                const std::string& name) {
  if (!invalid_.empty()) return invalid_;
  size_t elem = ElementBytes(_dtype);
  if (bytes == 0 || bytes % elem) return "partition of " + std::to_string(bytes) + " bytes";
  size_t d = bytes / elem;
  if (encoder_) {
    if (key != key_ || d != d_) {
      return "compressor bound to key " + std::to_string(key_) + " (" + std::to_string(d_) +
             " elements) used for key " + std::to_string(key) + " (" + std::to_string(d) + ")";
    }
    return "";
  }
  key_ = key;
  name_ = name;
  d_ = d;
  cfg_ = thcwire::PartitionConfig(settings_.config, key);
  encoder_.reset(new thc::Encoder(cfg_, d, rank, settings_.error_feedback));
  encoder_->set_threads(settings_.codec_threads);
  fingerprint_ = thcwire::Fingerprint(cfg_, d);
  const thc::Geometry& geo = encoder_->geometry();
  send_.assign(sizeof(thcwire::PushHeader) + geo.payload_bytes, 0);
  // The sums come back packed in at most 32 bits each, or an error message.
  recv_.assign(sizeof(thcwire::PullHeader) +
                   std::max(geo.padded * sizeof(uint32_t), thcwire::kMaxErrorBytes),
               0);
  if (_dtype != BYTEPS_FLOAT32) scratch_.assign(geo.padded, 0.0f);
  BPS_LOG(DEBUG) << "THC key " << key << ": " << thcwire::Describe(cfg_) << " d=" << d
                 << " payload=" << geo.payload_bytes << "B";
  return "";
}

const float* ThcCompressor::AsFloat(tensor_t grad) {
  size_t d = grad.size / ElementBytes(_dtype);
  if (_dtype == BYTEPS_FLOAT32) return reinterpret_cast<const float*>(grad.data);
  if (_dtype == BYTEPS_FLOAT16) {
    auto* src = reinterpret_cast<const uint16_t*>(grad.data);
    for (size_t i = 0; i < d; ++i) scratch_[i] = HalfToFloat(src[i]);
  } else {
    auto* src = reinterpret_cast<const double*>(grad.data);
    for (size_t i = 0; i < d; ++i) scratch_[i] = static_cast<float>(src[i]);
  }
  return scratch_.data();
}

// What a failed thc::Encoder call means (the core's text), and what to do about it.
static std::string StatusMessage(thc::Status st, double max_norm) {
  std::string m = std::string(thc::StatusText(st)) + " (max norm " + std::to_string(max_norm) + ")";
  switch (st) {
    case thc::Status::kOverflow: return m + "; scale the loss down or clip gradients";
    case thc::Status::kNonFinite: return m + "; lower the learning rate or clip gradients";
    default: return m;
  }
}

// The first NaN among n floats (bit test: BytePS's -Ofast may fold std::isnan to false).
static bool HasNaN(const float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, x + i, 4);
    if ((b & 0x7FFFFFFFu) > 0x7F800000u) return true;
  }
  return false;
}

std::string ThcCompressor::LocalNorm(tensor_t grad, double* norm, std::string* nonfinite) {
  nonfinite->clear();
  if (!encoder_) return "the norm was asked for before the partition was bound";
  if (grad.size != d_ * ElementBytes(_dtype))
    return "a gradient of " + std::to_string(grad.size) + " bytes for a partition of " +
           std::to_string(d_ * ElementBytes(_dtype));
  const float* x = AsFloat(grad);
  thc::Status st = encoder_->Norm(x, norm);
  if (st == thc::Status::kOk) return "";
  if (st == thc::Status::kNonFinite) {
    // the norm reads the gradient and the residual, and the residual is always finite
    const bool nan = HasNaN(x, d_);
    *norm = nan ? std::numeric_limits<double>::quiet_NaN() : HUGE_VAL;
    *nonfinite = nan ? "NaN" : "Inf";
    return "";
  }
  if (st == thc::Status::kOverflow) {
    *norm = HUGE_VAL;
    *nonfinite = "values whose rotation overflows float32";
    return "";
  }
  return thc::StatusText(st);
}

tensor_t ThcCompressor::Compress(tensor_t grad) {
  thcwire::PushHeader h{thcwire::kPushMagic, thcwire::kWireVersion, fingerprint_};
  if (send_.size() < sizeof(h)) send_.assign(sizeof(h), 0);
  std::memcpy(send_.data(), &h, sizeof(h));
  error_.clear();
  if (!encoder_) {
    error_ = "compress before the THC_NORM stage bound the partition";
  } else if (grad.size != d_ * ElementBytes(_dtype)) {
    error_ = "a gradient of " + std::to_string(grad.size) + " bytes for a partition of " +
             std::to_string(d_ * ElementBytes(_dtype));
  } else {
    auto st = encoder_->Encode(AsFloat(grad), max_norm_,
                               reinterpret_cast<uint8_t*>(send_.data() + sizeof(h)));
    if (st != thc::Status::kOk) error_ = "encode failed: " + StatusMessage(st, max_norm_);
  }
  if (!error_.empty()) return {send_.data(), sizeof(h), grad.dtype};
  return {send_.data(), send_.size(), grad.dtype};
}

std::string ThcCompressor::ParseNormReply(size_t bytes, double* max_norm) const {
  thcwire::PullHeader h;
  if (bytes < sizeof(h)) return "norm reply of " + std::to_string(bytes) + " bytes";
  std::memcpy(&h, norm_reply_.data(), sizeof(h));
  if (h.magic != thcwire::kPullMagic || sizeof(h) + h.payload_bytes != bytes)
    return "malformed norm reply (" + std::to_string(bytes) + " bytes)";
  if (h.status != 0) return std::string(norm_reply_.data() + sizeof(h), h.payload_bytes);
  if (h.payload_bytes != sizeof(double)) return "norm reply without a double";
  std::memcpy(max_norm, norm_reply_.data() + sizeof(h), sizeof(double));
  // NaN and +inf are agreed non-finite norms (the step is skipped); a negative one is malformed.
  if (*max_norm < 0) return "negative max norm";
  return "";
}

tensor_t ThcCompressor::Decompress(tensor_t compressed) {
  const tensor_t none{compressed.data, 0, compressed.dtype};
  error_.clear();
  thcwire::PullHeader h;
  std::ostringstream os;
  if (!encoder_) {
    os << "decompress before the partition was bound";
  } else if (compressed.size < sizeof(h) || compressed.size > recv_.size()) {
    os << "pulled " << compressed.size << " bytes, not a THC reply (a " << sizeof(h)
       << "-byte header and at most " << recv_.size() - sizeof(h) << " bytes)";
  } else {
    std::memcpy(&h, recv_.data(), sizeof(h));
    if (h.magic != thcwire::kPullMagic) {
      os << "the pulled bytes are not a THC reply (magic 0x" << std::hex << h.magic << ")";
    } else if (sizeof(h) + h.payload_bytes != compressed.size) {
      os << "truncated reply: its header says " << h.payload_bytes << " bytes follow, "
         << compressed.size - sizeof(h) << " did";
    } else if (h.status != 0) {
      os << "the server failed round " << h.round << ": "
         << std::string(recv_.data() + sizeof(h), h.payload_bytes);
    } else {
      const thc::Geometry& geo = encoder_->geometry();
      const int w = thc::SumBits(cfg_, h.num_workers);
      if (w == 0 || w != static_cast<int>(h.lane_bits) ||
          h.payload_bytes != thc::PackedSumsBytes(geo.padded, w)) {
        os << "reply with " << h.lane_bits << "-bit sums for " << h.num_workers << " workers and "
           << h.payload_bytes << " bytes does not fit " << geo.padded << " coordinates (" << w
           << "-bit sums for granularity " << cfg_.granularity << ")";
      }
    }
  }
  if (!os.str().empty()) {
    error_ = os.str();
    return none;
  }
  // The decoded sum (n times the mean, n folded into the decode's scale): BytePS's pull yields
  // sums (average=True divides by n).
  float* out = _dtype == BYTEPS_FLOAT32 ? reinterpret_cast<float*>(compressed.data)
                                        : scratch_.data();
  auto st = thc::DecodePacked(cfg_, d_, reinterpret_cast<const uint8_t*>(recv_.data()) + sizeof(h),
                              h.payload_bytes, static_cast<int>(h.lane_bits), h.num_workers,
                              max_norm_, out, /*total=*/true, settings_.codec_threads);
  if (st != thc::Status::kOk) {
    error_ = std::string("decode failed: ") + thc::StatusText(st);
    return none;
  }
  if (_dtype == BYTEPS_FLOAT16) {
    auto* dst = reinterpret_cast<uint16_t*>(compressed.data);
    for (size_t i = 0; i < d_; ++i) dst[i] = FloatToHalf(out[i]);
  } else if (_dtype == BYTEPS_FLOAT64) {
    auto* dst = reinterpret_cast<double*>(compressed.data);
    for (size_t i = 0; i < d_; ++i) dst[i] = out[i];
  }
  return {compressed.data, d_ * ElementBytes(_dtype), compressed.dtype};
}

}  // namespace compressor
}  // namespace common
}  // namespace byteps
