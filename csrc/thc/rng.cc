// byteps-thc codec core: the keys of the counter-based random streams (docs/ALGORITHM.md,
// "Random streams"). The per-element hashes live in the kernels (simd.h).
#include "thc/thc.h"

namespace thc {

uint64_t SplitMix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint32_t Hash32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

uint32_t SignKey(uint64_t seed) { return (uint32_t)SplitMix64(seed); }

uint32_t RoundKey(uint64_t seed, uint32_t rank, uint64_t step) {
  return (uint32_t)SplitMix64(SplitMix64(seed ^ 0x5448435F524E4421ull) ^
                              SplitMix64(((uint64_t)rank << 40) ^ step));
}

}  // namespace thc
