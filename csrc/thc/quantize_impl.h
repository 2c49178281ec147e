// byteps-thc codec core: the encode kernel family (included by quantize*.cc).
//
// LoadSigned (steps 1 and 3 before the transform), Quantize (steps 4, 5 and the error of 7),
// Pack (step 6), SumSquares (the norm), and EncodeChunk, the whole of steps 1-7 for a chunk of
// blocks: fused into the transforms' passes (transform.h) where it can, these kernels one after
// another where it cannot. docs/ALGORITHM.md is the definition; each float
// operation below is one binary32 operation in the order written there.
#pragma once

#include <algorithm>
#include <cmath>

#include "internal.h"
#include "transform.h"

namespace thc {
namespace detail {
namespace THC_ISA {
namespace {

// maxps/minps return the second operand unless the comparison holds: exactly a > b ? a : b.
inline vf Max(vf a, vf b) {
#if THC_W == 16
  return (vf)_mm512_max_ps((__m512)a, (__m512)b);
#elif THC_W == 8
  return (vf)_mm256_max_ps((__m256)a, (__m256)b);
#else
  return (a > b) ? a : b;
#endif
}
inline vf Min(vf a, vf b) {
#if THC_W == 16
  return (vf)_mm512_min_ps((__m512)a, (__m512)b);
#elif THC_W == 8
  return (vf)_mm256_min_ps((__m256)a, (__m256)b);
#else
  return (a < b) ? a : b;
#endif
}

inline vu NonFiniteMask(vf x) { return (vu)((AsU(x) & 0x7F800000u) == 0x7F800000u); }

// ---- table lookups: gathers where the ISA has them, lanes one by one otherwise ----
inline vi Gather32(const int32_t* base, vi idx) {
#if THC_W == 16
  return (vi)_mm512_i32gather_epi32((__m512i)idx, base, 4);
#elif THC_W == 8
  return (vi)_mm256_i32gather_epi32((const int*)base, (__m256i)idx, 4);
#else
  vi r;
  for (int l = 0; l < W; ++l) r[l] = base[idx[l]];
  return r;
#endif
}
inline vf GatherF(const float* base, vi idx) {
#if THC_W == 16
  return (vf)_mm512_i32gather_ps((__m512i)idx, base, 4);
#elif THC_W == 8
  return (vf)_mm256_i32gather_ps(base, (__m256i)idx, 4);
#else
  vf r;
  for (int l = 0; l < W; ++l) r[l] = base[idx[l]];
  return r;
#endif
}

// Any table: lvl[] when present, else a binary search over tbl (largest i with TBL[i] <= k).
struct GatherLut {
  const int32_t* lvl;
  const int32_t* tbl;
  const float* tblf;
  const float* ig24;
  const float* efr;
  int levels;
  explicit GatherLut(const QuantParams& q)
      : lvl(q.lvl), tbl(q.tbl), tblf(q.tblf), ig24(q.ig24), efr(q.efr), levels(q.levels) {}
  vi Level(vi k) const {
    if (lvl) return Gather32(lvl, k);
    vi i = vi{};
    for (int step = levels / 2; step >= 1; step /= 2) {
      const vi cand = i + step;
      i = (Gather32(tbl, cand) <= k) ? cand : i;
    }
    const vi cap = vi{} + (levels - 2);
    return (i < cap) ? i : cap;
  }
  vf Tblf(vi i) const { return GatherF(tblf, i); }
  vf Ig24(vi i) const { return GatherF(ig24, i); }
  vf Efr(vi i) const { return GatherF(efr, i); }
};

// At most 16 levels and g < 32: every lookup is a register permute.
#if THC_W == 16
struct PermLut {
  __m512i lvl_lo, lvl_hi;
  __m512 tblf, ig24, efr;
  explicit PermLut(const QuantParams& p) {
    int32_t lv[32] = {0};
    float tf[16] = {0}, g[16] = {0}, r[16] = {0};
    for (int k = 0; k < 32 && p.tbl[p.levels - 1] >= (int32_t)k; ++k) lv[k] = p.lvl[k];
    for (int i = 0; i < p.levels; ++i) {
      tf[i] = p.tblf[i];
      g[i] = p.ig24[i];
      r[i] = p.efr ? p.efr[i] : 0.0f;
    }
    lvl_lo = _mm512_loadu_si512(lv);
    lvl_hi = _mm512_loadu_si512(lv + 16);
    tblf = _mm512_loadu_ps(tf);
    ig24 = _mm512_loadu_ps(g);
    efr = _mm512_loadu_ps(r);
  }
  vi Level(vi k) const { return (vi)_mm512_permutex2var_epi32(lvl_lo, (__m512i)k, lvl_hi); }
  vf Tblf(vi i) const { return (vf)_mm512_permutexvar_ps((__m512i)i, tblf); }
  vf Ig24(vi i) const { return (vf)_mm512_permutexvar_ps((__m512i)i, ig24); }
  vf Efr(vi i) const { return (vf)_mm512_permutexvar_ps((__m512i)i, efr); }
};
#elif THC_W == 8
// AVX2 has one lane permute port, so the lookups that fit elsewhere go elsewhere: the level and
// TBL (values < 32) are byte-table lookups (vpshufb, two ports), and the error's level value is
// computed as step 7 writes it, float(TBL[q]) * k1 + k0 (the same two roundings that built the
// efr table), so that only IG24 is a pair of permutes.
struct PermLut {
  __m256i lvl_lo, lvl_hi;  // lvl[k] for k < 16 and lvl[16 + k], bytes, in both 128-bit halves
  __m256i tblb;            // TBL[i] as bytes (TBL[0] = 0), in both halves
  __m256 g[2];
  __m256 k1, k0;
  explicit PermLut(const QuantParams& p) {
    uint8_t l[32] = {0}, t[16] = {0};
    float q[16] = {0};
    for (int k = 0; k < 32 && p.tbl[p.levels - 1] >= (int32_t)k; ++k) l[k] = (uint8_t)p.lvl[k];
    for (int i = 0; i < p.levels; ++i) {
      t[i] = (uint8_t)p.tbl[i];
      q[i] = p.ig24[i];
    }
    lvl_lo = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)l));
    lvl_hi = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(l + 16)));
    tblb = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)t));
    for (int j = 0; j < 2; ++j) g[j] = _mm256_loadu_ps(q + 8 * j);
    k1 = _mm256_set1_ps(p.k1);
    k0 = _mm256_set1_ps(p.k0);
  }
  // Selects by bit 3 of the index, moved into the sign bit for blendv.
  static __m256 Pick16(const __m256* t, __m256i i) {
    const __m256 a = _mm256_permutevar8x32_ps(t[0], i), b = _mm256_permutevar8x32_ps(t[1], i);
    return _mm256_blendv_ps(a, b, _mm256_castsi256_ps(_mm256_slli_epi32(i, 28)));
  }
  // k < 32, so bytes 1-3 of a lane are 0. vpshufb gives 0 for an index byte with bit 7 set:
  // byte 0 + 0x70 has it unless k < 16, byte 0 - 16 unless k >= 16, and bytes 1-3 + 0x80
  // always; the two lookups, or-ed, are lvl[k] in byte 0 and zeros above.
  vi Level(vi k) const {
    const __m256i ki = (__m256i)k;
    const __m256i lo =
        _mm256_shuffle_epi8(lvl_lo, _mm256_add_epi8(ki, _mm256_set1_epi32((int)0x80808070u)));
    const __m256i hi =
        _mm256_shuffle_epi8(lvl_hi, _mm256_add_epi8(ki, _mm256_set1_epi32((int)0x808080F0u)));
    return (vi)_mm256_or_si256(lo, hi);
  }
  // i < 16: byte 0 indexes TBL, bytes 1-3 (0) pick TBL[0] = 0.
  vf Tblf(vi i) const { return (vf)_mm256_cvtepi32_ps(_mm256_shuffle_epi8(tblb, (__m256i)i)); }
  vf Ig24(vi i) const { return (vf)Pick16(g, (__m256i)i); }
  vf Efr(vi i) const {
    const vf r = Tblf(i) * (vf)k1;
    return r + (vf)k0;
  }
};
#endif

