// byteps-thc: THC's BytePS adapter, the part both the worker and the server need.
//
// - ParseThcKwargs: the ONE place where BytePS compressor kwargs (strings) become a thc::Config.
// - PartitionConfig / Fingerprint: the per-key configuration every worker and the server derive
//   identically, and the 64-bit digest each push carries so the server can refuse a mismatch.
// - The wire format of THC's requests (below).
//
// Nothing here does THC math: that is csrc/thc (thc.h), the only implementation.
#ifndef BYTEPS_COMPRESSOR_THC_WIRE_H
#define BYTEPS_COMPRESSOR_THC_WIRE_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>

#include "thc/thc.h"  // csrc/thc: the codec core (csrc/ is on the include path)

namespace byteps {
namespace common {
namespace compressor {
namespace thcwire {

using Kwargs = std::unordered_map<std::string, std::string>;

// What a THC tensor is declared with. Error feedback is per worker, so it is not part of the
// fingerprint. The non-finite mode (thc_nonfinite, BYTEPS_THC_NONFINITE) must be the same on
// every worker: the server compares it at registration.
struct ThcSettings {
  thc::Config config;
  bool error_feedback = true;
  // false (propagate): a NaN/Inf gradient makes the agreed norm non-finite and every worker skips
  // the partition's step, its output NaN/+inf; true (error): the round fails, naming the sender.
  bool nonfinite_error = false;
  // Threads of this worker's codec for one partition (thc::Encoder::set_threads): worker-local,
  // no part of the code, so neither the fingerprint nor the server looks at it.
  int codec_threads = 1;
};

// True when kwargs select THC (compressor_type=thc).
bool IsThcKwargs(const Kwargs& kwargs);

// The kwargs parsers every codec's ParseXxxKwargs uses. FindKwarg: the value, or nullptr when
// absent. ParseU64: a whole decimal (no sign); ParseDouble: a whole finite number. Each returns
// false on anything else, leaving *out unchanged.
const char* FindKwarg(const Kwargs& kwargs, const char* name);
bool ParseU64(const char* text, uint64_t* out);
bool ParseDouble(const char* text, double* out);

// Parses compressor_type=thc, thc_bits, thc_granularity, thc_overflow_prob and/or thc_clip,
// thc_seed, thc_rotation_block, thc_tiling and thc_sums (when sent, they must be kTiling and
// kSums; thc_block_scale, when sent, must be 0: one norm per partition), thc_table (comma-separated, as solved by
// byteps_thc.tables.solve_table), thc_error_feedback (1/0), thc_nonfinite (propagate, the
// default, or error), thc_codec_threads (1..thc::kMaxThreads) and the generic ef_type, then
// thc::Validate()s the result. Returns "" on success, else a message naming the bad kwarg.
std::string ParseThcKwargs(const Kwargs& kwargs, ThcSettings* out);

// The configuration of one partition: the declared one with the seed mixed with the BytePS key,
// so that partitions use different rotations while every worker (and the server) agrees.
thc::Config PartitionConfig(const thc::Config& declared, uint64_t key);

// Canonical text of a configuration (also what error messages print).
std::string Describe(const thc::Config& cfg);

// 64-bit digest of Describe(cfg) and the partition's element count d.
uint64_t Fingerprint(const thc::Config& cfg, size_t d);

// ---- wire format -----------------------------------------------------------------------------
// Request types beyond BytePS's three (kDefaultPushPull=0, kRowSparse=1, kCompressed=2); they
// travel in the ps-lite command like BytePS's own (Cantor pairing with the dtype).
constexpr int kThcNormRequest = 3;
int CommandType(int request_type, int dtype);

constexpr uint32_t kPushMagic = 0x31434854u;  // "THC1" little-endian
constexpr uint32_t kPullMagic = 0x52434854u;  // "THCR"
// 2: partitions tiled by blocks of two sizes (thc_tiling), sums published packed (thc_sums).
constexpr uint32_t kWireVersion = 2;

// What byteps_thc.config's TILING and SUMS name: the only values this build takes.
constexpr const char* kTiling = "pow2-tail";
constexpr const char* kSums = "packed";

// Prefix of every THC data push: then the packed indices (thc::Geometry::payload_bytes). A push
// of the header alone says the worker could not encode: the server fails that round for all.
struct PushHeader {
  uint32_t magic;        // kPushMagic
  uint32_t version;      // kWireVersion
  uint64_t fingerprint;  // Fingerprint(PartitionConfig(cfg, key), d)
};
static_assert(sizeof(PushHeader) == 16, "PushHeader is 16 bytes on the wire");

// A norm-round push: the worker's local norm of the partition; NaN or +inf when its gradient has
// a NaN or an Inf (the server's max is then NaN if any push was NaN, else +inf).
struct NormPush {
  uint64_t fingerprint;
  double norm;
};
static_assert(sizeof(NormPush) == 16, "NormPush is 16 bytes on the wire");

// Prefix of every THC pull response (data and norm rounds). status 0: then `payload_bytes`
// bytes follow (the d_pad sums packed in lane_bits = thc::SumBits(cfg, n) bits each, as
// thc::PackSums writes them; or one double, the max norm). Otherwise the rest is an error
// message (UTF-8, payload_bytes long) and the round failed.
struct PullHeader {
  uint32_t magic;          // kPullMagic
  int32_t status;          // 0 ok, else the round failed
  uint32_t lane_bits;      // bits of one packed sum, 1..32 (data); 64 (norm)
  uint32_t num_workers;    // n, the number of payloads summed
  uint64_t round;          // 1-based count of completed rounds of this key
  uint64_t payload_bytes;  // bytes after this header
};
static_assert(sizeof(PullHeader) == 32, "PullHeader is 32 bytes on the wire");

// Largest error message the server sends (it truncates longer ones).
constexpr size_t kMaxErrorBytes = 1024;

}  // namespace thcwire
}  // namespace compressor
}  // namespace common
}  // namespace byteps

#endif  // BYTEPS_COMPRESSOR_THC_WIRE_H
