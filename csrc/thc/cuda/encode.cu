// byteps-thc CUDA: the encode family (docs/ALGORITHM.md, "Encode"): explicit instantiations of
// the tile kernel whose destination is the payload (and, with error feedback, the rotated state
// r, which is added to y and rewritten in the same kernel: no transform of the error). The first
// pass of a larger block (gradient -> workspace) is in rotate.cu, shared with the norm. The plan
// (which kernels, in which order) is made in launch.cu.
#include "tile.cuh"

namespace thc {
namespace cuda {
namespace detail {

// Whole blocks in one tile: load, transform, + r, quantise, pack, new state, in one kernel.
THC_DEFINE_LAUNCH_TILE(kSmallTile, Src::kGrad, Dst::kQuant, float)
THC_DEFINE_LAUNCH_TILE(kSmallTile, Src::kGrad, Dst::kQuant, __half)
THC_DEFINE_LAUNCH_TILE(kSmallTile, Src::kGrad, Dst::kQuant, __nv_bfloat16)
THC_DEFINE_LAUNCH_TILE(kLargeTile, Src::kGrad, Dst::kQuant, float)
THC_DEFINE_LAUNCH_TILE(kLargeTile, Src::kGrad, Dst::kQuant, __half)
THC_DEFINE_LAUNCH_TILE(kLargeTile, Src::kGrad, Dst::kQuant, __nv_bfloat16)

// Larger blocks: the last pass (high bits) into the payload and the state.
THC_DEFINE_LAUNCH_TILE(kSmallTile, Src::kScratch, Dst::kQuant, float)
THC_DEFINE_LAUNCH_TILE(kLargeTile, Src::kScratch, Dst::kQuant, float)

}  // namespace detail
}  // namespace cuda
}  // namespace thc