// Low bytes of the W lanes (values < 256) to out[0, W).
inline void StoreIdx(uint8_t* out, vi q) {
#if THC_W == 8
  const __m256i b = _mm256_shuffle_epi8(
      (__m256i)q, _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0,
                                   4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1));
  const __m256i c = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1));
  _mm_storel_epi64((__m128i*)out, _mm256_castsi256_si128(c));
#else
  typedef uint8_t v8 __attribute__((vector_size(THC_W)));
  const v8 b = __builtin_convertvector(q, v8);
  std::memcpy(out, &b, sizeof b);
#endif
}

// The largest lane of v (unsigned order).
inline uint32_t MaxLane(vu v) {
  uint32_t r = 0;
  for (int l = 0; l < W; ++l) r = v[l] > r ? v[l] : r;
  return r;
}

// Scalar twin for tails, same operations.
inline uint8_t QuantizeOne(float* yp, uint64_t j, const QuantParams& p) {
  const float y = *yp;
  float t = y * p.c1;
  t = t + p.c0;
  t = t > 0.0f ? t : 0.0f;
  t = t < p.gmax ? t : p.gmax;
  const int32_t k = (int32_t)t;
  int32_t i;
  if (p.lvl) {
    i = p.lvl[k];
  } else {
    i = 0;
    for (int step = p.levels / 2; step >= 1; step /= 2)
      if (p.tbl[i + step] <= k) i += step;
    if (i > p.levels - 2) i = p.levels - 2;
  }
  float pr = t - p.tblf[i];
  pr = pr * p.ig[i];
  const float u = (float)(Hash32(p.round_key ^ (uint32_t)j) >> 8) * 0x1p-24f;
  const int32_t q = i + (u < pr ? 1 : 0);
  if (p.ef) {
    float r = p.tblf[q] * p.k1;
    r = r + p.k0;
    *yp = y - r;
  }
  return (uint8_t)q;
}

