// byteps-thc: where a THC partition's codec runs, behind one small interface of device
// operations, so that one compressor (thc_compressor.h) and one stage plan (common/thc_stage.h)
// serve the CPU worker and the GPU worker alike.
//
// A Device computes the local norm, encodes into a payload and decodes packed sums, each on
// memory of its own kind: the host's for the host devices (the CPU codec core, csrc/thc), a GPU's
// for the CUDA device (the kernels of csrc/thc/cuda). Where a device's memory is not the host's,
// the partition's payload and sums live in buffers the Device allocates once per partition, and
// the plan's COPYD2H and COPYH2D move only those bytes (the b-bit payload up, the packed sums
// down): the gradient never leaves the device, and only the norm (8 bytes) reaches the host
// before the norm round.
//
// The plans (BYTEPS_THC_DEVICE_STAGES, read by DeviceStages):
//   CPU plan: the codec reads the input tensor, writes the payload into the push buffer and
//     decodes from the pull buffer into the output tensor, on the host: no copies. CPU tensors.
//   device plan: THC_NORM -> COMPRESS -> COPYD2H (payload) -> PUSH -> PULL -> COPYH2D (sums) ->
//     DECOMPRESS. GPU tensors on a CUDA worker (default; "off" keeps upstream's whole-partition
//     copies and the CPU codec), and with "emulated" CPU tensors on a CPU-only worker, on a host
//     device whose "device memory" is host memory of its own, so that every test run takes the
//     GPU worker's stage order, copy sizes and error paths. Every plan gives the same bits.
#ifndef BYTEPS_COMPRESSOR_THC_DEVICE_H
#define BYTEPS_COMPRESSOR_THC_DEVICE_H

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "../compressor.h"
#include "thc/thc.h"

namespace byteps {
namespace common {
namespace compressor {
namespace thcdevice {

class Device {
 public:
  virtual ~Device() = default;
  // "host", "emulated", "cuda", "cuda, host codec": for messages and the plan's log line.
  virtual const char* name() const = 0;
  // True when the device's memory is the host's: no copies needed (the CPU plan).
  virtual bool host_memory() const = 0;
  // Once per partition, before anything else: the codec of d values of `dtype`. "" or the error.
  virtual std::string Bind(const thc::Config& cfg, size_t d, DataType dtype, uint32_t rank,
                           bool error_feedback, int threads) = 0;
  // Device memory of `bytes` bytes, kept until the Device is destroyed; nullptr on failure.
  virtual uint8_t* Allocate(size_t bytes) = 0;
  // The local norm of the d values at grad (device memory, Bind's dtype) and the error-feedback
  // residual, into *norm on the host (docs/ALGORITHM.md, "Norm"), as thc::Encoder::Norm.
  // kNonFinite: *norm is NaN when some value is NaN, else +inf (only Infs). kOverflow: the
  // rotation of finite values overflowed float32. Neither changes the residual or the step.
  virtual thc::Status Norm(const void* grad, double* norm) = 0;
  // Encodes grad with the agreed max norm into payload (device memory, payload_bytes of the
  // geometry); the residual and the step advance as thc::Encoder::Encode's. A device that runs
  // asynchronously reports what it found during the encode in EncodeStatus(), after the
  // payload's COPYD2H has waited for it.
  virtual thc::Status Encode(const void* grad, double max_norm, uint8_t* payload) = 0;
  virtual thc::Status EncodeStatus() { return thc::Status::kOk; }
  // Decodes `bytes` of packed sums (device memory, sum_bits each) of num_workers workers into d
  // values of Bind's dtype at out (device memory): the estimate of the mean, as
  // thc::DecodePacked. Done when it returns.
  virtual thc::Status Decode(const uint8_t* sums, size_t bytes, int sum_bits, uint32_t num_workers,
                             double max_norm, void* out) = 0;
  // Copies `bytes` of host memory to device memory; done when it returns (a skipped step's
  // NaN/+inf result).
  virtual void Upload(void* dst, const void* src, size_t bytes) = 0;
  // What the last call that failed with a device error said ("" if none): a CUDA error's text.
  virtual std::string device_error() const { return ""; }
};

// The CPU codec core. host_memory: the CPU plan. !host_memory: the same codec on buffers of its
// own, each copy a memcpy (BYTEPS_THC_DEVICE_STAGES=emulated).
std::unique_ptr<Device> MakeHostDevice(bool host_memory);

// A partition of d values of `dtype` with configuration `cfg` on CUDA device `gpu`: the CUDA
// kernels where they run its geometry and dtype (blocks of one size; float32 and float16), else
// the CPU core on host copies of the partition ("cuda, host codec": a tiled last block, float64).
// Norm and Encode run on `encode_stream` (BytePS's device-to-host copy stream, so that the
// payload's copy follows the encode), Decode on `decode_stream` (the host-to-device one, after
// the sums' copy); both are cudaStream_t*. nullptr with *error set where this library was built
// without the kernels (only the CUDA worker's torch plugin has them).
std::unique_ptr<Device> MakeCudaDevice(const thc::Config& cfg, size_t d, DataType dtype, int gpu,
                                       void* encode_stream, void* decode_stream,
                                       std::string* error);

enum class Stages { kAuto, kEmulated, kOff };
// BYTEPS_THC_DEVICE_STAGES: kAuto when unset or empty (the device plan for GPU tensors, the CPU
// plan for CPU tensors), kEmulated for "emulated", kOff for "off" (no device plan). Anything
// else: *error names the value and the choices (the caller fails the push_pull with it).
Stages DeviceStages(std::string* error);

}  // namespace thcdevice
}  // namespace compressor
}  // namespace common
}  // namespace byteps

#endif  // BYTEPS_COMPRESSOR_THC_DEVICE_H
