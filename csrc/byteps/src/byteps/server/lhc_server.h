// byteps-thc: the server's integer-only LHC path (see lhc_server.cc).
//
// An LHC key lives beside THC's keys in thc_server.cc and shares its machinery: registration
// (answered once every worker registered), the rounds and their pulls, THC's max round (for
// LHC the max of max |v|) and the stall inspector. What is LHC's is here: the settings and the
// payload check, the OR of the bitmaps and the int32 add (lhc::Aggregator), the result.
#ifndef BYTEPS_SERVER_LHC_SERVER_H
#define BYTEPS_SERVER_LHC_SERVER_H

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

namespace byteps {
namespace server {

struct LhcKey;  // one key's LHC state (lhc_server.cc)
using LhcKwargs = std::unordered_map<std::string, std::string>;

// True when a registration's kwargs say compressor_type=lhc.
bool LhcIsRegistration(const LhcKwargs& kwargs);

// One worker's registration of `key` (d elements, n workers). The first one creates *state and
// sets *fingerprint, *description and *nonfinite_error; later ones are compared with it.
// "" or why it is refused (the message names the sender and both sides).
std::string LhcRegister(const LhcKwargs& kwargs, uint64_t key, int sender, size_t d, uint32_t n,
                        std::shared_ptr<LhcKey>* state, uint64_t* fingerprint,
                        std::string* description, bool* nonfinite_error);

// One data push of `sender` for the round whose agreed max |v| is `agreed_max`: checked (size,
// header, fingerprint, count, the scale the rule gives for that max and n) and added. "" or the
// message naming key, sender and the bad values; a refused push adds nothing.
std::string LhcAdd(LhcKey* state, uint64_t key, int sender, const char* data, size_t len,
                   double agreed_max);

// One push of the exact fallback round (lhc_wire.h): checked (header, fingerprint, length, the
// same count as the round's other pushes) and added mod 2^32. "" or the message. `first`: the
// round's first push, which sets the count.
std::string LhcFallbackAdd(LhcKey* state, uint64_t key, int sender, const char* data, size_t len,
                           bool first);
// The fallback round's sums (valid until the next call); then cleared.
const char* LhcFallbackResult(LhcKey* state, size_t* bytes);
void LhcFallbackReset(LhcKey* state);

// The round's aggregated payload (valid until the next call), then cleared for the next round.
const char* LhcResult(LhcKey* state, size_t* bytes);
void LhcReset(LhcKey* state);

}  // namespace server
}  // namespace byteps

#endif  // BYTEPS_SERVER_LHC_SERVER_H
