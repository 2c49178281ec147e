// byteps-thc: one key's homomorphic codec on the server, behind one round interface.
//
// thc_server.cc runs the protocol every homomorphic key follows: registration (answered once
// every worker registered), the rounds (data, the max round, a codec's fallback round) and their
// pulls, refusals and failures, and the stall inspector. What differs between codecs is a
// CodecKey: how a registration configures the key, how one push is checked and added, and what
// the n-th push publishes. THC's is thc_key.cc, LHC's lhc_key.cc; the workers' side of the same
// split is MaxRound (common/compressor/impl/max_round.h).
#ifndef BYTEPS_SERVER_CODEC_KEY_H
#define BYTEPS_SERVER_CODEC_KEY_H

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include "ps/ps.h"

namespace byteps {
namespace server {

using Kwargs = std::unordered_map<std::string, std::string>;

class CodecKey {
 public:
  virtual ~CodecKey() = default;

  // The codec's name in messages ("THC", "LHC"): "<name> key <key>: ...".
  virtual const char* name() const = 0;

  // One worker's registration of `key`: its kwargs, the key's store (BytePS's initial push: its
  // length in bytes and dtype) and the number of workers. The first one configures the key, later
  // ones are compared with it. "" or why it is refused (naming the sender and both sides).
  virtual std::string Register(const Kwargs& kwargs, uint64_t key, int sender, size_t stored_len,
                               int stored_dtype, uint32_t num_workers) = 0;
  // What the max round checks a push against: the key's fingerprint, its description (for
  // messages) and whether a non-finite value fails the round (else it is propagated).
  virtual bool configured() const = 0;
  virtual uint64_t fingerprint() const = 0;
  virtual const std::string& description() const = 0;
  virtual bool nonfinite_error() const = 0;

  // The data round. Add checks and adds one push; `agreed_max` is the last max round's result
  // (LHC's scale). "" or the message naming the key, the sender and the bad values; a refused
  // push adds nothing. Publish is the n-th push's pull reply for `round` (NewReply), Reset clears
  // the sums for the next round.
  virtual std::string Add(uint64_t key, int sender, const char* data, size_t len,
                          double agreed_max) = 0;
  virtual ps::SArray<char> Publish(uint64_t round) = 0;
  virtual void Reset() = 0;

  // A codec's exact fallback round (LHC's, lhc_wire.h); none by default. `first`: the round's
  // first push.
  virtual bool has_fallback() const { return false; }
  virtual std::string FallbackAdd(uint64_t key, int /*sender*/, const char* /*data*/,
                                  size_t /*len*/, bool /*first*/) {
    return std::string(name()) + " key " + std::to_string(key) + " has no fallback round";
  }
  virtual ps::SArray<char> FallbackPublish(uint64_t /*round*/) { return {}; }
  virtual void FallbackReset() {}
};

// Each codec's key for a registration whose kwargs are its own (compressor_type=thc, =lhc), else
// nullptr.
std::unique_ptr<CodecKey> NewThcKey(const Kwargs& kwargs);
std::unique_ptr<CodecKey> NewLhcKey(const Kwargs& kwargs);

// A successful pull reply of `round` (thcwire::PullHeader: status 0, `lane_bits` per published
// value, `num_workers`) with room for `bytes` of payload after the header: *payload points there,
// for the caller to fill. Owned by the SArray (and by ps-lite until sent).
ps::SArray<char> NewReply(uint32_t lane_bits, uint32_t num_workers, uint64_t round, size_t bytes,
                          char** payload);

}  // namespace server
}  // namespace byteps

#endif  // BYTEPS_SERVER_CODEC_KEY_H
