// byteps-thc codec core: the sums on the way down, in exactly the bits they need
// (docs/ALGORITHM.md, "Publish"). The server aggregates in lanes of 8/16/32 bits (the fastest
// adds) and publishes the sums as an LSB-first stream of SumBits() = ceil(log2(n*g + 1)) bits
// each; every worker unpacks them in its decode's first pass (dequantize_impl.h).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "thc/internal.h"
#include "thc/thc.h"

namespace thc {

namespace {

// The stream of n values of w bits, LSB first, one value at a time (bits above w dropped).
template <class L>
void PackScalar(const L* s, size_t n, int w, uint8_t* out) {
  const uint64_t mask = w == 32 ? 0xFFFFFFFFull : ((uint64_t{1} << w) - 1);
  uint64_t acc = 0;  // bits not yet stored, LSB first; fewer than 32 between values
  int have = 0;
  for (size_t i = 0; i < n; ++i) {
    acc |= ((uint64_t)s[i] & mask) << have;
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

// Eight values of byte lanes (w < 8) or of 16-bit lanes (w < 16) at a time, as 64-bit words:
// neighbours merge pairwise (v0 | v1 << w, then pairs of those, ...), so eight values become
// their 8w bits, w whole bytes. Each group is stored with one wide store and the next group's
// store starts w bytes later and overwrites the zeros above; a tail too close to the end of
// `out` goes through PackScalar. The same stream as PackScalar.
constexpr uint64_t kLo8 = 0x00FF00FF00FF00FFull, kLo16 = 0x0000FFFF0000FFFFull;

inline uint64_t Merge16(uint64_t x, int w) {  // 4 values in 16-bit slots -> 4w bits
  x = (x & kLo16) | ((x >> 16) & kLo16) << w;
  return (x & 0xFFFFFFFFull) | (x >> 32) << (2 * w);
}

void PackBytes(const uint8_t* s, size_t n, int w, uint8_t* out) {
  const uint64_t m = 0x0101010101010101ull * ((1u << w) - 1);
  const size_t total = (n * (size_t)w + 7) / 8;
  size_t i = 0, at = 0;
  for (; i + 8 <= n && at + 8 <= total; i += 8, at += (size_t)w) {
    uint64_t x;
    std::memcpy(&x, s + i, 8);
    x &= m;
    x = (x & kLo8) | ((x >> 8) & kLo8) << w;  // 4 values of 2w bits in 16-bit slots
    x = Merge16(x, 2 * w);
    std::memcpy(out + at, &x, 8);
  }
  PackScalar(s + i, n - i, w, out + at);
}

void PackHalves(const uint16_t* s, size_t n, int w, uint8_t* out) {
  const uint64_t m = 0x0001000100010001ull * ((1u << w) - 1);
  const size_t total = (n * (size_t)w + 7) / 8;
  size_t i = 0, at = 0;
  for (; i + 8 <= n && at + 16 <= total; i += 8, at += (size_t)w) {
    uint64_t x[2];
    std::memcpy(x, s + i, 16);
    const unsigned __int128 lo = Merge16(x[0] & m, w), hi = Merge16(x[1] & m, w);
    const unsigned __int128 v = lo | hi << (4 * w);
    std::memcpy(out + at, &v, 16);
  }
  PackScalar(s + i, n - i, w, out + at);
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
  if (sum_bits == lane_bits && (lane_bits == 8 || lane_bits == 16 || lane_bits == 32)) {
    std::memcpy(out, lanes, n * (size_t)lane_bits / 8);  // the stream is the lanes
    return true;
  }
  switch (lane_bits) {
    case 8: PackBytes(static_cast<const uint8_t*>(lanes), n, sum_bits, out); return true;
    case 16: PackHalves(static_cast<const uint16_t*>(lanes), n, sum_bits, out); return true;
    case 32: PackScalar(static_cast<const uint32_t*>(lanes), n, sum_bits, out); return true;
  }
  return false;
}

}  // namespace thc
