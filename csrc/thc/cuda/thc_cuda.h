// byteps-thc CUDA twins of the codec kernels: the host-side interface.
//
// Plain structs and launch functions on raw device pointers and the caller's stream; no tensor
// library, no host synchronisation inside (the launchers only enqueue work). The arithmetic is
// docs/ALGORITHM.md bit for bit (built with --fmad=false; every float op is __fmul_rn/__fadd_rn).
//
// Errors on the device (a NaN/Inf in the gradient, a non-finite max norm, an overflow of the
// rotation) cannot be returned without a sync, so they are recorded in a device status word
// (int32, bit flags below):
//   LaunchNorm clears it, then sets kStatusNonFiniteInput if some grad_j is not finite and, with
//   error feedback (where it computes y = Hu(sign * grad) + r), kStatusOverflow if some y_j is not.
//   LaunchEncode / LaunchDecode write nothing when the status word is non-zero on entry, or when
//   the max norm (read on the device) is not finite (then they set kStatusNonFiniteNorm); with
//   Code::block_scale, when any block's M_k is not (see EncodeArgs).
//   LaunchEncode also flags what it finds itself (kStatusNonFiniteInput, kStatusOverflow); see
//   EncodeArgs for what it has written by then.
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

constexpr int kStatusNonFiniteInput = 1;  // some grad_j is NaN/Inf
constexpr int kStatusNonFiniteNorm = 2;   // the max norm is NaN/Inf or negative
constexpr int kStatusOverflow = 4;        // some y_j or new r_j is not finite (float overflow,
                                          // or an M so large that k1/k0 are Inf)

// The code (docs/ALGORITHM.md, "Configuration"); the host copy of the table travels by value.
struct Code {
  int bits = 4;
  uint32_t granularity = 30;
  double clip = 2.1538746940614564;
  uint64_t seed = 42;
  uint64_t rotation_block = 0;  // 0 = whole partition
  uint32_t table[256] = {};     // 2^bits levels
  // A scale per rotation block (docs/ALGORITHM.md, "A scale per rotation block"): the norm
  // writes one norm per block, encode and decode take one max norm M_k per block (Geometry::
  // blocks of them, in order, on the device), each block quantised as a partition of its own
  // (d_pad = B). Needs rotation_block 0 (one block) or >= kMinScaleBlock.
  bool block_scale = false;
  // Pass planning (tests force several passes on small sizes; leave the defaults otherwise):
  int fused_max_log = 14;    // blocks up to 2^this run in one kernel (12 or 14)
  int column_max_bits = 11;  // bits per column pass of a larger block (1..11)
  int chunk_log = 22;        // larger blocks run in chunks of max(2^this, block) (L2-sized)
};
// Empty when valid.
std::string ValidateCode(const Code& code);
// The least rotation block with a scale of its own (the CPU core's kTileAlign), unless the
// partition is one block.
constexpr uint64_t kMinScaleBlock = 32;

struct Geometry {
  uint64_t d = 0, block = 0, padded = 0, payload_bytes = 0;
  uint64_t blocks = 0;  // rotation blocks, padded / block: the length of block_scale's norms
  int log_block = 0;
};
Geometry MakeGeometry(const Code& code, uint64_t d);

// Bits of one aggregation lane for n workers: 8, 16, 32; 0 if n*g does not fit 32 bits.
int LaneBits(const Code& code, uint32_t num_workers);
// Bits of one published sum for n workers (docs/ALGORITHM.md, "Publish"): ceil(log2(n*g + 1)),
// 0 if n*g does not fit 32 bits. The CPU core's thc::SumBits.
int SumBits(const Code& code, uint32_t num_workers);

// Floats of device scratch that LaunchNorm (with error feedback) / LaunchEncode / LaunchDecode
// need (0 when the rotation block fits one thread block, i.e. up to 2^14; else one chunk:
// max(2^22, block), at most d_pad). Allocate it once per partition (16-byte aligned) and reuse
// it; calls on one stream may share one.
uint64_t WorkspaceFloats(const Code& code, uint64_t d);

