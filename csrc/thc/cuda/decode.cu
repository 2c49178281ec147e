// byteps-thc CUDA: the decode family (docs/ALGORITHM.md, "Decode"): explicit instantiations of
// the tile kernel whose source is the aggregated sums or whose destination is the output.
// The plan (which kernels, in which order) is made in launch.cu.
#include "tile.cuh"

namespace thc::cuda::detail {

// Whole blocks in one tile: sums -> rescale -> transform -> signs -> out.
THC_DEFINE_LAUNCH_TILES_PER_SUM_LANE(Src::kSums, Dst::kOut)

// Larger blocks: the first pass from the sums, the last pass into the output.
THC_DEFINE_LAUNCH_TILES_PER_SUM_LANE(Src::kSums, Dst::kScratch)
THC_DEFINE_LAUNCH_TILES(Src::kScratch, Dst::kOut, float)

// block_scale: the check of every block's M_k first.
THC_DEFINE_LAUNCH_SCALE_CHECK(Src::kSums, Dst::kOut)

}  // namespace thc::cuda::detail