// lv + 1 where u < p, else lv (the rounding decision of step 5).
inline vi AddIfLess(vi lv, vf u, vf p) {
#if THC_W == 16
  return (vi)_mm512_mask_add_epi32((__m512i)lv,
                                   _mm512_cmp_ps_mask((__m512)u, (__m512)p, _CMP_LT_OQ),
                                   (__m512i)lv, _mm512_set1_epi32(1));
#else
  return lv - (vi)(u < p);
#endif
}

// The vector form of step 5, with the same bits as QuantizeOne and fewer operations:
//  * hash32(key ^ j) starts with x ^= x >> 16; for the W lanes of one vector (j a multiple of W,
//    W | 2^16) (key ^ j) >> 16 is one value, so x ^ (x >> 16) = j ^ mix with
//    mix = key ^ (key >> 16) ^ (j >> 16), one constant per 2^16 elements (HashMix);
//  * u < p  <=>  float(h >> 8) < p * 2^24: both sides scaled by a power of two, exactly (p is
//    0 or at least 2^-49, far from subnormal, and at most ~1), and p * 2^24 is computed as
//    (t - TBL[i]) * (IG[i] * 2^24) with the same single rounding;
//  * the error's level value float(TBL[q]) * k1 + k0 depends on q only: a table (efr).
inline uint32_t HashMix(uint32_t key, uint32_t j) { return key ^ (key >> 16) ^ (j >> 16); }

template <bool kEf, class Lut>
struct QuantizeBody {
  vf c1, c0, g, zero;
  Lut lut;
  QuantizeBody(const QuantParams& p, const Lut& l)
      : c1(BroadcastF(p.c1)), c0(BroadcastF(p.c0)), g(BroadcastF(p.gmax)), zero(vf{}), lut(l) {}
  // Indices of the W values yv, elements j..j+W-1 given as jx = j ^ HashMix(key, j) per lane;
  // with kEf, *err gets the error e.
  inline vi operator()(vf yv, vu jx, vf* err) const {
    vf t = yv * c1;
    t = t + c0;
    t = Max(t, zero);  // t > 0 ? t : 0 (NaN -> 0)
    t = Min(t, g);     // t < g ? t : g
    const vi k = __builtin_convertvector(t, vi);
    const vi lv = lut.Level(k);
    vf pr = t - lut.Tblf(lv);
    pr = pr * lut.Ig24(lv);
    vu h = jx * 0x7FEB352Du;
    h ^= h >> 15;
    h *= 0x846CA68Bu;
    h ^= h >> 16;
    const vf u = __builtin_convertvector((vi)(h >> 8), vf);
    const vi q = AddIfLess(lv, u, pr);
    if constexpr (kEf) *err = yv - lut.Efr(q);
    return q;
  }
};

