// byteps-thc: non-finite values, as every codec's max round and server see them.
//
// The max round (THC's norm, LHC's max |v|) reduces one double per worker by max; a NaN or an Inf
// there makes every worker skip the step (BYTEPS_THC_NONFINITE=propagate, the default) or fails
// the round (=error). The setting keeps its name for both codecs: THC declares it as
// thc_nonfinite, LHC as lhc_nonfinite.
#ifndef BYTEPS_COMMON_NONFINITE_H
#define BYTEPS_COMMON_NONFINITE_H

#include <cstdint>

namespace byteps {
namespace common {

// Finite test on the bits: BytePS builds with -Ofast, under which std::isfinite may fold to true.
inline bool IsFinite(double x) {
  uint64_t bits;
  __builtin_memcpy(&bits, &x, sizeof(bits));
  return (bits & 0x7FF0000000000000ull) != 0x7FF0000000000000ull;
}

inline bool IsNaN(double x) {
  uint64_t bits;
  __builtin_memcpy(&bits, &x, sizeof(bits));
  return (bits & 0x7FFFFFFFFFFFFFFFull) > 0x7FF0000000000000ull;
}

// "error" or "propagate", as the kwargs spell the setting (thc_nonfinite, lhc_nonfinite).
inline const char* NonfiniteName(bool error) { return error ? "error" : "propagate"; }

}  // namespace common
}  // namespace byteps

#endif  // BYTEPS_COMMON_NONFINITE_H
