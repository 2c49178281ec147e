// byteps-thc: THC in BytePS's compressor registry (worker side). See thc_compressor.h.
#include "thc_compressor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "../compressor_registry.h"

namespace byteps {
namespace common {
namespace compressor {
namespace {

std::unique_ptr<Compressor> MakeThc(const kwargs_t& kwargs, size_t size, DataType dtype) {
  static const CodecDtypes kDtypes{{BYTEPS_FLOAT32, BYTEPS_FLOAT16, BYTEPS_FLOAT64},
                                   "float32, float16 and float64"};
  return MakeMaxRoundCompressor<ThcCompressor>(kwargs, size, dtype, "THC", thcwire::ParseThcKwargs,
                                               kDtypes);
}

CompressorRegistry::Register reg("thc_compressor", MakeThc);

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
  if (absx < 0x38800000u) {                        // subnormal half (or zero)
    if (absx < 0x33000000u) return sign;           // < 2^-25: rounds to zero
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
    : MaxRoundCompressor(size, dtype, ""), settings_(std::move(settings)) {}

ThcCompressor::ThcCompressor(size_t size, DataType dtype, std::string error)
    : MaxRoundCompressor(size, dtype, std::move(error)) {}

ThcCompressor::~ThcCompressor() = default;

void ThcCompressor::UseDevice(std::unique_ptr<thcdevice::Device> device) {
  if (!bound_) device_ = std::move(device);
}

std::string ThcCompressor::Bind(uint64_t key, size_t bytes, uint32_t rank,
                                const std::string& name) {
  size_t d = 0;
  bool again = false;
  std::string err = CheckBind(key, bytes, &d, &again);
  if (!err.empty() || again) return err;
  cfg_ = thcwire::PartitionConfig(settings_.config, key);
  if (!device_) device_ = thcdevice::MakeHostDevice(/*host_memory=*/true);
  err = device_->Bind(cfg_, d, rank, settings_.error_feedback, settings_.codec_threads);
  if (!err.empty()) return std::string("the ") + device_->name() + " device: " + err;
  geo_ = thc::MakeGeometry(cfg_, d);
  // The sums come back packed in at most 32 bits each, or an error message.
  const size_t sums_capacity = geo_.padded * sizeof(uint32_t);
  if (copies()) {
    payload_dev_ = device_->Allocate(geo_.payload_bytes);
    sums_dev_ = device_->Allocate(sums_capacity);
    if (!payload_dev_ || !sums_dev_) {
      return std::string("the ") + device_->name() + " device could not allocate " +
             std::to_string(geo_.payload_bytes + sums_capacity) + " bytes for the partition";
    }
  }
  key_ = key;
  name_ = name;
  d_ = d;
  bound_ = true;
  fingerprint_ = thcwire::Fingerprint(cfg_, d);
  send_.assign(sizeof(thcwire::PushHeader) + geo_.payload_bytes, 0);
  recv_.assign(sizeof(thcwire::PullHeader) + std::max(sums_capacity, thcwire::kMaxErrorBytes), 0);
  if (_dtype != BYTEPS_FLOAT32) scratch_.assign(geo_.padded, 0.0f);
  BPS_LOG(DEBUG) << "THC key " << key << ": " << thcwire::Describe(cfg_) << " d=" << d
                 << " payload=" << geo_.payload_bytes << "B device=" << device_->name();
  return "";
}

size_t ThcCompressor::sums_bytes(uint32_t num_workers) const {
  return thc::PackedSumsBytes(geo_.padded, thc::SumBits(cfg_, num_workers));
}

ThcCompressor::Copy ThcCompressor::PayloadCopy() {
  Copy c;
  if (!copies() || !payload_ready_) return c;
  payload_ready_ = false;
  c.dst = send_.data() + sizeof(thcwire::PushHeader);
  c.src = payload_dev_;
  c.bytes = geo_.payload_bytes;
  return c;
}

ThcCompressor::Copy ThcCompressor::SumsCopy(size_t bytes) {
  Copy c;
  if (!copies()) return c;
  reply_error_ = CheckReply(bytes, &reply_);
  if (!reply_error_.empty()) return c;
  c.dst = sums_dev_;
  c.src = recv_.data() + sizeof(thcwire::PullHeader);
  c.bytes = reply_.payload_bytes;
  return c;
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

std::string ThcCompressor::LocalNorm(tensor_t grad, double* norm, std::string* nonfinite) {
  nonfinite->clear();
  if (!bound_) return "the norm was asked for before the partition was bound";
  std::string err = CheckGradient(grad);
  if (!err.empty()) return err;
  const float* x = AsFloat(grad);
  thc::Status st = device_->Norm(x, norm);
  if (st == thc::Status::kOk) return "";
  if (st == thc::Status::kNonFinite) {
    // the norm reads the gradient and the residual, and the residual is always finite
    ClassifyNonFinite(x, norm, nonfinite);
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
  error_ = CheckCompress(grad);
  payload_ready_ = false;
  if (error_.empty()) {
    // with copies() the payload stays on the device until COPYD2H (PayloadCopy)
    uint8_t* payload =
        copies() ? payload_dev_ : reinterpret_cast<uint8_t*>(send_.data() + sizeof(h));
    auto st = device_->Encode(AsFloat(grad), max_norm_, payload);
    if (st != thc::Status::kOk) error_ = "encode failed: " + StatusMessage(st, max_norm_);
  }
  if (!error_.empty()) return {send_.data(), sizeof(h), grad.dtype};
  payload_ready_ = true;
  return {send_.data(), send_.size(), grad.dtype};
}

std::string ThcCompressor::ParseNormReply(size_t bytes, double* max_norm) const {
  thcwire::PullHeader h;
  std::string err = CheckMaxReply(bytes, "norm", &h, max_norm);
  if (!err.empty()) return err;
  // NaN and +inf are agreed non-finite norms (the step is skipped); a negative one is malformed.
  if (*max_norm < 0) return "negative max norm";
  return "";
}

std::string ThcCompressor::CheckReply(size_t bytes, thcwire::PullHeader* h) const {
  std::string err = CheckPullReply(bytes, "a THC", h);
  if (!err.empty()) return err;
  const int w = thc::SumBits(cfg_, h->num_workers);
  if (w == 0 || w != static_cast<int>(h->lane_bits) ||
      h->payload_bytes != thc::PackedSumsBytes(geo_.padded, w)) {
    std::ostringstream os;
    os << "reply with " << h->lane_bits << "-bit sums for " << h->num_workers << " workers and "
       << h->payload_bytes << " bytes does not fit " << geo_.padded << " coordinates (" << w
       << "-bit sums for granularity " << cfg_.granularity << ")";
    return os.str();
  }
  return "";
}

tensor_t ThcCompressor::Decompress(tensor_t compressed) {
  const tensor_t none{compressed.data, 0, compressed.dtype};
  thcwire::PullHeader h;
  const uint8_t* sums = nullptr;
  if (copies()) {  // COPYH2D (before DECOMPRESS in the plan) checked the reply, moved its sums
    error_ = reply_error_;
    h = reply_;
    sums = sums_dev_;
  } else {
    error_ = CheckReply(compressed.size, &h);
    sums = reinterpret_cast<const uint8_t*>(recv_.data()) + sizeof(h);
  }
  if (!error_.empty()) return none;
  // The decoded mean: the decode's last scale carries the 1/n, so the pull of a THC tensor
  // yields the mean and a push_pull's average costs no pass of its own (PullYieldsMean,
  // thc_stage.h; a sum multiplies by n).
  float* out =
      _dtype == BYTEPS_FLOAT32 ? reinterpret_cast<float*>(compressed.data) : scratch_.data();
  auto st = device_->Decode(sums, h.payload_bytes, static_cast<int>(h.lane_bits), h.num_workers,
                            max_norm_, out);
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