// With error feedback returns max |e| as float bits (the exact bound of the new residual, taken
// while e is in registers); 0 without.
template <bool kEf, class Lut>
uint32_t QuantizeLoop(float* y, size_t n, uint64_t j0, const QuantParams& p, uint8_t* idx,
                      const Lut lut) {
  const QuantizeBody<kEf, Lut> body(p, lut);
  vu emax = vu{};
  size_t i = 0;
  // Vectors, in runs that do not cross a multiple of 2^16 (one HashMix each). The portable
  // build stays scalar: without gathers, per-lane lookups and variable shifts, its 4-wide
  // vectors are slower than plain code.
  if constexpr (W >= 8)
    while (n - i >= (size_t)W) {
      const uint32_t js = (uint32_t)(j0 + i);
      const size_t run_end = std::min(n, i + ((size_t)0x10000 - (js & 0xFFFFu)));
      const vu mix = BroadcastU(HashMix(p.round_key, js));
      vu jv = BroadcastU(js) + Iota();
      auto one = [&](size_t at) {
        vf e;
        const vi q = body(LoadF(y + at), jv ^ mix, &e);
        if constexpr (kEf) {
          StoreF(y + at, e);
          const vu a = AsU(e) & 0x7FFFFFFFu;
          emax = a > emax ? a : emax;
        }
        jv += (uint32_t)W;
        return q;
      };
#if THC_W == 16
      // Four vectors at a time: pack 64 indices into one store (vpmovdb to memory is slow).
      const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
      for (; i + 4 * W <= run_end; i += 4 * W) {
        const vi q0 = one(i), q1 = one(i + W), q2 = one(i + 2 * W), q3 = one(i + 3 * W);
        const __m512i a = _mm512_packus_epi32((__m512i)q0, (__m512i)q1);
        const __m512i b = _mm512_packus_epi32((__m512i)q2, (__m512i)q3);
        _mm512_storeu_si512(idx + i, _mm512_permutexvar_epi32(order, _mm512_packus_epi16(a, b)));
      }
#endif
      for (; i + W <= run_end; i += W) StoreIdx(idx + i, one(i));
      if (i < run_end) break;  // a partial vector: scalar below
    }
  uint32_t m = 0;
  if constexpr (kEf && W >= 8) m = MaxLane(emax);
  for (; i < n; ++i) {
    idx[i] = QuantizeOne(y + i, j0 + i, p);
    if constexpr (kEf) {
      uint32_t a;
      std::memcpy(&a, y + i, 4);
      a &= 0x7FFFFFFFu;
      m = a > m ? a : m;
    }
  }
  return m;
}

void PackScalar(const uint8_t* idx, size_t n, int bits, uint8_t* out) {
  uint64_t acc = 0;
  int nb = 0;
  size_t o = 0;
  for (size_t i = 0; i < n; ++i) {
    acc |= (uint64_t)idx[i] << nb;
    nb += bits;
    while (nb >= 8) {
      out[o++] = (uint8_t)acc;
      acc >>= 8;
      nb -= 8;
    }
  }
  if (nb > 0) out[o++] = (uint8_t)acc;
}

}  // namespace

bool LoadSigned(const float* grad, size_t nvalid, size_t n, uint64_t j0, uint32_t sign_key,
                float* v) {
  vu bad = vu{};
  size_t i = 0;
  for (; i + W <= nvalid; i += W) {
    const vf x = LoadF(grad + i);
    bad |= NonFiniteMask(x);
    StoreF(v + i, AsF(AsU(x) ^ SignBitsV(sign_key, j0 + i)));
  }
  bool ok = true;
  for (int l = 0; l < W; ++l) ok &= (bad[l] == 0);
  for (; i < nvalid; ++i) {
    ok &= IsFinite(grad[i]);
    v[i] = FlipSign(grad[i], SignBit(sign_key, j0 + i));
  }
  // Padding: signed zeros.
  for (; i < n && ((j0 + i) % W) != 0; ++i) v[i] = FlipSign(0.0f, SignBit(sign_key, j0 + i));
  for (; i + W <= n; i += W) StoreF(v + i, AsF(SignBitsV(sign_key, j0 + i)));
  for (; i < n; ++i) v[i] = FlipSign(0.0f, SignBit(sign_key, j0 + i));
  return ok;
}

uint32_t Quantize(float* y, size_t n, uint64_t j0, const QuantParams& p, uint8_t* idx) {
#if THC_W >= 8
  if (p.lvl && p.levels <= 16 && p.tbl[p.levels - 1] < 32) {
    return p.ef ? QuantizeLoop<true>(y, n, j0, p, idx, PermLut(p))
                : QuantizeLoop<false>(y, n, j0, p, idx, PermLut(p));
  }
#endif
  return p.ef ? QuantizeLoop<true>(y, n, j0, p, idx, GatherLut(p))
              : QuantizeLoop<false>(y, n, j0, p, idx, GatherLut(p));
}

