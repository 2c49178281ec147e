// byteps-thc CUDA: the plain transform pass (workspace -> workspace), the middle passes of a
// rotation block larger than one tile, shared by encode and decode.
#include "tile.cuh"

namespace thc::cuda::detail {

THC_DEFINE_LAUNCH_TILES(Src::kScratch, Dst::kScratch, float)

}  // namespace thc::cuda::detail
