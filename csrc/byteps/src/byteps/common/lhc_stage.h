// byteps-thc: LHC's exact fallback round on the worker (lhcwire::kLhcFallbackRequest).
//
// After DECOMPRESS, an LHC partition whose peeling left indices unresolved (the same set on
// every worker: they peel the same sums) pushes this worker's int32 values at those indices
// under the partition's key, pulls their sum over the workers, and completes its decode exactly;
// then the partition proceeds as after any DECOMPRESS. The round is counted and logged by the
// compressor. A failed round fails the partition (failure.h), never the process.
#ifndef BYTEPS_LHC_STAGE_H
#define BYTEPS_LHC_STAGE_H

#include <memory>

#include "common.h"

namespace byteps {
namespace common {

// True when the partition went into the fallback round (the caller returns: the round's
// callback finishes it); false for every other partition.
bool LhcStartFallback(const std::shared_ptr<TensorTableEntry>& task);

}  // namespace common
}  // namespace byteps

#endif  // BYTEPS_LHC_STAGE_H
