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
  err = device_->Bind(cfg_, d, _dtype, rank, settings_.error_feedback, settings_.codec_threads);
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

// What a failed thc::Encoder call means (the core's text), and what to do about it.
static std::string StatusMessage(thc::Status st, double max_norm) {
  std::string m = std::string(thc::StatusText(st)) + " (max norm " + std::to_string(max_norm) + ")";
  switch (st) {
    case thc::Status::kOverflow: return m + "; scale the loss down or clip gradients";
    case thc::Status::kNonFinite: return m + "; lower the learning rate or clip gradients";
    default: return m;
  }
}

std::string ThcCompressor::EncodeError(thc::Status st) const {
  if (!device_->device_error().empty()) return "encode failed: " + device_->device_error();
  return "encode failed: " + StatusMessage(st, max_norm_);
}

std::string ThcCompressor::AfterPayloadCopy() {
  const thc::Status st = device_->EncodeStatus();
  return st == thc::Status::kOk ? "" : EncodeError(st);
}

void ThcCompressor::FillNonFinite(char* out, bool nan) const {
  if (!copies()) {
    MaxRoundCompressor::FillNonFinite(out, nan);
    return;
  }
  std::vector<char> host(d_ * ElementBytes(_dtype));
  MaxRoundCompressor::FillNonFinite(host.data(), nan);
  device_->Upload(out, host.data(), host.size());
}

std::string ThcCompressor::LocalNorm(tensor_t grad, double* norm, std::string* nonfinite) {
  nonfinite->clear();
  if (!bound_) return "the norm was asked for before the partition was bound";
  std::string err = CheckGradient(grad);
  if (!err.empty()) return err;
  thc::Status st = device_->Norm(grad.data, norm);
  if (st == thc::Status::kOk) return "";
  if (st == thc::Status::kNonFinite) {  // the device says which: NaN, or +inf for Infs only
    *nonfinite = std::isnan(*norm) ? "NaN" : "Inf";
    return "";
  }
  if (st == thc::Status::kOverflow) {
    *norm = HUGE_VAL;
    *nonfinite = "values whose rotation overflows float32";
    return "";
  }
  if (!device_->device_error().empty()) return device_->device_error();
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
    auto st = device_->Encode(grad.data, max_norm_, payload);
    if (st != thc::Status::kOk) error_ = EncodeError(st);
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
  auto st = device_->Decode(sums, h.payload_bytes, static_cast<int>(h.lane_bits), h.num_workers,
                            max_norm_, compressed.data);
  if (st != thc::Status::kOk) {
    error_ = std::string("decode failed: ") +
             (device_->device_error().empty() ? thc::StatusText(st) : device_->device_error());
    return none;
  }
  return {compressed.data, d_ * ElementBytes(_dtype), compressed.dtype};
}

}  // namespace compressor
}  // namespace common
}  // namespace byteps
