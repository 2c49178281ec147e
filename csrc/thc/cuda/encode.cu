// byteps-thc CUDA: the encode family (docs/ALGORITHM.md, "Encode"): explicit instantiations of
// the tile kernel whose source is the gradient or whose destination is the payload or residual.
// The plan (which kernels, in which order) is made in launch.cu.
#include "tile.cuh"

namespace thc {
namespace cuda {
namespace detail {

// Whole blocks in one tile: load, transform, quantise, pack, error feedback, in one kernel.
THC_DEFINE_LAUNCH_TILE(kSmallTile, Src::kGrad, Dst::kQuant, float)
THC_DEFINE_LAUNCH_TILE(kSmallTile, Src::kGrad, Dst::kQuant, __half)
THC_DEFINE_LAUNCH_TILE(kSmallTile, Src::kGrad, Dst::kQuant, __nv_bfloat16)
THC_DEFINE_LAUNCH_TILE(kLargeTile, Src::kGrad, Dst::kQuant, float)
THC_DEFINE_LAUNCH_TILE(kLargeTile, Src::kGrad, Dst::kQuant, __half)
THC_DEFINE_LAUNCH_TILE(kLargeTile, Src::kGrad, Dst::kQuant, __nv_bfloat16)

// Larger blocks: the first pass (low bits) from the gradient ...
THC_DEFINE_LAUNCH_TILE(kSmallTile, Src::kGrad, Dst::kScratch, float)
THC_DEFINE_LAUNCH_TILE(kSmallTile, Src::kGrad, Dst::kScratch, __half)
THC_DEFINE_LAUNCH_TILE(kSmallTile, Src::kGrad, Dst::kScratch, __nv_bfloat16)
THC_DEFINE_LAUNCH_TILE(kLargeTile, Src::kGrad, Dst::kScratch, float)
THC_DEFINE_LAUNCH_TILE(kLargeTile, Src::kGrad, Dst::kScratch, __half)
THC_DEFINE_LAUNCH_TILE(kLargeTile, Src::kGrad, Dst::kScratch, __nv_bfloat16)
// ... the last pass (high bits) into the payload (and e into the workspace) ...
THC_DEFINE_LAUNCH_TILE(kSmallTile, Src::kScratch, Dst::kQuant, float)
THC_DEFINE_LAUNCH_TILE(kLargeTile, Src::kScratch, Dst::kQuant, float)
// ... and the last pass of the transform of e into the residual.
THC_DEFINE_LAUNCH_TILE(kSmallTile, Src::kScratch, Dst::kResidual, float)
THC_DEFINE_LAUNCH_TILE(kLargeTile, Src::kScratch, Dst::kResidual, float)

}  // namespace detail
}  // namespace cuda
}  // namespace thc
