// byteps-thc codec cores: the limits THC (csrc/thc) and LHC (csrc/lhc) share, inclusive. Each
// core re-exports them (thc::kMaxRank, lhc::kMaxRank, ...); callers use the core's names.
#pragma once

#include <cstdint>

namespace codec {

constexpr uint64_t kMaxSize = uint64_t{1} << 32;        // elements of one partition: uint32 indices
constexpr uint32_t kMaxRank = (1u << 24) - 1;           // a round key holds the rank in 24 bits
constexpr uint64_t kMaxStep = (uint64_t{1} << 40) - 1;  // ... and the step in the other 40

}  // namespace codec
