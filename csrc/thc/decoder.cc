// byteps-thc codec core: the decoder (docs/ALGORITHM.md, "Decode").
//
// Chunks of whole blocks: sums -> z, transform, sign. The transform runs in a per-thread,
// cache-line aligned scratch buffer (the caller's output may be misaligned for vector loads, and
// the padded tail does not fit it); the signed result goes to the output.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "thc/internal.h"
#include "thc/thc.h"

namespace thc {

Status Decode(const Config& cfg, size_t d, const void* sums, int lane_bits, uint32_t num_workers,
              double max_norm, float* out) {
  if (!std::isfinite(max_norm)) return Status::kNonFinite;
  if (max_norm < 0 || num_workers == 0 ||
      (lane_bits != 8 && lane_bits != 16 && lane_bits != 32))
    return Status::kBadArgument;
  if (max_norm == 0) {
    std::fill(out, out + d, 0.0f);
    return Status::kOk;
  }
  const Geometry geo = MakeGeometry(cfg, d);
  const detail::Kernels& k = detail::ActiveKernels();
  const double T = cfg.clip, g = cfg.granularity, M = max_norm;
  const double sd = std::sqrt((double)geo.padded), sb = std::sqrt((double)geo.block);
  const float m1 = (float)(2.0 * T / g / (double)num_workers * M / sd / sb);
  const float m0 = (float)(-T * M / sd / sb);
  const uint32_t key = SignKey(cfg.seed);
  const size_t chunk = std::max(geo.block, detail::kChunk);
  const size_t lane_bytes = (size_t)lane_bits / 8;
  thread_local detail::AlignedArray<float> scratch;
  if (scratch.size() < std::min(chunk, geo.padded)) scratch.resize(std::min(chunk, geo.padded));
  for (size_t j0 = 0; j0 < geo.padded; j0 += chunk) {
    const size_t n = std::min(chunk, geo.padded - j0);
    const size_t nvalid = j0 < d ? std::min(n, d - j0) : 0;
    if (nvalid == 0) break;
    k.decode_chunk(static_cast<const uint8_t*>(sums) + j0 * lane_bytes, lane_bits, nvalid, n, j0,
                   geo.block, key, m1, m0, scratch.data(), out + j0);
  }
  return Status::kOk;
}

}  // namespace thc
