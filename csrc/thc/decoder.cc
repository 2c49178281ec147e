// byteps-thc codec core: the decoder (docs/ALGORITHM.md, "Decode"), from lanes of sums or from
// the server's packed reply (sums.cc). Both are one stream of w-bit sums (lanes: w = the lane
// width), which the kernels unpack in the transform's first pass (dequantize_impl.h).
//
// Chunks of whole blocks: sums -> z, transform, sign. The transform runs in a per-thread,
// cache-line aligned scratch buffer (the caller's output may be misaligned for vector loads, and
// the padded tail does not fit it); the signed result goes to the output. With threads, the
// chunks are split over them (parallel.h); each writes only its own coordinates of the output.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "thc/internal.h"
#include "thc/parallel.h"
#include "thc/thc.h"

namespace thc {

namespace {

// The decode of d values from the stream of `bytes` bytes at sums, sum_bits per sum; with
// block_norms (block_scale: one max norm per block, a chunk per block) each block's scales
// from its own M_k as a partition of d_pad = B, else max_norm's of the partition.
void DecodeRuns(const Config& cfg, const Geometry& geo, const uint8_t* sums, size_t bytes,
                int sum_bits, uint32_t num_workers, double max_norm, const double* block_norms,
                bool total, float* out, int threads) {
  const detail::Kernels& k = detail::ActiveKernels();
  const size_t d = geo.d;
  const double T = cfg.clip, g = cfg.granularity, M = max_norm;
  const double sd = std::sqrt((double)geo.padded);
  const uint32_t key = SignKey(cfg.seed);
  const size_t chunk = block_norms ? geo.block : std::max(geo.block, detail::kChunk);
  detail::Run runs[2];
  const int nruns = detail::Runs(geo.padded, geo.block, geo.tail_block, runs);
  float m1[2], m0[2];
  size_t first[3] = {0, 0, 0};  // chunks of run r: [first[r], first[r + 1])
  for (int r = 0; r < nruns; ++r) {
    const double sb = std::sqrt((double)runs[r].block);  // each run scales by its own block
    const double n = num_workers;  // total: the sum's estimate, n folded into the scale
    m1[r] = total ? (float)(2.0 * T / g * M / sd / sb) : (float)(2.0 * T / g / n * M / sd / sb);
    m0[r] = total ? (float)(-T * n * M / sd / sb) : (float)(-T * M / sd / sb);
    // chunks that hold real coordinates (the padding past d is not decoded)
    const size_t end = std::min(runs[r].end, std::max(runs[r].start, d));
    first[r + 1] = first[r] + (end - runs[r].start + chunk - 1) / chunk;
  }
  // Several chunks go to the threads; a partition of one chunk (one block) runs its kernel on
  // them instead.
  const size_t tasks = first[nruns];
  const int t = detail::UsefulThreads(threads, (size_t)-1, d);
  const int outer = tasks >= 2 ? (int)std::min<size_t>((size_t)t, tasks) : 1;
  const int inner = tasks >= 2 ? 1 : t;
  detail::ParallelTasks(outer, tasks, [&](size_t i) {
    const int r = i < first[1] ? 0 : 1;
    const size_t j0 = runs[r].start + (i - first[r]) * chunk;
    const size_t n = std::min(chunk, runs[r].end - j0);
    const size_t nvalid = std::min(n, d - j0);
    float c1 = m1[r], c0 = m0[r];
    if (block_norms) {  // chunk i is block i (runs[0] starts at 0 and holds whole blocks)
      const double Mk = block_norms[i], sb = std::sqrt((double)runs[r].block), nw = num_workers;
      if (Mk == 0) {
        std::fill(out + j0, out + j0 + nvalid, 0.0f);
        return;
      }
      c1 = total ? (float)(2.0 * T / g * Mk / sb / sb) : (float)(2.0 * T / g / nw * Mk / sb / sb);
      c0 = total ? (float)(-T * nw * Mk / sb / sb) : (float)(-T * Mk / sb / sb);
    }
    thread_local detail::AlignedArray<float> scratch;
    if (scratch.size() < std::min(chunk, geo.padded)) scratch.resize(std::min(chunk, geo.padded));
    const size_t at = j0 * (size_t)sum_bits / 8;  // j0 is a multiple of 8: a whole byte
    k.decode_chunk(sums + at, sum_bits, bytes - at, nvalid, n, j0, runs[r].block, key, c1, c0,
                   scratch.data(), out + j0, inner);
  });
}

// The block norms of a block_scale decode: count == NumBlocks(geo), each finite and >= 0.
Status CheckBlockNorms(const Config& cfg, const Geometry& geo, const double* m, size_t count) {
  if (!cfg.block_scale || count != NumBlocks(geo)) return Status::kBadArgument;
  for (size_t i = 0; i < count; ++i)
    if (!std::isfinite(m[i])) return Status::kNonFinite;
  for (size_t i = 0; i < count; ++i)
    if (m[i] < 0) return Status::kBadArgument;
  return Status::kOk;
}

}  // namespace

Status Decode(const Config& cfg, size_t d, const void* sums, int lane_bits, uint32_t num_workers,
              double max_norm, float* out, int threads) {
  if (!std::isfinite(max_norm)) return Status::kNonFinite;
  if (max_norm < 0 || num_workers == 0 || (lane_bits != 8 && lane_bits != 16 && lane_bits != 32) ||
      cfg.block_scale)
    return Status::kBadArgument;
  if (max_norm == 0) {
    std::fill(out, out + d, 0.0f);
    return Status::kOk;
  }
  const Geometry geo = MakeGeometry(cfg, d);
  DecodeRuns(cfg, geo, static_cast<const uint8_t*>(sums), geo.padded * (size_t)lane_bits / 8,
             lane_bits, num_workers, max_norm, nullptr, false, out, threads);
  return Status::kOk;
}

Status DecodeBlocks(const Config& cfg, size_t d, const void* sums, int lane_bits,
                    uint32_t num_workers, const double* max_norms, size_t count, float* out,
                    int threads) {
  if (num_workers == 0 || (lane_bits != 8 && lane_bits != 16 && lane_bits != 32))
    return Status::kBadArgument;
  const Geometry geo = MakeGeometry(cfg, d);
  const Status st = CheckBlockNorms(cfg, geo, max_norms, count);
  if (st != Status::kOk) return st;
  DecodeRuns(cfg, geo, static_cast<const uint8_t*>(sums), geo.padded * (size_t)lane_bits / 8,
             lane_bits, num_workers, 0, max_norms, false, out, threads);
  return Status::kOk;
}

Status DecodePacked(const Config& cfg, size_t d, const uint8_t* packed, size_t bytes, int sum_bits,
                    uint32_t num_workers, double max_norm, float* out, bool total, int threads) {
  if (!std::isfinite(max_norm)) return Status::kNonFinite;
  const int lane_bits = LaneBits(cfg, num_workers);
  if (max_norm < 0 || num_workers == 0 || lane_bits == 0 || sum_bits != SumBits(cfg, num_workers) ||
      cfg.block_scale)
    return Status::kBadArgument;
  const Geometry geo = MakeGeometry(cfg, d);
  if (bytes != PackedSumsBytes(geo.padded, sum_bits)) return Status::kBadArgument;
  if (max_norm == 0) {
    std::fill(out, out + d, 0.0f);
    return Status::kOk;
  }
  DecodeRuns(cfg, geo, packed, bytes, sum_bits, num_workers, max_norm, nullptr, total, out,
             threads);
  return Status::kOk;
}

Status DecodePackedBlocks(const Config& cfg, size_t d, const uint8_t* packed, size_t bytes,
                          int sum_bits, uint32_t num_workers, const double* max_norms, size_t count,
                          float* out, bool total, int threads) {
  const int lane_bits = LaneBits(cfg, num_workers);
  if (num_workers == 0 || lane_bits == 0 || sum_bits != SumBits(cfg, num_workers))
    return Status::kBadArgument;
  const Geometry geo = MakeGeometry(cfg, d);
  if (bytes != PackedSumsBytes(geo.padded, sum_bits)) return Status::kBadArgument;
  const Status st = CheckBlockNorms(cfg, geo, max_norms, count);
  if (st != Status::kOk) return st;
  DecodeRuns(cfg, geo, packed, bytes, sum_bits, num_workers, 0, max_norms, total, out, threads);
  return Status::kOk;
}

}  // namespace thc