void Pack(const uint8_t* idx, size_t n, int bits, uint8_t* out) {
  if (bits == 8) {
    std::memcpy(out, idx, n);
    return;
  }
  size_t i = 0;
  size_t o = 0;
  if (bits == 4) {
    for (; i + 2 <= n; i += 2) out[o++] = (uint8_t)(idx[i] | (idx[i + 1] << 4));
  } else {
#if defined(__BMI2__)
    const size_t out_bytes = (n * (size_t)bits + 7) / 8;
    // Eight indices at a time: gather the low `bits` bits of each byte into bits bytes.
    const uint64_t mask = 0x0101010101010101ull * ((1u << bits) - 1);
    for (; i + 8 <= n && o + 8 <= out_bytes; i += 8, o += (size_t)bits) {
      uint64_t x;
      std::memcpy(&x, idx + i, 8);
      const uint64_t packed = _pext_u64(x, mask);
      std::memcpy(out + o, &packed, 8);  // the bytes past `bits` are rewritten by the next group
    }
#endif
  }
  PackScalar(idx + i, n - i, bits, out + o);
}

namespace {

// Sum of x^2 over x = grad + res (res may be null), and whether every x is finite; with kStore,
// x is also written to store. Runs of 16 vectors are summed in binary32 (16 squares a lane:
// relative error below 2^-20) and the runs in binary64; a run whose binary32 sum is not finite
// (squares above FLT_MAX, or a NaN/Inf input) is summed again in binary64. Converting every
// square to binary64 instead costs three times as much.
template <bool kStore>
bool SumSquaresT(const float* grad, const float* res, size_t n, double* out, float* store) {
  constexpr size_t kRun = 16 * W;
  vdh d0 = vdh{}, d1 = vdh{};
  vu bad = vu{};
  size_t i = 0;
  for (; i + kRun <= n; i += kRun) {
    vf f0 = vf{}, f1 = vf{}, f2 = vf{}, f3 = vf{};
    for (size_t k = i; k < i + kRun; k += 4 * W) {
      vf x0 = LoadF(grad + k), x1 = LoadF(grad + k + W);
      vf x2 = LoadF(grad + k + 2 * W), x3 = LoadF(grad + k + 3 * W);
      if (res) {
        x0 = x0 + LoadF(res + k);
        x1 = x1 + LoadF(res + k + W);
        x2 = x2 + LoadF(res + k + 2 * W);
        x3 = x3 + LoadF(res + k + 3 * W);
      }
      if constexpr (kStore) {
        StoreF(store + k, x0);
        StoreF(store + k + W, x1);
        StoreF(store + k + 2 * W, x2);
        StoreF(store + k + 3 * W, x3);
      }
      f0 = f0 + x0 * x0;
      f1 = f1 + x1 * x1;
      f2 = f2 + x2 * x2;
      f3 = f3 + x3 * x3;
    }
    const vf f = (f0 + f1) + (f2 + f3);
    const vu fbad = NonFiniteMask(f);
    bool run_ok = true;
    for (int l = 0; l < W; ++l) run_ok &= (fbad[l] == 0);
    if (run_ok) {
      vdh lo, hi;
      Widen(f, &lo, &hi);
      d0 = d0 + lo;
      d1 = d1 + hi;
    } else {
      for (size_t k = i; k < i + kRun; k += W) {
        vf x;
        if constexpr (kStore) {
          x = LoadF(store + k);  // already written (store may be grad itself: no second add)
        } else {
          x = LoadF(grad + k);
          if (res) x = x + LoadF(res + k);
        }
        bad |= NonFiniteMask(x);
        AddSquares(x, &d0, &d1);
      }
    }
  }
  bool ok = true;
  for (int l = 0; l < W; ++l) ok &= (bad[l] == 0);
  double s = 0;
  for (int l = 0; l < W / 2; ++l) s += d0[l] + d1[l];
  for (; i < n; ++i) {
    const float x = res ? grad[i] + res[i] : grad[i];
    if constexpr (kStore) store[i] = x;
    ok &= IsFinite(x);
    s += (double)x * (double)x;
  }
  *out = s;
  return ok;
}

}  // namespace

bool SumSquares(const float* x, size_t n, double* out) {
  return SumSquaresT<false>(x, nullptr, n, out, nullptr);
}

