// byteps-thc codec core: the vector vocabulary of the kernel implementation headers.
//
// A kernel file sets THC_ISA (namespace name) and THC_W (floats per vector: 4 portable, 8 AVX2,
// 16 AVX-512), then includes its family's *_impl.h, which includes this. The vocabulary both
// cores share is common/simd.h; this adds THC's own (the binary64 squares of the norm, the sign
// stream). Everything here and in the impl headers lives in namespace thc::detail::THC_ISA with
// internal linkage, so the same source compiled with different -m flags can never be merged by
// the linker into one copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if !defined(THC_ISA) || !defined(THC_W)
#error "define THC_ISA and THC_W before including a kernel implementation header"
#endif

#define CODEC_SIMD_ISA THC_ISA
#define CODEC_SIMD_W THC_W
#include "common/simd.h"

// GCC 12 warns about the deliberately undefined source vector inside its own intrinsics
// (gathers, AVX-512's unmasked forms).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace thc {
namespace detail {
namespace THC_ISA {
namespace {

using ::codec::Hash32;
using ::codec::simd::THC_ISA::AsF;
using ::codec::simd::THC_ISA::AsU;
using ::codec::simd::THC_ISA::BroadcastF;
using ::codec::simd::THC_ISA::BroadcastU;
using ::codec::simd::THC_ISA::FlipSign;
using ::codec::simd::THC_ISA::Hash32V;
using ::codec::simd::THC_ISA::Iota;
using ::codec::simd::THC_ISA::IsFinite;
using ::codec::simd::THC_ISA::LoadF;
using ::codec::simd::THC_ISA::LoadU;
using ::codec::simd::THC_ISA::StoreF;
using ::codec::simd::THC_ISA::StoreU;
using ::codec::simd::THC_ISA::StreamF;
using ::codec::simd::THC_ISA::StreamFence;
using ::codec::simd::THC_ISA::vf;
using ::codec::simd::THC_ISA::vi;
using ::codec::simd::THC_ISA::vu;
using ::codec::simd::THC_ISA::W;

// x's low and high halves, each widened to binary64 (exact).
typedef double vdh __attribute__((vector_size(THC_W * 4)));  // W/2 doubles
inline void Widen(vf x, vdh* lo, vdh* hi) {
#if THC_W == 16
  *lo = (vdh)_mm512_cvtps_pd(_mm512_castps512_ps256((__m512)x));
  *hi = (vdh)_mm512_cvtps_pd(_mm512_extractf32x8_ps((__m512)x, 1));
#elif THC_W == 8
  *lo = (vdh)_mm256_cvtps_pd(_mm256_castps256_ps128((__m256)x));
  *hi = (vdh)_mm256_cvtps_pd(_mm256_extractf128_ps((__m256)x, 1));
#else
  for (int l = 0; l < W / 2; ++l) {
    (*lo)[l] = x[l];
    (*hi)[l] = x[l + W / 2];
  }
#endif
}

// acc0 += (double)x[lo half]^2, acc1 += (double)x[hi half]^2 (each square exact in binary64).
inline void AddSquares(vf x, vdh* acc0, vdh* acc1) {
  vdh lo, hi;
  Widen(x, &lo, &hi);
  *acc0 = *acc0 + lo * lo;
  *acc1 = *acc1 + hi * hi;
}

// Sign bits (bit 31 set where neg_j) of elements j0 .. j0+W-1, j0 a multiple of W (W <= 32), so
// they come from one 32-bit sign word.
inline vu SignBitsV(uint32_t sign_key, uint64_t j0) {
  const uint32_t word = Hash32(sign_key ^ (uint32_t)(j0 >> 5));
  const uint32_t shift = (uint32_t)(j0 & 31);
  return ((BroadcastU(word >> shift) >> Iota()) & 1u) << 31;
}
inline uint32_t SignBit(uint32_t sign_key, uint64_t j) {
  return ((Hash32(sign_key ^ (uint32_t)(j >> 5)) >> (j & 31)) & 1u) << 31;
}

}  // namespace
}  // namespace THC_ISA
}  // namespace detail
}  // namespace thc
