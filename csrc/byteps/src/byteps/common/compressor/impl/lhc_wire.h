// byteps-thc: LHC's BytePS adapter, the part both the worker and the server need.
//
// - ParseLhcKwargs: the one place where BytePS compressor kwargs (strings, LhcConfig.to_kwargs())
//   become LHC settings;
// - PartitionGeometry: the sketch of one partition, sized as byteps_thc.lhc_config.buckets_for
//   sizes it, so every worker and the server agree on the payload;
// - the wire: a data push is one lhc payload (csrc/lhc/lhc.h: header, bitmap, sketch); a push of
//   the 24-byte header alone with count 0 says the worker could not encode (the server fails the
//   round for all); the pull reply is thcwire::PullHeader + the aggregated payload, or an error.
//
// The max round is THC's (max_round.h): the value is max |grad + residual|.
#ifndef BYTEPS_COMPRESSOR_LHC_WIRE_H
#define BYTEPS_COMPRESSOR_LHC_WIRE_H

#include <cstddef>
#include <cstdint>
#include <string>

#include "lhc/lhc.h"  // csrc/lhc: the codec core (copied to lhc/ of the tree)
#include "thc_wire.h"

namespace byteps {
namespace common {
namespace compressor {
namespace lhcwire {

// What an LHC tensor is declared with. capacity and seed must agree on every worker (they are in
// the payload's fingerprint, with the key and the partition's size); top-k and error feedback
// are per worker; the non-finite mode is compared at registration.
struct LhcSettings {
  uint64_t capacity = 1 << 16;  // most nonzeros of the summed partition
  double topk = 0;              // 0: no sparsifier; else the kept fraction in (0, 1]
  bool sampled = false;         // lhc_topk_method=sampled (else exact)
  uint64_t seed = 42;
  bool error_feedback = true;
  bool nonfinite_error = false;  // lhc_nonfinite=error (as thc_nonfinite)
};

// True when kwargs select LHC (compressor_type=lhc).
bool IsLhcKwargs(const thcwire::Kwargs& kwargs);

// Parses compressor_type=lhc, lhc_capacity, lhc_topk, lhc_topk_method, lhc_seed,
// lhc_error_feedback and lhc_nonfinite. "" on success, else a message naming the bad kwarg.
std::string ParseLhcKwargs(const thcwire::Kwargs& kwargs, LhcSettings* out);

// m of a partition whose sum has at most `nonzeros` indices: byteps_thc.lhc_config.buckets_for,
// the same integers (three sub-tables of s, load <= 0.75, pair-collision floor).
uint64_t BucketsFor(uint64_t nonzeros);

// The geometry of a partition of d elements under `s` (m for min(capacity, d) nonzeros); ""
// or why it is not one (d or m out of the core's range).
std::string PartitionGeometry(const LhcSettings& s, size_t d, lhc::Geometry* geo);

// Canonical text of the settings that must agree (what messages print).
std::string Describe(const LhcSettings& s);

// ---- the exact fallback round -------------------------------------------------------------
// After a data round whose sums peeling could not resolve (every worker gets the same
// unresolved set U from the same sums), each worker pushes its int32 values q at U, in U's
// ascending order, under the partition's key with this request type; the server adds them mod
// 2^32 (the scale rule keeps every per-index sum in int32) and every pull of the round returns
// thcwire::PullHeader + the |U| sums; each worker completes its decode exactly.
constexpr int kLhcFallbackRequest = 4;
constexpr uint32_t kFallbackMagic = 0x4643484Cu;  // "LHCF"
struct FallbackHeader {
  uint32_t magic;        // kFallbackMagic
  uint32_t count;        // |U|: int32 values that follow
  uint64_t fingerprint;  // the partition's payload fingerprint
};
static_assert(sizeof(FallbackHeader) == 16, "FallbackHeader is 16 bytes on the wire");

// The largest error message the server sends (thcwire's).
constexpr size_t kMaxErrorBytes = thcwire::kMaxErrorBytes;

}  // namespace lhcwire
}  // namespace compressor
}  // namespace common
}  // namespace byteps

#endif  // BYTEPS_COMPRESSOR_LHC_WIRE_H
