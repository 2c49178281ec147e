// byteps-thc: where a THC partition's codec runs, behind one small interface of device
// operations, so that one compressor (thc_compressor.h) and one stage plan (common/thc_stage.h)
// serve the CPU worker and the GPU worker's plan alike.
//
// A Device computes the local norm, encodes into a payload and decodes packed sums, each on
// memory of its own kind: the host's for HostDevice (the CPU codec core, csrc/thc), a GPU's for
// a CUDA device. Where a device's memory is not the host's, the partition's payload and sums
// live in buffers the Device allocates once per partition, and the plan's COPYD2H and COPYH2D
// move only those bytes (the b-bit payload up, the packed sums down): the gradient never leaves
// the device, and only the norm (8 bytes) reaches the host before the norm round.
//
// BYTEPS_THC_DEVICE_STAGES selects the plan on a CPU-only worker: unset or "off", the CPU plan
// (the codec reads the input tensor, writes the payload into the push buffer, decodes from the
// pull buffer into the output tensor: no copies); "emulated", the GPU worker's plan on a
// HostDevice whose "device memory" is host memory of its own, so that every test run takes the
// GPU worker's stage order, copy sizes and error paths. Both plans give the same bits: the codec
// is the same, only where its bytes lie differs.
#ifndef BYTEPS_COMPRESSOR_THC_DEVICE_H
#define BYTEPS_COMPRESSOR_THC_DEVICE_H

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "thc/thc.h"

namespace byteps {
namespace common {
namespace compressor {
namespace thcdevice {

class Device {
 public:
  virtual ~Device() = default;
  // "host", "emulated", "cuda": for messages and the plan's log line.
  virtual const char* name() const = 0;
  // True when the device's memory is the host's: no copies needed (the CPU plan).
  virtual bool host_memory() const = 0;
  // Once per partition, before anything else: the codec of d values. "" or the error.
  virtual std::string Bind(const thc::Config& cfg, size_t d, uint32_t rank, bool error_feedback,
                           int threads) = 0;
  // Device memory of `bytes` bytes, kept until the Device is destroyed; nullptr on failure.
  virtual uint8_t* Allocate(size_t bytes) = 0;
  // The local norm of the d floats at grad (device memory) and the error-feedback residual, into
  // *norm on the host (docs/ALGORITHM.md, "Norm"). As thc::Encoder::Norm.
  virtual thc::Status Norm(const float* grad, double* norm) = 0;
  // Encodes grad with the agreed max norm into payload (device memory, payload_bytes of the
  // geometry); the residual and the step advance as thc::Encoder::Encode's.
  virtual thc::Status Encode(const float* grad, double max_norm, uint8_t* payload) = 0;
  // Decodes `bytes` of packed sums (device memory, sum_bits each) of num_workers workers into d
  // floats at out (device memory): the estimate of the mean. As thc::DecodePacked.
  virtual thc::Status Decode(const uint8_t* sums, size_t bytes, int sum_bits, uint32_t num_workers,
                             double max_norm, float* out) = 0;
};

// The CPU codec core. host_memory: the CPU plan. !host_memory: the same codec on buffers of its
// own, each copy a memcpy (BYTEPS_THC_DEVICE_STAGES=emulated).
std::unique_ptr<Device> MakeHostDevice(bool host_memory);

enum class Stages { kCpu, kEmulated };
// BYTEPS_THC_DEVICE_STAGES: kCpu when unset, empty or "off"; kEmulated for "emulated". Anything
// else: *error names the value and the choices (the caller fails the push_pull with it).
Stages DeviceStages(std::string* error);

}  // namespace thcdevice
}  // namespace compressor
}  // namespace common
}  // namespace byteps

#endif  // BYTEPS_COMPRESSOR_THC_DEVICE_H
