// byteps-thc CUDA: the rotation y = Hu(sign * grad) (docs/ALGORITHM.md, encode steps 1-2), as
// the norm with error feedback and the multi-pass encode start it: explicit instantiations of
// the tile kernel whose source is the gradient into the workspace, and those that end in the
// norm's sum of y^2 (y = w + r). The plan (which kernels, in which order) is made in launch.cu.
#include "tile.cuh"

namespace thc::cuda::detail {

// The first pass (low bits) of a block larger than a tile, from the gradient (norm and encode).
THC_DEFINE_LAUNCH_TILES_PER_GRAD_TYPE(Src::kGrad, Dst::kScratch)

// The norm with error feedback, whole blocks in one tile: load, transform, + r, sum of y^2.
THC_DEFINE_LAUNCH_TILES_PER_GRAD_TYPE(Src::kGrad, Dst::kNorm)
// ... and its last pass for larger blocks.
THC_DEFINE_LAUNCH_TILES(Src::kScratch, Dst::kNorm, float)

}  // namespace thc::cuda::detail