namespace {

// ---- the fused encode pipeline ----

// Source of the transform: sign * grad, and the running maximum of |grad| as bits (an unsigned
// compare orders non-negative floats; >= 0x7F800000 is a NaN or Inf), which is both the
// non-finite check and, without error feedback, the bound that rules out overflow. The chunk's
// gradient ends at nvalid (a partition's last chunk): the padding beyond reads as zeros, signed
// like every coordinate (LoadSigned's rule), and grad is never read past nvalid.
struct SignedSource {
  const float* grad;
  size_t nvalid;
  const uint32_t* signs;  // the chunk's sign words
  vu* amax_out;
  vu amax;
  inline vf operator()(size_t i) {
    vf x;
    if (__builtin_expect(i + W <= nvalid, 1)) {
      if ((i & 15) == 0) PrefetchRead(grad + i + kPrefetch);  // one prefetch per cache line
      x = LoadF(grad + i);
    } else {
      x = LoadValid(i);
    }
    const vu a = AsU(x) & 0x7FFFFFFFu;
    amax = a > amax ? a : amax;
    return FlipSigns(x, signs, i);
  }
  __attribute__((noinline)) vf LoadValid(size_t i) const {
    alignas(64) float t[W] = {};
    for (size_t l = 0; i + l < nvalid && l < (size_t)W; ++l) t[l] = grad[i + l];
    return LoadF(t);
  }
  void Flush() { *amax_out = *amax_out > amax ? *amax_out : amax; }
};

// Sink of the transform: with error feedback add the rotated residual (step 2), quantise y
// (steps 4-5), write the indices (packed when bits is 4 and W is 8 or 16, else bytes for Pack),
// and with error feedback store the new residual e = y - level value (step 7).
template <bool kEf, class Lut>
struct QuantizeSink {
  QuantizeBody<kEf, Lut> body;
  const float* res;  // the chunk's residual in (kEf)
  float* res_out;    // the chunk's residual out (kEf)
  uint64_t j0;
  uint32_t key;
  bool pack4;
  uint8_t* payload;  // the chunk's packed indices (pack4)
  uint8_t* idx;      // the chunk's index bytes (otherwise)
  inline void operator()(size_t i, vf y) {
    const uint32_t j = (uint32_t)(j0 + i);
    vf e;
    if constexpr (kEf) {
      if ((i & 15) == 0) PrefetchRead(res + i + kPrefetch);
      y = y + LoadF(res + i);
    }
    const vi q = body(y, BroadcastU(j ^ HashMix(key, j)) ^ Iota(), &e);
    // The new residual is read at the next step, long after: past the caches.
    if constexpr (kEf) StreamF(res_out + i, e);
#if THC_W == 16
    if (pack4) {  // 16 indices of 4 bits: lane pairs into one byte, 8 bytes
      const __m512i qq = (__m512i)q;
      const __m512i two = _mm512_or_si512(qq, _mm512_srli_epi64(qq, 28));
      _mm_storel_epi64((__m128i*)(payload + i / 2), _mm512_cvtepi64_epi8(two));
      return;
    }
    _mm_storeu_si128((__m128i*)(idx + i), _mm512_cvtepi32_epi8((__m512i)q));
#elif THC_W == 8
    if (pack4) {  // 8 indices of 4 bits: lane pairs into one byte (as above), 4 bytes
      const __m256i qq = (__m256i)q;
      const __m256i two = _mm256_or_si256(qq, _mm256_srli_epi64(qq, 28));
      // the two 64-bit lanes' low bytes of each half to its bytes 0 and 1, the rest zero
      const __m256i b = _mm256_shuffle_epi8(
          two, _mm256_setr_epi8(0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 8,
                                -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1));
      const uint32_t lo = (uint32_t)_mm_cvtsi128_si32(_mm256_castsi256_si128(b));
      const uint32_t hi = (uint32_t)_mm_cvtsi128_si32(_mm256_extracti128_si256(b, 1));
      const uint32_t word = lo | (hi << 16);
      std::memcpy(payload + i / 2, &word, 4);  // little-endian: indices i .. i+7
      return;
    }
    StoreIdx(idx + i, q);
#else
    StoreIdx(idx + i, q);
#endif
  }
};

// Whether float32 Hu of blocks of B values of magnitude <= xm provably stays finite: every
// partial sum of a stage is at most the sum of the magnitudes, B * xm, times at most
// (1 + 2^-24) per stage of rounding (<= 32 stages; 2^-16 covers it with room).
inline double TransformBound(double xm, double block) { return block * xm * (1.0 + 0x1p-16); }
constexpr double kFloatMax = 3.4028234663852886e38;

// With error feedback, a bound on |e| for every element of a chunk, from bounds on |Hu(v)| and on
// the residual in: y = Hu(v) + r, then e = y - efr[q], so |e| <= |y| + max |efr| (2^-20 covers
// the rounding of the two adds). Infinite (unprovable) when that could reach FLT_MAX. The bound
// grows by about B * max|x| + max|efr| a step; when it gets too large, the checked path measures
// the residual exactly and the bound starts again from there.
inline double ResidualBound(double hu_bound, const QuantParams& p) {
  const double e = ((hu_bound + p.res_bound) * (1.0 + 0x1p-20) + p.efr_absmax) * (1.0 + 0x1p-20);
  return e < kFloatMax ? e : HUGE_VAL;
}

constexpr int kChunkCheck = -1;  // EncodePipeline: the bound failed; redo the chunk with checks

template <bool kEf, class Lut>
int EncodePipeline(const float* grad, const float* res, size_t nvalid, size_t n, uint64_t j0,
                   size_t block, uint32_t sign_key, const QuantParams& p, const Lut& lut,
                   float* work, uint8_t* idx, uint8_t* payload, float* res_out,
                   double* res_bound_out, int threads) {
  const QuantizeBody<kEf, Lut> body(p, lut);
  const bool pack4 = W >= 8 && p.levels == 16;
  const int bits = (int)__builtin_ctz((unsigned)p.levels);
  const uint32_t* signs = ChunkSignWords(sign_key, j0, n);
  vu amax = vu{};
  QuantizeSink<kEf, Lut> quant{body, res, res_out, j0, p.round_key, pack4, payload, idx};
  if (threads > 1 && n == block && block > kLeaf) {
    vu amax_of[kMaxSubBlocks] = {};  // per sub-block task, the maximum taken below
    auto make_src = [&](size_t i) { return SignedSource{grad, nvalid, signs, &amax_of[i], vu{}}; };
    auto make_sink = [&](size_t) { return quant; };
    BlockToThreads<true>(work, 0, block, make_src, make_sink, threads);
    for (const vu& a : amax_of) amax = a > amax ? a : amax;
    if (!pack4) {  // ranges of whole bytes: multiples of 8 indices
      const size_t parts = (size_t)threads, units = n / 8;
      auto pack = [&](size_t k) {
        const size_t lo = k * units / parts * 8, hi = (k + 1) * units / parts * 8;
        Pack(idx + lo, hi - lo, bits, payload + lo * bits / 8);
      };
      ForTasks(threads, parts, pack);
    }
  } else {
    SignedSource src{grad, nvalid, signs, &amax, vu{}};
    for (size_t b = 0; b < n; b += block) BlockTo<true>(work, b, block, src, quant);
    if (!pack4) Pack(idx, n, bits, payload);
  }
  if constexpr (kEf) StreamFence();
  const uint32_t m = MaxLane(amax);
  if (m >= 0x7F800000u) return kChunkNonFinite;
  float xm;
  std::memcpy(&xm, &m, 4);
  const double hu = TransformBound(xm, (double)block);
  if constexpr (kEf) {
    // Proven from the bounds, without a look at the new residual (it went past the caches).
    const double bound = ResidualBound(hu, p);
    if (bound == HUGE_VAL) return kChunkCheck;
    *res_bound_out = bound;
    return kChunkOk;
  }
  return hu < kFloatMax ? kChunkOk : kChunkCheck;
}

template <class Lut>
int EncodePipelineLut(const float* grad, const float* res, size_t nvalid, size_t n, uint64_t j0,
                      size_t block, uint32_t sign_key, const QuantParams& p, const Lut& lut,
                      float* work, uint8_t* idx, uint8_t* payload, float* res_out,
                      double* res_bound_out, int threads) {
  if (res_out)
    return EncodePipeline<true>(grad, res, nvalid, n, j0, block, sign_key, p, lut, work, idx,
                                payload, res_out, res_bound_out, threads);
  return EncodePipeline<false>(grad, res, nvalid, n, j0, block, sign_key, p, lut, work, idx,
                               payload, res_out, res_bound_out, threads);
}

// Sink of the rotation: y + res into y.
struct RotateSink {
  float* y;
  const float* res;
  inline void operator()(size_t i, vf v) const {
    if (res) {
      if ((i & 15) == 0) PrefetchRead(res + i + kPrefetch);
      v = v + LoadF(res + i);
    }
    StoreF(y + i, v);
  }
};

}  // namespace

