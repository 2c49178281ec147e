// byteps-thc codec core: the public interface.
//
// Plain C++17, no BytePS, no framework. The algorithm, bit for bit, is docs/ALGORITHM.md.
// Callers (the Python binding, the BytePS compressor and server, the CUDA twins) fill a Config,
// call Validate() once, and then use Encoder / Aggregator / Decode.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/hash.h"
#include "common/limits.h"

namespace thc {

enum class Status : int {
  kOk = 0,
  kNonFinite = 1,    // NaN or Inf in the input or in max_norm
  kBadArgument = 2,  // sizes, lengths, counts; see the message
  kOverflow = 3,     // finite inputs, but a value of the transform overflowed float32 (inputs
                     // near FLT_MAX, or a max_norm so large that the error's scale is Inf)
};

// What a Status means, for an error message: one sentence, "" for kOk. Callers add what they were
// doing and what to do about it; none restates these texts.
const char* StatusText(Status st);

// The limits of the code, inclusive. Every caller (the binding, codec.py, cuda.py, the BytePS
// compressor) checks against these; none restates them.
using codec::kMaxRank;  // a round key holds the rank in 24 bits (common/limits.h)
using codec::kMaxSize;  // elements of one partition (d)
using codec::kMaxStep;  // ... and the step in the other 40
constexpr uint32_t kMaxGranularity = (1u << 24) - 1;  // g: every table value exact in float32
constexpr uint64_t kMaxRotationBlock = uint64_t{1} << 32;
constexpr uint32_t kMaxWorkers = 0xffffffffu;  // n: a uint32 everywhere
constexpr int kMaxThreads = 256;               // threads of one partition's codec

// Everything that defines the code. Workers and the server must agree on all of it.
struct Config {
  int bits = 4;                      // b: 1..8
  uint32_t granularity = 30;         // g: table values in [0, g]; 2^b - 1 <= g <= kMaxGranularity
  double clip = 2.1538746940614564;  // T = Phi^-1(1 - p/2); p = 1/32 by default
  uint64_t seed = 42;
  uint64_t rotation_block = 0;  // power of two (blocks of one size); 0 = tiled by AutoBlock(d)
  std::vector<uint32_t> table;  // 2^bits levels, 0 .. g, strictly increasing
  // One max norm per rotation block (docs/ALGORITHM.md, "A scale per rotation block"): the
  // *Blocks calls below instead of the scalar ones; rotation_block 0 or >= kTileAlign.
  bool block_scale = false;
};

// Empty string when valid, else a message naming the bad field and value.
std::string Validate(const Config& cfg);

// The tiling rule (docs/ALGORITHM.md, "Geometry"; byteps_thc/config.py holds the same numbers).
constexpr uint64_t kAutoMinBlock = uint64_t{1} << 14;
constexpr uint64_t kAutoPadNum = 21, kAutoPadDen = 20;  // d_pad <= 1.05 d
constexpr uint64_t kTileAlign = 32;  // a smaller block is not tiled (sign words, payload bytes)

// Geometry of one partition of d elements: (padded - tail_block) / block blocks of B, then one
// block of tail_block (0: none; always 0 for a given rotation_block). Every block starts at a
// multiple of 32 coordinates, or at 0.
struct Geometry {
  size_t d = 0;              // elements in
  size_t block = 0;          // B (power of two)
  size_t padded = 0;         // d_pad: every block's coordinates
  size_t payload_bytes = 0;  // ceil(d_pad * bits / 8)
  size_t tail_block = 0;     // the last block's size when smaller than B (a power of two), or 0
};
Geometry MakeGeometry(const Config& cfg, size_t d);
// d_pad of d elements under blocks of at most `block` (a power of two); *tail = the last
// block's size if it is smaller, else 0.
uint64_t TiledSize(uint64_t d, uint64_t block, uint64_t* tail);
// The block of rotation_block = 0: the largest power of two B in [kAutoMinBlock, next_pow2(d)]
// with TiledSize(d, B) <= 1.05 d; if none, the one of least d_pad (the larger on a tie);
// next_pow2(d) when that is <= kAutoMinBlock.
uint64_t AutoBlock(uint64_t d);
// The rotation blocks of a partition, in order: the length of a block_scale norm vector.
size_t NumBlocks(const Geometry& geo);

// Bits of one aggregation lane for n workers: 8, 16, 32; 0 if n*g does not fit 32 bits.
int LaneBits(const Config& cfg, uint32_t num_workers);

// Keys of the counter-based streams (docs/ALGORITHM.md, "Random streams"); the hashes are the
// ones LHC's streams use too (common/hash.h).
using codec::Hash32;
using codec::SplitMix64;
uint32_t SignKey(uint64_t seed);
uint32_t RoundKey(uint64_t seed, uint32_t rank, uint64_t step);

// In-place unnormalised Walsh-Hadamard transform of each block of `block` floats in x[0, n).
void Fwht(float* x, size_t n, size_t block);

// One worker's encoder for one partition. Holds the error-feedback residual and the step.
class Encoder {
 public:
  Encoder(const Config& cfg, size_t d, uint32_t rank, bool error_feedback);
  ~Encoder();
  Encoder(const Encoder&) = delete;
  Encoder& operator=(const Encoder&) = delete;

