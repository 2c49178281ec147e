// byteps-thc CUDA twins of the codec kernels: the host-side interface.
//
// Plain structs and launch functions on raw device pointers and the caller's stream; no tensor
// library, no host synchronisation inside (the launchers only enqueue work). The arithmetic is
// docs/ALGORITHM.md bit for bit (built with --fmad=false; every float op is __fmul_rn/__fadd_rn).
//
// Errors on the device (a NaN/Inf in the gradient, a non-finite max norm) cannot be returned
// without a sync, so they are recorded in a device status word (int32, bit flags below):
//   LaunchNorm clears it, then sets kStatusNonFiniteInput if any x_j is not finite;
//   LaunchEncode / LaunchDecode write nothing when the status word is non-zero on entry, or when
//   the max norm (read on the device) is not finite (then they set kStatusNonFiniteNorm).
// The caller reads the word when it needs to know (byteps_thc/cuda.py does, once per step).
// Launchers return an empty string, or a message for a bad argument or a CUDA launch error.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace thc {
namespace cuda {

enum DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

constexpr int kStatusNonFiniteInput = 1;  // some grad_j + res_j is NaN/Inf (set by LaunchNorm)
constexpr int kStatusNonFiniteNorm = 2;   // the max norm is NaN/Inf or negative

// The code (docs/ALGORITHM.md, "Configuration"); the host copy of the table travels by value.
struct Code {
  int bits = 4;
  uint32_t granularity = 30;
  double clip = 2.1538746940614564;
  uint64_t seed = 42;
  uint64_t rotation_block = 0;  // 0 = whole partition
  uint32_t table[256] = {};     // 2^bits levels
  // Pass planning (tests force several passes on small sizes; leave the defaults otherwise):
  int fused_max_log = 14;       // blocks up to 2^this run in one kernel (12 or 14)
  int column_max_bits = 11;     // bits per column pass of a larger block (1..11)
  int chunk_log = 22;           // larger blocks run in chunks of max(2^this, block) (L2-sized)
};
// Empty when valid.
std::string ValidateCode(const Code& code);

struct Geometry {
  uint64_t d = 0, block = 0, padded = 0, payload_bytes = 0;
  int log_block = 0;
};
Geometry MakeGeometry(const Code& code, uint64_t d);

// Bits of one aggregation lane for n workers: 8, 16, 32; 0 if n*g does not fit 32 bits.
int LaneBits(const Code& code, uint32_t num_workers);

// Floats of device scratch that LaunchEncode / LaunchDecode need (0 when the rotation block fits
// one thread block, i.e. up to 2^14; else one chunk: max(2^22, block), at most d_pad). Allocate it
// once per partition (16-byte aligned) and reuse it; calls on one stream may share one.
uint64_t WorkspaceFloats(const Code& code, uint64_t d);

struct NormArgs {
  const void* grad = nullptr;      // d elements of `dtype`
  DType dtype = kFloat32;
  const float* residual = nullptr; // d floats, or null
  uint64_t d = 0;
  double* norm = nullptr;          // out: sqrt(sum x_j^2), accumulated in binary64 in place
  int* status = nullptr;           // cleared, then kStatusNonFiniteInput if needed
};
std::string LaunchNorm(const NormArgs& a, cudaStream_t stream);

struct EncodeArgs {
  const void* grad = nullptr;       // d elements of `dtype`
  DType dtype = kFloat32;
  float* residual = nullptr;        // d floats, read and rewritten in place; null = no error feedback
  uint64_t d = 0;
  uint32_t rank = 0;
  uint64_t step = 0;
  const double* max_norm_dev = nullptr;  // M on the device (e.g. after an all-reduce max), or null
  double max_norm = 0;                   // M when max_norm_dev is null
  uint8_t* payload = nullptr;       // out: payload_bytes
  float* workspace = nullptr;       // WorkspaceFloats() floats (may be null when that is 0)
  const int* status = nullptr;      // skip everything when *status != 0 (null: no check)
  int* status_out = nullptr;        // where kStatusNonFiniteNorm is recorded (may equal status)
};
std::string LaunchEncode(const Code& code, const EncodeArgs& a, cudaStream_t stream);

// sums (padded lanes of lane_bits) [+]= sum over count payloads of TBL[index].
struct AggregateArgs {
  const uint8_t* payloads = nullptr;  // count payloads, each payload_bytes, `stride` bytes apart
  uint32_t count = 0;
  uint64_t stride = 0;
  uint64_t d = 0;
  void* sums = nullptr;               // d_pad lanes
  int lane_bits = 8;
  bool accumulate = false;            // add to the sums already there (else overwrite)
};
std::string LaunchAggregate(const Code& code, const AggregateArgs& a, cudaStream_t stream);

struct DecodeArgs {
  const void* sums = nullptr;   // d_pad lanes of lane_bits
  int lane_bits = 8;
  uint32_t num_workers = 1;
  uint64_t d = 0;
  const double* max_norm_dev = nullptr;
  double max_norm = 0;
  float* out = nullptr;         // d floats (may be null when out_cast is given)
  void* out_cast = nullptr;     // optional: d elements of out_dtype as well (rounded to nearest)
  DType out_dtype = kFloat32;
  float* workspace = nullptr;
  const int* status = nullptr;
  int* status_out = nullptr;
};
std::string LaunchDecode(const Code& code, const DecodeArgs& a, cudaStream_t stream);

// Number of CUDA devices; 0 (never an error) when there is no driver or no device.
int DeviceCount();
// "" or the name of device `dev`.
std::string DeviceName(int dev);

}  // namespace cuda
}  // namespace thc
