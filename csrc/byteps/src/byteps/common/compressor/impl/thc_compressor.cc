// byteps-thc: THC in BytePS's compressor registry (worker side). See thc_compressor.h.
#include "thc_compressor.h"

#include <cmath>
#include <cstring>
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
      BPS_CHECK(err.empty()) << "THC: invalid compressor kwargs: " << err;
      BPS_CHECK(dtype == BYTEPS_FLOAT32 || dtype == BYTEPS_FLOAT16 || dtype == BYTEPS_FLOAT64)
          << "THC compresses float32, float16 and float64 tensors, not dtype " << dtype;
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

ThcCompressor::~ThcCompressor() = default;

std::string ThcCompressor::Bind(uint64_t key, size_t bytes, uint32_t rank,
                                const std::string& name) {
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
  fingerprint_ = thcwire::Fingerprint(cfg_, d);
  const thc::Geometry& geo = encoder_->geometry();
  send_.assign(sizeof(thcwire::PushHeader) + geo.payload_bytes, 0);
  // The sums come back in lanes of up to 32 bits, or an error message.
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

std::string ThcCompressor::LocalNorm(tensor_t grad, double* norm) {
  BPS_CHECK(encoder_) << "THC: LocalNorm before Bind";
  BPS_CHECK_EQ(grad.size, d_ * ElementBytes(_dtype)) << "THC key " << key_;
  thc::Status st = encoder_->Norm(AsFloat(grad), norm);
  if (st == thc::Status::kOk) return "";
  // the norm reads the gradient only: a non-finite input is the gradient
  return std::string(st == thc::Status::kNonFinite ? "non-finite gradient: " : "") +
         thc::StatusText(st);
}

tensor_t ThcCompressor::Compress(tensor_t grad) {
  BPS_CHECK(encoder_) << "THC: Compress before the THC_NORM stage bound the partition";
  BPS_CHECK_EQ(grad.size, d_ * ElementBytes(_dtype)) << "THC key " << key_;
  thcwire::PushHeader h{thcwire::kPushMagic, thcwire::kWireVersion, fingerprint_};
  std::memcpy(send_.data(), &h, sizeof(h));
  auto st = encoder_->Encode(AsFloat(grad), max_norm_,
                             reinterpret_cast<uint8_t*>(send_.data() + sizeof(h)));
  BPS_CHECK(st == thc::Status::kOk)
      << "THC key " << key_ << ": encode failed: " << StatusMessage(st, max_norm_);
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
  if (!thcwire::IsFinite(*max_norm) || *max_norm < 0) return "max norm is not finite";
  return "";
}

tensor_t ThcCompressor::Decompress(tensor_t compressed) {
  BPS_CHECK(encoder_) << "THC: Decompress before the partition was bound";
  thcwire::PullHeader h;
  BPS_CHECK_GE(compressed.size, sizeof(h))
      << "THC key " << key_ << ": pulled " << compressed.size << " bytes, less than a header";
  std::memcpy(&h, recv_.data(), sizeof(h));
  BPS_CHECK_EQ(h.magic, thcwire::kPullMagic)
      << "THC key " << key_ << ": the pulled bytes are not a THC reply";
  BPS_CHECK_EQ(sizeof(h) + h.payload_bytes, compressed.size)
      << "THC key " << key_ << ": truncated reply";
  if (h.status != 0) {
    BPS_LOG(FATAL) << "THC: tensor '" << name_ << "' (key " << key_
                   << "): the server failed round " << h.round << ": "
                   << std::string(recv_.data() + sizeof(h), h.payload_bytes);
  }
  const thc::Geometry& geo = encoder_->geometry();
  int lane = thc::LaneBits(cfg_, h.num_workers);
  BPS_CHECK(lane == static_cast<int>(h.lane_bits) &&
            h.payload_bytes == geo.padded * (h.lane_bits / 8))
      << "THC key " << key_ << ": reply with " << h.lane_bits << "-bit lanes for "
      << h.num_workers << " workers and " << h.payload_bytes << " bytes does not fit "
      << geo.padded << " coordinates";
  // The decoded mean, times n: BytePS's pull yields sums (average=True divides by n).
  float* out = _dtype == BYTEPS_FLOAT32 ? reinterpret_cast<float*>(compressed.data)
                                        : scratch_.data();
  auto st = thc::Decode(cfg_, d_, recv_.data() + sizeof(h), h.lane_bits, h.num_workers,
                        max_norm_, out);
  BPS_CHECK(st == thc::Status::kOk) << "THC key " << key_ << ": decode failed";
  const float n = static_cast<float>(h.num_workers);
  for (size_t i = 0; i < d_; ++i) out[i] = out[i] * n;
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