  const Geometry& geometry() const;
  // The local norm (docs/ALGORITHM.md, "Norm"): ||grad||_2, with error feedback ||grad + the
  // residual||_2, which rotates the gradient; the Encode() of the same step and gradient then
  // reuses that rotation. kNonFinite for a NaN/Inf element, kOverflow when the rotation
  // overflows float32. Changes nothing but that cached rotation.
  Status Norm(const float* grad, double* norm);
  // Writes geometry().payload_bytes bytes. kNonFinite for a NaN/Inf input, kOverflow when the
  // rotation or the new residual produces one (docs/ALGORITHM.md, Encode). On any error nothing
  // changes (step, residual); the payload may be partly written.
  Status Encode(const float* grad, double max_norm, uint8_t* payload);
  // block_scale: the local norm of each rotation block into norms[0, NumBlocks(geometry()))
  // (with error feedback sqrt(sum y^2 / B) of the block's rotation, which the EncodeBlocks()
  // of the same step and gradient reuses, as Norm's), and the encode with one max norm per
  // block (count = NumBlocks; a block of M_k = 0 gets indices 0 and keeps its y). Statuses as
  // Norm / Encode; kBadArgument for a wrong count or a negative M_k, and for these calls
  // without block_scale (or Norm-less Encode with it).
  Status BlockNorms(const float* grad, double* norms);
  Status EncodeBlocks(const float* grad, const double* max_norms, size_t count, uint8_t* payload);
  uint64_t step() const;
  void set_step(uint64_t step);
  // Norm() and Encode() run on up to `threads` threads, the calling one included, where each
  // gets at least 2^16 coordinates: the partition's chunks (whole rotation blocks) split over
  // them, or a partition of one block that block's transform. The results are bit for bit
  // those of one thread. Clamped to 1..kMaxThreads. Default 1.
  void set_threads(int threads);
  int threads() const;
  // The rotated residual r (docs/ALGORITHM.md, "Error-feedback state"): geometry().padded
  // floats, or nullptr without error feedback.
  const float* residual() const;
  void ResetResidual();

 private:
  struct Impl;
  Impl* impl_;
};

// Sums payloads of n workers into integer lanes (the server's whole job).
class Aggregator {
 public:
  Aggregator(const Config& cfg, size_t d, uint32_t num_workers);
  ~Aggregator();
  Aggregator(const Aggregator&) = delete;
  Aggregator& operator=(const Aggregator&) = delete;

  const Geometry& geometry() const;
  int lane_bits() const;
  uint32_t count() const;  // payloads added so far
  // kBadArgument (with *error set) for a wrong length or an add past num_workers.
  Status Add(const uint8_t* payload, size_t bytes, std::string* error);
  const void* sums() const;  // geometry().padded lanes of lane_bits() bits
  size_t sums_bytes() const;
  void Reset();

 private:
  struct Impl;
  Impl* impl_;
};

// Decodes the sums of n workers into d floats (the estimate of the mean input). `threads`: as
// Encoder::set_threads, the same bits.
Status Decode(const Config& cfg, size_t d, const void* sums, int lane_bits, uint32_t num_workers,
              double max_norm, float* out, int threads = 1);

// The way down (docs/ALGORITHM.md, "Publish"): the server publishes the sums as an LSB-first
// stream of SumBits() bits each, ceil(log2(n*g + 1)) (0 when n*g does not fit 32 bits).
int SumBits(const Config& cfg, uint32_t num_workers);
size_t PackedSumsBytes(size_t n, int sum_bits);  // ceil(n * sum_bits / 8)
// n lanes of lane_bits (8/16/32) -> PackedSumsBytes(n, sum_bits) bytes. Every sum must fit
// sum_bits (the aggregator's do; bits above are dropped); false for a bad width.
bool PackSums(const void* lanes, int lane_bits, size_t n, int sum_bits, uint8_t* out);
// Decode() of the server's packed reply: kBadArgument unless sum_bits == SumBits(cfg, n) and
// bytes == PackedSumsBytes(d_pad, sum_bits). total: the estimate of the sum of the inputs
// instead of their mean, n folded into the last scale (docs/ALGORITHM.md, "Decode").
Status DecodePacked(const Config& cfg, size_t d, const uint8_t* packed, size_t bytes, int sum_bits,
                    uint32_t num_workers, double max_norm, float* out, bool total = false,
                    int threads = 1);
// Decode / DecodePacked of a block_scale configuration: one max norm per rotation block
// (count = NumBlocks); a block of M_k = 0 decodes to +0. The scalar calls refuse block_scale
// (kBadArgument), these calls its absence.
Status DecodeBlocks(const Config& cfg, size_t d, const void* sums, int lane_bits,
                    uint32_t num_workers, const double* max_norms, size_t count, float* out,
                    int threads = 1);
Status DecodePackedBlocks(const Config& cfg, size_t d, const uint8_t* packed, size_t bytes,
                          int sum_bits, uint32_t num_workers, const double* max_norms, size_t count,
                          float* out, bool total = false, int threads = 1);

// The instruction set chosen at run time: "avx512", "avx2" or "portable" (the best this CPU has).
const char* ActiveIsa();
// Caps the instruction set (tests and benchmarks compare them). False if the CPU lacks it.
bool ForceIsa(const std::string& name);

}  // namespace thc
