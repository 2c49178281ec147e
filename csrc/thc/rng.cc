// byteps-thc codec core: the keys of the counter-based random streams (docs/ALGORITHM.md,
// "Random streams"). The hashes are common/hash.h; the per-element streams live in the kernels
// (simd.h).
#include "thc/thc.h"

namespace thc {

uint32_t SignKey(uint64_t seed) { return (uint32_t)SplitMix64(seed); }

uint32_t RoundKey(uint64_t seed, uint32_t rank, uint64_t step) {
  return (uint32_t)SplitMix64(SplitMix64(seed ^ 0x5448435F524E4421ull) ^
                              SplitMix64(codec::RankStep(rank, step)));
}

}  // namespace thc
