// byteps-thc codec core: configuration checks and partition geometry (docs/ALGORITHM.md,
// "Configuration").
#include <cmath>
#include <sstream>

#include "thc/thc.h"

namespace thc {

namespace {
bool IsPow2(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }
uint64_t NextPow2(uint64_t x) {
  uint64_t p = 1;
  while (p < x) p <<= 1;
  return p;
}
}  // namespace

const char* StatusText(Status st) {
  switch (st) {
    case Status::kOk: return "";
    case Status::kNonFinite: return "NaN or Inf in the input or in max_norm";
    case Status::kBadArgument: return "bad argument (a size, length or count)";
    case Status::kOverflow:
      return "the Hadamard rotation overflowed float32 (Inf from finite values near FLT_MAX = "
             "3.4e38, or a max_norm so large that the error-feedback scale is Inf)";
  }
  return "unknown status";
}

std::string Validate(const Config& cfg) {
  std::ostringstream m;
  if (cfg.bits < 1 || cfg.bits > 8) {
    m << "bits must be in 1..8, got " << cfg.bits;
    return m.str();
  }
  const uint32_t levels = 1u << cfg.bits;
  if (cfg.granularity < levels - 1 || cfg.granularity > kMaxGranularity) {
    m << "granularity must be in " << (levels - 1) << ".." << kMaxGranularity
      << " for bits=" << cfg.bits << ", got " << cfg.granularity;
    return m.str();
  }
  if (!std::isfinite(cfg.clip) || !(cfg.clip > 0)) {
    m << "clip must be finite and > 0, got " << cfg.clip;
    return m.str();
  }
  if (cfg.rotation_block != 0 && !IsPow2(cfg.rotation_block)) {
    m << "rotation_block must be 0 (the default per partition) or a power of two, got "
      << cfg.rotation_block;
    return m.str();
  }
  if (cfg.rotation_block > kMaxRotationBlock) {
    m << "rotation_block must be at most 2^32, got " << cfg.rotation_block;
    return m.str();
  }
  if (cfg.block_scale && cfg.rotation_block != 0 && cfg.rotation_block < kTileAlign) {
    // a block's scale applies to whole kernel chunks, which start on the sign words' grid
    m << "block_scale needs rotation blocks of at least " << kTileAlign
      << " coordinates, got rotation_block=" << cfg.rotation_block;
    return m.str();
  }
  if (cfg.table.size() != levels) {
    m << "table must have 2^bits = " << levels << " entries, got " << cfg.table.size();
    return m.str();
  }
  if (cfg.table[0] != 0) {
    m << "table[0] must be 0, got " << cfg.table[0];
    return m.str();
  }
  for (uint32_t i = 1; i < levels; ++i) {
    if (cfg.table[i] <= cfg.table[i - 1]) {
      m << "table must be strictly increasing, but table[" << i << "] = " << cfg.table[i]
        << " <= table[" << (i - 1) << "] = " << cfg.table[i - 1];
      return m.str();
    }
  }
  if (cfg.table[levels - 1] != cfg.granularity) {
    m << "table[" << (levels - 1) << "] must equal granularity " << cfg.granularity << ", got "
      << cfg.table[levels - 1];
    return m.str();
  }
  return std::string();
}

uint64_t TiledSize(uint64_t d, uint64_t block, uint64_t* tail) {
  *tail = 0;
  const uint64_t full = d / block, rest = d % block;
  if (rest == 0) return full * block;
  const uint64_t last = NextPow2(rest);
  if (last >= block || block < kTileAlign) return (full + 1) * block;
  *tail = last;
  return full * block + last;
}

uint64_t AutoBlock(uint64_t d) {
  const uint64_t whole = NextPow2(d == 0 ? 1 : d);
  if (whole <= kAutoMinBlock) return whole;
  uint64_t best = whole, best_size = whole, tail;
  for (uint64_t b = whole; b >= kAutoMinBlock; b >>= 1) {
    const uint64_t size = TiledSize(d, b, &tail);
    if (size * kAutoPadDen <= d * kAutoPadNum) return b;
    if (size < best_size) {
      best = b;
      best_size = size;
    }
  }
  return best;
}

Geometry MakeGeometry(const Config& cfg, size_t d) {
  Geometry g;
  g.d = d;
  const uint64_t n = d == 0 ? 1 : d;
  const uint64_t full = NextPow2(n);
  uint64_t tail = 0;
  if (cfg.rotation_block == 0) {  // the default: tiled
    const uint64_t b = AutoBlock(n);
    g.block = (size_t)b;
    g.padded = d == 0 ? 0 : (size_t)TiledSize(d, b, &tail);
  } else {  // blocks of one size, the last one padded (what the CUDA kernels do)
    const uint64_t b = cfg.rotation_block < full ? cfg.rotation_block : full;
    g.block = (size_t)b;
    g.padded = d == 0 ? 0 : (d + g.block - 1) / g.block * g.block;
  }
  g.tail_block = (size_t)tail;
  g.payload_bytes = (g.padded * (size_t)cfg.bits + 7) / 8;
  return g;
}

size_t NumBlocks(const Geometry& geo) {
  if (geo.padded == 0) return 0;
  const size_t main = geo.padded - geo.tail_block;
  return main / geo.block + (geo.tail_block ? 1 : 0);
}

int LaneBits(const Config& cfg, uint32_t num_workers) {
  const uint64_t top = (uint64_t)num_workers * cfg.granularity;
  if (num_workers == 0) return 0;
  if (top <= 0xFFu) return 8;
  if (top <= 0xFFFFu) return 16;
  if (top <= 0xFFFFFFFFull) return 32;
  return 0;
}

}  // namespace thc