namespace {

// Steps 1-2 one kernel after another, checked: y = Hu(sign * grad) + res (res may be null), and
// the sum of y^2 (the finite check of y comes with it).
int RotateChecked(const float* grad, const float* res, size_t nvalid, size_t n, uint64_t j0,
                  size_t block, uint32_t sign_key, float* y, double* sumsq) {
  if (!LoadSigned(nvalid ? grad : nullptr, nvalid, n, j0, sign_key, y)) return kChunkNonFinite;
  for (size_t b = 0; b < n; b += block) BlockFwht(y + b, block);
  return SumSquaresT<true>(y, res, n, sumsq, y) ? kChunkOk : kChunkOverflow;
}

}  // namespace

int EncodeChunk(const float* grad, const float* res, size_t nvalid, size_t n, uint64_t j0,
                size_t block, uint32_t sign_key, const QuantParams& p, float* work, uint8_t* idx,
                uint8_t* payload, float* res_out, double* res_bound_out, int threads) {
  const int bits = (int)__builtin_ctz((unsigned)p.levels);
#if THC_W >= 8
  if (block >= kMinPipelineBlock && (res_out != nullptr) == p.ef) {
    const int st =
        p.lvl && p.levels <= 16 && p.tbl[p.levels - 1] < 32
            ? EncodePipelineLut(grad, res, nvalid, n, j0, block, sign_key, p, PermLut(p), work, idx,
                                payload, res_out, res_bound_out, threads)
            : EncodePipelineLut(grad, res, nvalid, n, j0, block, sign_key, p, GatherLut(p), work,
                                idx, payload, res_out, res_bound_out, threads);
    if (st != kChunkCheck) return st;
    // Inputs near FLT_MAX, or a residual whose bound no longer proves the new one finite: redo
    // the chunk below, checking what it produces (the pipeline does not keep it).
  }
#endif
  // One kernel after another (small blocks, the portable build, and chunks the overflow bound
  // did not clear), checking what the transform produces. With error feedback the work is
  // res_out itself: y, then e in place.
  float* y = res_out ? res_out : work;
  double unused;
  const int st = RotateChecked(grad, res, nvalid, n, j0, block, sign_key, y, &unused);
  if (st != kChunkOk) return st;
  const uint32_t mb = Quantize(y, n, j0, p, idx);
  Pack(idx, n, bits, payload);
  if (res_out) {  // the exact bound: the largest |e|, which must be finite
    if (mb >= 0x7F800000u) return kChunkOverflow;
    float r;
    std::memcpy(&r, &mb, 4);
    *res_bound_out = r;
  }
  return kChunkOk;
}

