// byteps-thc: the host devices of a THC partition (see thc_device.h).
#include "thc_device.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace byteps {
namespace common {
namespace compressor {
namespace thcdevice {
namespace {

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

class HostDevice : public Device {
 public:
  explicit HostDevice(bool host_memory) : host_memory_(host_memory) {}

  const char* name() const override { return host_memory_ ? "host" : "emulated"; }
  bool host_memory() const override { return host_memory_; }

  std::string Bind(const thc::Config& cfg, size_t d, DataType dtype, uint32_t rank,
                   bool error_feedback, int threads) override {
    if (dtype != BYTEPS_FLOAT32 && dtype != BYTEPS_FLOAT16 && dtype != BYTEPS_FLOAT64)
      return "dtype " + std::to_string(static_cast<int>(dtype)) + " is not float32/16/64";
    cfg_ = cfg;
    d_ = d;
    dtype_ = dtype;
    threads_ = threads;
    encoder_.reset(new thc::Encoder(cfg, d, rank, error_feedback));
    encoder_->set_threads(threads);
    if (dtype != BYTEPS_FLOAT32) scratch_.assign(d, 0.0f);
    return "";
  }

  uint8_t* Allocate(size_t bytes) override {
    buffers_.emplace_back(bytes ? bytes : 1);
    return buffers_.back().data();
  }

  thc::Status Norm(const void* grad, double* norm) override {
    const float* x = AsFloat(grad);
    thc::Status st = encoder_->Norm(x, norm);
    if (st == thc::Status::kNonFinite) {  // the residual is always finite: the gradient is not
      bool nan = false;
      for (size_t i = 0; i < d_ && !nan; ++i) nan = std::isnan(x[i]);
      *norm = nan ? std::nan("") : HUGE_VAL;
    }
    return st;
  }

  thc::Status Encode(const void* grad, double max_norm, uint8_t* payload) override {
    return encoder_->Encode(AsFloat(grad), max_norm, payload);
  }

  thc::Status Decode(const uint8_t* sums, size_t bytes, int sum_bits, uint32_t num_workers,
                     double max_norm, void* out) override {
    float* f = dtype_ == BYTEPS_FLOAT32 ? static_cast<float*>(out) : scratch_.data();
    thc::Status st = thc::DecodePacked(cfg_, d_, sums, bytes, sum_bits, num_workers, max_norm, f,
                                       /*total=*/false, threads_);
    if (st != thc::Status::kOk) return st;
    if (dtype_ == BYTEPS_FLOAT16) {
      auto* dst = static_cast<uint16_t*>(out);
      for (size_t i = 0; i < d_; ++i) dst[i] = FloatToHalf(f[i]);
    } else if (dtype_ == BYTEPS_FLOAT64) {
      auto* dst = static_cast<double*>(out);
      for (size_t i = 0; i < d_; ++i) dst[i] = f[i];
    }
    return st;
  }

  void Upload(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }

 private:
  // The partition as float32: itself, or converted into scratch_.
  const float* AsFloat(const void* grad) {
    if (dtype_ == BYTEPS_FLOAT32) return static_cast<const float*>(grad);
    if (dtype_ == BYTEPS_FLOAT16) {
      auto* src = static_cast<const uint16_t*>(grad);
      for (size_t i = 0; i < d_; ++i) scratch_[i] = HalfToFloat(src[i]);
    } else {
      auto* src = static_cast<const double*>(grad);
      for (size_t i = 0; i < d_; ++i) scratch_[i] = static_cast<float>(src[i]);
    }
    return scratch_.data();
  }

  const bool host_memory_;
  thc::Config cfg_;
  size_t d_ = 0;
  DataType dtype_ = BYTEPS_FLOAT32;
  int threads_ = 1;
  std::unique_ptr<thc::Encoder> encoder_;
  std::vector<float> scratch_;                 // the partition as float32, when it is not
  std::vector<std::vector<uint8_t>> buffers_;  // "device memory" of the emulated plan
};

}  // namespace

std::unique_ptr<Device> MakeHostDevice(bool host_memory) {
  return std::unique_ptr<Device>(new HostDevice(host_memory));
}

Stages DeviceStages(std::string* error) {
  error->clear();
  const char* v = std::getenv("BYTEPS_THC_DEVICE_STAGES");
  const std::string s = v ? v : "";
  if (s.empty() || s == "auto") return Stages::kAuto;
  if (s == "emulated") return Stages::kEmulated;
  if (s == "off") return Stages::kOff;
  *error = "BYTEPS_THC_DEVICE_STAGES=" + s +
           " is not a plan: use \"auto\" (the default: THC on the GPU for GPU tensors), "
           "\"emulated\" (the GPU worker's THC stages on host memory, for CPU tensors on a "
           "CPU-only worker) or \"off\" (GPU tensors copied whole to the host and encoded there)";
  return Stages::kAuto;
}

}  // namespace thcdevice
}  // namespace compressor
}  // namespace common
}  // namespace byteps
