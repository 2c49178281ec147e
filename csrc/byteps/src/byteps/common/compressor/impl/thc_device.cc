// byteps-thc: the host device of a THC partition (see thc_device.h).
#include "thc_device.h"

#include <cstdlib>
#include <vector>

namespace byteps {
namespace common {
namespace compressor {
namespace thcdevice {
namespace {

class HostDevice : public Device {
 public:
  explicit HostDevice(bool host_memory) : host_memory_(host_memory) {}

  const char* name() const override { return host_memory_ ? "host" : "emulated"; }
  bool host_memory() const override { return host_memory_; }

  std::string Bind(const thc::Config& cfg, size_t d, uint32_t rank, bool error_feedback,
                   int threads) override {
    cfg_ = cfg;
    d_ = d;
    threads_ = threads;
    encoder_.reset(new thc::Encoder(cfg, d, rank, error_feedback));
    encoder_->set_threads(threads);
    return "";
  }

  uint8_t* Allocate(size_t bytes) override {
    buffers_.emplace_back(bytes ? bytes : 1);
    return buffers_.back().data();
  }

  thc::Status Norm(const float* grad, double* norm) override { return encoder_->Norm(grad, norm); }

  thc::Status Encode(const float* grad, double max_norm, uint8_t* payload) override {
    return encoder_->Encode(grad, max_norm, payload);
  }

  thc::Status Decode(const uint8_t* sums, size_t bytes, int sum_bits, uint32_t num_workers,
                     double max_norm, float* out) override {
    return thc::DecodePacked(cfg_, d_, sums, bytes, sum_bits, num_workers, max_norm, out,
                             /*total=*/false, threads_);
  }

 private:
  const bool host_memory_;
  thc::Config cfg_;
  size_t d_ = 0;
  int threads_ = 1;
  std::unique_ptr<thc::Encoder> encoder_;
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
  if (s.empty() || s == "off") return Stages::kCpu;
  if (s == "emulated") return Stages::kEmulated;
  *error = "BYTEPS_THC_DEVICE_STAGES=" + s +
           " is not a plan: use \"emulated\" (the GPU worker's THC stages on host memory) or "
           "\"off\" (the CPU worker's, the default)";
  return Stages::kCpu;
}

}  // namespace thcdevice
}  // namespace compressor
}  // namespace common
}  // namespace byteps
