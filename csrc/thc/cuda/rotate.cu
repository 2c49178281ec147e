// byteps-thc CUDA: the rotation y = Hu(sign * grad) (docs/ALGORITHM.md, encode steps 1-2), as
// the norm with error feedback and the multi-pass encode start it: explicit instantiations of
// the tile kernel whose source is the gradient into the workspace, and those that end in the
// norm's sum of y^2 (y = w + r). The plan (which kernels, in which order) is made in launch.cu.
#include "tile.cuh"

namespace thc {
namespace cuda {
namespace detail {

// The first pass (low bits) of a block larger than a tile, from the gradient (norm and encode).
THC_DEFINE_LAUNCH_TILE(kSmallTile, Src::kGrad, Dst::kScratch, float)
THC_DEFINE_LAUNCH_TILE(kSmallTile, Src::kGrad, Dst::kScratch, __half)
THC_DEFINE_LAUNCH_TILE(kSmallTile, Src::kGrad, Dst::kScratch, __nv_bfloat16)
THC_DEFINE_LAUNCH_TILE(kLargeTile, Src::kGrad, Dst::kScratch, float)
THC_DEFINE_LAUNCH_TILE(kLargeTile, Src::kGrad, Dst::kScratch, __half)
THC_DEFINE_LAUNCH_TILE(kLargeTile, Src::kGrad, Dst::kScratch, __nv_bfloat16)

// The norm with error feedback, whole blocks in one tile: load, transform, + r, sum of y^2.
THC_DEFINE_LAUNCH_TILE(kSmallTile, Src::kGrad, Dst::kNorm, float)
THC_DEFINE_LAUNCH_TILE(kSmallTile, Src::kGrad, Dst::kNorm, __half)
THC_DEFINE_LAUNCH_TILE(kSmallTile, Src::kGrad, Dst::kNorm, __nv_bfloat16)
THC_DEFINE_LAUNCH_TILE(kLargeTile, Src::kGrad, Dst::kNorm, float)
THC_DEFINE_LAUNCH_TILE(kLargeTile, Src::kGrad, Dst::kNorm, __half)
THC_DEFINE_LAUNCH_TILE(kLargeTile, Src::kGrad, Dst::kNorm, __nv_bfloat16)
// ... and its last pass for larger blocks.
THC_DEFINE_LAUNCH_TILE(kSmallTile, Src::kScratch, Dst::kNorm, float)
THC_DEFINE_LAUNCH_TILE(kLargeTile, Src::kScratch, Dst::kNorm, float)

}  // namespace detail
}  // namespace cuda
}  // namespace thc
