// byteps-thc CUDA: the decode family (docs/ALGORITHM.md, "Decode"): explicit instantiations of
// the tile kernel whose source is the aggregated sums or whose destination is the output.
// The plan (which kernels, in which order) is made in launch.cu.
#include "tile.cuh"

namespace thc {
namespace cuda {
namespace detail {

// Whole blocks in one tile: sums -> rescale -> transform -> signs -> out.
THC_DEFINE_LAUNCH_TILE(kSmallTile, Src::kSums, Dst::kOut, uint8_t)
THC_DEFINE_LAUNCH_TILE(kSmallTile, Src::kSums, Dst::kOut, uint16_t)
THC_DEFINE_LAUNCH_TILE(kSmallTile, Src::kSums, Dst::kOut, uint32_t)
THC_DEFINE_LAUNCH_TILE(kLargeTile, Src::kSums, Dst::kOut, uint8_t)
THC_DEFINE_LAUNCH_TILE(kLargeTile, Src::kSums, Dst::kOut, uint16_t)
THC_DEFINE_LAUNCH_TILE(kLargeTile, Src::kSums, Dst::kOut, uint32_t)

// Larger blocks: the first pass from the sums, the last pass into the output.
THC_DEFINE_LAUNCH_TILE(kSmallTile, Src::kSums, Dst::kScratch, uint8_t)
THC_DEFINE_LAUNCH_TILE(kSmallTile, Src::kSums, Dst::kScratch, uint16_t)
THC_DEFINE_LAUNCH_TILE(kSmallTile, Src::kSums, Dst::kScratch, uint32_t)
THC_DEFINE_LAUNCH_TILE(kLargeTile, Src::kSums, Dst::kScratch, uint8_t)
THC_DEFINE_LAUNCH_TILE(kLargeTile, Src::kSums, Dst::kScratch, uint16_t)
THC_DEFINE_LAUNCH_TILE(kLargeTile, Src::kSums, Dst::kScratch, uint32_t)
THC_DEFINE_LAUNCH_TILE(kSmallTile, Src::kScratch, Dst::kOut, float)
THC_DEFINE_LAUNCH_TILE(kLargeTile, Src::kScratch, Dst::kOut, float)

}  // namespace detail
}  // namespace cuda
}  // namespace thc
