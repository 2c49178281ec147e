// byteps-thc CUDA: the plain transform pass (workspace -> workspace), the middle passes of a
// rotation block larger than one tile, shared by encode and decode.
#include "tile.cuh"

namespace thc {
namespace cuda {
namespace detail {

THC_DEFINE_LAUNCH_TILE(kSmallTile, Src::kScratch, Dst::kScratch, float)
THC_DEFINE_LAUNCH_TILE(kLargeTile, Src::kScratch, Dst::kScratch, float)

}  // namespace detail
}  // namespace cuda
}  // namespace thc