// The norm round's local norm (docs/ALGORITHM.md, "Norm"), accumulated in binary64 in place:
// without error feedback sqrt(sum_{j<d} grad_j^2); with it sqrt(sum_{j<d_pad} y_j^2 / B) over
// y = Hu(sign * grad) + r, which takes the transform (and the workspace for blocks above 2^14).
// With Code::block_scale the same sums block by block: norm[k] of rotation block k.
struct NormArgs {
  const void* grad = nullptr;  // d elements of `dtype`
  DType dtype = kFloat32;
  const float* residual = nullptr;  // the rotated state r: d_pad floats, or null
  uint64_t d = 0;
  double* norm = nullptr;      // out: one double, or with block_scale Geometry::blocks of them
  uint64_t norm_count = 0;     // block_scale: the doubles at `norm` (must be Geometry::blocks)
  float* workspace = nullptr;  // WorkspaceFloats() floats, with a residual (may be null if 0)
  int* status = nullptr;       // cleared, then kStatusNonFiniteInput / kStatusOverflow
};
std::string LaunchNorm(const Code& code, const NormArgs& a, cudaStream_t stream);

// Encode (docs/ALGORITHM.md, "Encode"): y = Hu(sign * grad) (+ r), payload, new state r = y - deq.
// What is written when something is flagged during the call (the status word was clear on entry):
//   a non-finite M, or (with error feedback) k1/k0 not finite: nothing;
//   a non-finite grad_j, y_j or new r_j: the flag is set; the payload of the affected range is
//   not valid; with error feedback every tile (of 2^12 or 2^14 coordinates, whole blocks, or the
//   last transform pass's tile of a larger block) holding a non-finite y_j or r_j keeps its old
//   state; other tiles may have been updated (those that start after the flag is set skip,
//   when status == status_out). A norm of the same input and state launched before on the
//   same status word computes the same y and flags it, and then the encode writes nothing at all
//   (byteps_thc/cuda.py always does so).
// With Code::block_scale, max_norm_dev holds M_k of every rotation block (max_norm_count of
// them, which must be Geometry::blocks). A check of all of them runs first and flags a
// non-finite or negative M_k (kStatusNonFiniteNorm) or, with error feedback, one whose k1/k0
// are not finite (kStatusOverflow); with status == status_out the encode then writes nothing.
// (Each tile also checks the M_k it uses and writes nothing with a bad one, so with another
// status word only the blocks of good M_k are written.) A block of M_k = 0 gets indices 0 and
// keeps y as its state, as the one-norm encode does for M = 0.
struct EncodeArgs {
  const void* grad = nullptr;  // d elements of `dtype`
  DType dtype = kFloat32;
  float* residual = nullptr;  // the rotated state r: d_pad floats, read and rewritten in
                              // place; null = no error feedback
  uint64_t d = 0;
  uint32_t rank = 0;
  uint64_t step = 0;
  const double* max_norm_dev = nullptr;  // M on the device (e.g. after an all-reduce max), or null;
                                         // block_scale: M_k of each block (required)
  double max_norm = 0;                   // M when max_norm_dev is null
  uint64_t max_norm_count = 0;           // block_scale: the doubles at max_norm_dev
  uint8_t* payload = nullptr;            // out: payload_bytes
  float* workspace = nullptr;            // WorkspaceFloats() floats (may be null when that is 0)
  const int* status = nullptr;           // skip everything when *status != 0 (null: no check)
  int* status_out = nullptr;             // where flags are recorded (may equal status)
};
std::string LaunchEncode(const Code& code, const EncodeArgs& a, cudaStream_t stream);

// sums (padded lanes of lane_bits) [+]= sum over count payloads of TBL[index].
struct AggregateArgs {
  const uint8_t* payloads = nullptr;  // count payloads, each payload_bytes, `stride` bytes apart
  uint32_t count = 0;
  uint64_t stride = 0;
  uint64_t d = 0;
  void* sums = nullptr;  // d_pad lanes
  int lane_bits = 8;
  bool accumulate = false;  // add to the sums already there (else overwrite)
};
std::string LaunchAggregate(const Code& code, const AggregateArgs& a, cudaStream_t stream);

// With Code::block_scale, max_norm_dev holds M_k of every rotation block (max_norm_count of
// them, Geometry::blocks), checked as the encode checks them (kStatusNonFiniteNorm); a block of
// M_k = 0 decodes to +0.
struct DecodeArgs {
  const void* sums = nullptr;  // d_pad lanes of lane_bits, or the packed stream (sum_bits)
  int lane_bits = 8;
  int sum_bits = 0;  // > 0: sums is the server's published stream, d_pad sums of SumBits() bits
                     // each, LSB first (what a worker pulls); lane_bits is then not read
  uint32_t num_workers = 1;
  uint64_t d = 0;
  const double* max_norm_dev = nullptr;  // block_scale: M_k of each block (required)
  double max_norm = 0;
  uint64_t max_norm_count = 0;  // block_scale: the doubles at max_norm_dev
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