int RotateChunk(const float* grad, const float* res, size_t nvalid, size_t n, uint64_t j0,
                size_t block, uint32_t sign_key, float* y, double* sumsq, int threads) {
#if THC_W >= 8
  if (block >= kMinPipelineBlock) {
    vu amax = vu{};
    const uint32_t* signs = ChunkSignWords(sign_key, j0, n);
    RotateSink sink{y, res};
    if (threads > 1 && n == block && block > kLeaf) {
      vu amax_of[kMaxSubBlocks] = {};
      auto make_src = [&](size_t i) {
        return SignedSource{grad, nvalid, signs, &amax_of[i], vu{}};
      };
      auto make_sink = [&](size_t) { return sink; };
      BlockToThreads<true>(y, 0, block, make_src, make_sink, threads);
      for (const vu& a : amax_of) amax = a > amax ? a : amax;
    } else {
      SignedSource src{grad, nvalid, signs, &amax, vu{}};
      for (size_t b = 0; b < n; b += block) BlockTo<true>(y, b, block, src, sink);
    }
    if (MaxLane(amax) >= 0x7F800000u) return kChunkNonFinite;
    // The squares (and the finite check) in a second pass over the chunk, still in cache:
    // cheaper than carrying binary64 accumulators through the transform's sink.
    return SumSquaresT<false>(y, nullptr, n, sumsq, nullptr) ? kChunkOk : kChunkOverflow;
  }
#endif
  return RotateChecked(grad, res, nvalid, n, j0, block, sign_key, y, sumsq);
}

}  // namespace THC_ISA
}  // namespace detail
}  // namespace thc
