// byteps-thc codec core: the sums on the way down, in exactly the bits they need
// (docs/ALGORITHM.md, "Publish"). The server aggregates in lanes of 8/16/32 bits (the fastest
// adds) and publishes the sums as an LSB-first stream of SumBits() = ceil(log2(n*g + 1)) bits
// each; every worker unpacks them chunk by chunk into lanes again and decodes those.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "thc/internal.h"
#include "thc/thc.h"

namespace thc {

namespace {

template <class L>
void PackLanes(const L* s, size_t n, int w, uint8_t* out) {
  uint64_t acc = 0;  // bits not yet stored, LSB first; fewer than 32 between values
  int have = 0;
  for (size_t i = 0; i < n; ++i) {
    acc |= (uint64_t)s[i] << have;
    have += w;
    if (have >= 32) {
      const uint32_t word = (uint32_t)acc;
      std::memcpy(out, &word, 4);  // little-endian hosts only (x86-64, aarch64)
      out += 4;
      acc >>= 32;
      have -= 32;
    }
  }
  for (; have > 0; have -= 8, acc >>= 8) *out++ = (uint8_t)acc;
}

template <class L>
void UnpackLanes(const uint8_t* in, size_t bytes, int w, size_t n, L* s) {
  const uint64_t mask = w == 32 ? 0xFFFFFFFFull : ((uint64_t{1} << w) - 1);
  uint64_t acc = 0;
  int have = 0;
  size_t pos = 0;
  for (size_t i = 0; i < n; ++i) {
    if (have < w) {  // refill: 4 bytes, or what is left at the end of the stream
      uint32_t word = 0;
      const size_t take = std::min<size_t>(4, bytes - pos);
      std::memcpy(&word, in + pos, take);
      pos += take;
      acc |= (uint64_t)word << have;
      have += 32;
    }
    s[i] = (L)(acc & mask);
    acc >>= w;
    have -= w;
  }
}

}  // namespace

int SumBits(const Config& cfg, uint32_t num_workers) {
  if (LaneBits(cfg, num_workers) == 0) return 0;
  uint64_t top = (uint64_t)num_workers * cfg.granularity;
  int w = 0;
  while (top) {
    ++w;
    top >>= 1;
  }
  return w;
}

size_t PackedSumsBytes(size_t n, int sum_bits) { return (n * (size_t)sum_bits + 7) / 8; }

bool PackSums(const void* lanes, int lane_bits, size_t n, int sum_bits, uint8_t* out) {
  if (sum_bits < 1 || sum_bits > lane_bits) return false;
  switch (lane_bits) {
    case 8: PackLanes(static_cast<const uint8_t*>(lanes), n, sum_bits, out); return true;
    case 16: PackLanes(static_cast<const uint16_t*>(lanes), n, sum_bits, out); return true;
    case 32: PackLanes(static_cast<const uint32_t*>(lanes), n, sum_bits, out); return true;
  }
  return false;
}

bool UnpackSums(const uint8_t* packed, size_t bytes, int sum_bits, size_t n, int lane_bits,
                void* lanes) {
  if (sum_bits < 1 || sum_bits > lane_bits || bytes < PackedSumsBytes(n, sum_bits)) return false;
  switch (lane_bits) {
    case 8: UnpackLanes(packed, bytes, sum_bits, n, static_cast<uint8_t*>(lanes)); return true;
    case 16: UnpackLanes(packed, bytes, sum_bits, n, static_cast<uint16_t*>(lanes)); return true;
    case 32: UnpackLanes(packed, bytes, sum_bits, n, static_cast<uint32_t*>(lanes)); return true;
  }
  return false;
}

}  // namespace thc
