// byteps-thc LHC core: the public interface of lossless homomorphic compression.
//
// Plain C++17, no BytePS, no framework, no THC. The definition, bit for bit, is
// byteps_thc/lhc_reference.py (docs/LHC.md): the same payloads, sums and decoded values.
// A worker's Encoder turns a float partition into a payload (header, support bitmap, int32 count
// sketch); an Aggregator ORs the bitmaps and adds the sketches mod 2^32 (integers only); Decode
// peels the aggregated sketch into the exact sum, or reports the indices it could not resolve.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/hash.h"
#include "common/limits.h"

namespace lhc {

enum class Status : int {
  kOk = 0,
  kNonFinite = 1,    // NaN or Inf in the input, or x + residual overflowed float32
  kBadArgument = 2,  // sizes, payloads, scales, counts; see the message
  kUnresolved = 3,   // peeling stopped with indices unresolved (DecodeResult::unresolved)
};

// One sentence per Status, "" for kOk; callers add what they were doing.
const char* StatusText(Status st);

// Limits, inclusive.
using codec::kMaxRank;  // the round key holds the rank in 24 bits (common/limits.h)
using codec::kMaxSize;  // d: indices are uint32
using codec::kMaxStep;  // ... and the step in 40
constexpr uint64_t kMaxBuckets = 0xFFFFFFFFull / 3 * 3;  // m: bucket numbers are uint32
constexpr uint32_t kMaxWorkers = (1u << 24) - 1;  // n * ceil(max * 2^e) < 2^31 needs n <= 2^30
constexpr uint32_t kSamples = 1024;  // magnitudes sampled by the sampled top-k threshold

// The payload (little-endian): Header, bitmap (bitmap_bytes), sketch (m int32).
constexpr uint32_t kMagic = 0x3143484Cu;  // "LHC1"
constexpr uint16_t kVersion = 1;
struct Header {
  uint32_t magic;
  uint16_t version;
  uint16_t reserved;     // 0
  int32_t scale_exp;     // e: values are round(v * 2^e)
  uint32_t count;        // payloads summed into this one (1 from a worker)
  uint64_t fingerprint;  // Fingerprint(d, m, partition seed)
};
static_assert(sizeof(Header) == 24, "the LHC header is 24 bytes on the wire");
constexpr size_t kHeaderBytes = sizeof(Header);

struct Geometry {
  size_t d = 0;  // elements
  size_t m = 0;  // buckets: three sub-tables of `sub`
  size_t sub = 0;
  size_t bitmap_bytes = 0;   // 8 * ceil(d / 64)
  size_t payload_bytes = 0;  // kHeaderBytes + bitmap_bytes + 4 m
};
// "" when 1 <= d <= kMaxSize and m is a multiple of 3 in [3, kMaxBuckets], else the message.
std::string CheckGeometry(size_t d, size_t m);
Geometry MakeGeometry(size_t d, size_t m);

// Keys and streams (lhc_reference.py, "keys and streams"); the hashes are THC's (common/hash.h).
using codec::Hash32;
using codec::SplitMix64;
uint64_t PartitionSeed(uint64_t seed, uint64_t key);
void HashKeys(uint64_t partition_seed, uint32_t keys[3]);
uint64_t RoundKey(uint64_t partition_seed, uint32_t rank, uint64_t step);
uint32_t SampleKey(uint64_t partition_seed, uint32_t rank, uint64_t step);
uint64_t Fingerprint(size_t d, size_t m, uint64_t partition_seed);

// e of the shared scale 2^e for max_abs (finite, >= 0) and n workers: the largest with
// n * max_abs * 2^e < 2^31, one lower where n * ceil(max_abs * 2^e) > 2^31 - 1; 0 for 0.
int ScaleExponent(double max_abs, uint32_t num_workers);
// sign(v) * round(|v| * 2^e), rounded up by the top bits of the uniform u (unbiased).
int64_t Quantize(float v, int e, uint64_t u);
// The three buckets of each index (b[3 i + j] in sub-table j) and its signs (bit j of neg[i]
// set where s_j(i) = -1).
void Buckets(uint64_t partition_seed, const uint32_t* idx, size_t n, uint32_t sub, uint32_t* b,
             uint8_t* neg);

// k of exact top-k: max(1, min(d, ceil(topk * d))); topk in (0, 1].
uint64_t KeepCount(double topk, size_t d);

// One worker's encoder of one partition: holds the step and, with top-k and error feedback,
// the residual of what top-k dropped.
class Encoder {
 public:
  // topk = 0: no sparsifier (the input as it is); else a fraction in (0, 1], exact top-k or
  // (sampled) a threshold from kSamples sampled magnitudes.
  Encoder(const Geometry& geo, uint64_t partition_seed, uint32_t rank, double topk, bool sampled,
          bool error_feedback);
  ~Encoder();
  Encoder(const Encoder&) = delete;
  Encoder& operator=(const Encoder&) = delete;

  const Geometry& geometry() const;
  // max |x + residual| (|x| without a residual). kNonFinite (with *error) for NaN/Inf.
  Status MaxAbs(const float* x, double* max_abs, std::string* error);
  // Writes geometry().payload_bytes. On error nothing changes (step, residual).
  Status Encode(const float* x, double max_abs, uint32_t num_workers, uint8_t* payload,
                std::string* error);
  uint64_t step() const;
  void set_step(uint64_t step);
  const float* residual() const;  // d floats, or nullptr when no residual is kept
  // out[t] = q at idx[t] of the last successful Encode (0 off its support, or before any): the
  // exact fallback resends these for the indices peeling left unresolved; their int32 sum over
  // the workers is the sum peeling could not find.
  void ValuesAt(const uint32_t* idx, size_t k, int32_t* out) const;
  void ResetResidual();

 private:
  struct Impl;
  Impl* impl_;
};

// The server's whole job for one partition: OR and add up to n payloads (never modified).
class Aggregator {
 public:
  Aggregator(const Geometry& geo, uint64_t partition_seed, uint32_t num_workers);
  ~Aggregator();
  Aggregator(const Aggregator&) = delete;
  Aggregator& operator=(const Aggregator&) = delete;

  const Geometry& geometry() const;
  uint32_t count() const;
  // kBadArgument (with *error) for a wrong size, magic, fingerprint or scale, or too many.
  Status Add(const uint8_t* payload, size_t bytes, std::string* error);
  void Result(uint8_t* out) const;  // geometry().payload_bytes
  void Reset();

 private:
  struct Impl;
  Impl* impl_;
};

struct DecodeResult {
  std::vector<uint32_t> unresolved;  // ascending, when kUnresolved
  uint32_t rounds = 0;               // peeling rounds that resolved something
  size_t union_size = 0;             // |U|, the bits set in the aggregated bitmap
};
// The exact mean of the n workers' quantised inputs into out[d]; kUnresolved when peeling
// leaves indices unresolved (out then holds every resolved value, exact, and 0 at the
// unresolved ones), kBadArgument (with *error) otherwise.
Status Decode(const Geometry& geo, uint64_t partition_seed, const uint8_t* sums, size_t bytes,
              double max_abs, uint32_t num_workers, float* out, DecodeResult* result,
              std::string* error);

// The instruction set of the kernels ("avx512", "avx2", "portable"), and a cap for tests.
const char* ActiveIsa();
bool ForceIsa(const std::string& name);

}  // namespace lhc
