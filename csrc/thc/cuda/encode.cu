// byteps-thc CUDA: the encode family (docs/ALGORITHM.md, "Encode"): explicit instantiations of
// the tile kernel whose destination is the payload (and, with error feedback, the rotated state
// r, which is added to y and rewritten in the same kernel: no transform of the error). The first
// pass of a larger block (gradient -> workspace) is in rotate.cu, shared with the norm. The plan
// (which kernels, in which order) is made in launch.cu.
#include "tile.cuh"

namespace thc::cuda::detail {

// Whole blocks in one tile: load, transform, + r, quantise, pack, new state, in one kernel.
THC_DEFINE_LAUNCH_TILES_PER_GRAD_TYPE(Src::kGrad, Dst::kQuant)

// Larger blocks: the last pass (high bits) into the payload and the state.
THC_DEFINE_LAUNCH_TILES(Src::kScratch, Dst::kQuant, float)

// block_scale: the check of every block's M_k (and, with error feedback, its k1/k0) first.
THC_DEFINE_LAUNCH_SCALE_CHECK(Src::kGrad, Dst::kQuant)

}  // namespace thc::cuda::detail
