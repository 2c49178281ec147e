// byteps-thc codec core: the encode pointwise kernel family (included by quantize*.cc).
//
// LoadSigned (steps 1 and 3 before the transform), Quantize (steps 4, 5 and the error of 7),
// Pack (step 6), SumSquares (the norm). docs/ALGORITHM.md is the definition; each float
// operation below is one binary32 operation in the order written there.
#pragma once

#include "internal.h"
#include "simd.h"

namespace thc {
namespace detail {
namespace THC_ISA {
namespace {

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
  const QuantParams& p;
  explicit GatherLut(const QuantParams& q) : p(q) {}
  vi Level(vi k) const {
    vi i;
    if (p.lvl) {
      i = Gather32(p.lvl, k);
    } else {
      i = vi{};
      for (int step = p.levels / 2; step >= 1; step /= 2) {
        const vi cand = i + step;
        i = (Gather32(p.tbl, cand) <= k) ? cand : i;
      }
      const vi cap = vi{} + (p.levels - 2);
      i = (i < cap) ? i : cap;
    }
    return i;
  }
  vf Tblf(vi i) const { return GatherF(p.tblf, i); }
  vf Ig(vi i) const { return GatherF(p.ig, i); }
};

#if THC_W == 16
// AVX-512, at most 16 levels and g < 32: every lookup is a register permute.
struct PermLut {
  __m512i lvl_lo, lvl_hi;
  __m512 tblf, ig;
  explicit PermLut(const QuantParams& p) {
    int32_t lv[32] = {0};
    float tf[16] = {0}, g[16] = {0};
    for (int k = 0; k < 32 && p.tbl[p.levels - 1] >= (int32_t)k; ++k) lv[k] = p.lvl[k];
    for (int i = 0; i < p.levels; ++i) { tf[i] = p.tblf[i]; g[i] = p.ig[i]; }
    lvl_lo = _mm512_loadu_si512(lv);
    lvl_hi = _mm512_loadu_si512(lv + 16);
    tblf = _mm512_loadu_ps(tf);
    ig = _mm512_loadu_ps(g);
  }
  vi Level(vi k) const { return (vi)_mm512_permutex2var_epi32(lvl_lo, (__m512i)k, lvl_hi); }
  vf Tblf(vi i) const { return (vf)_mm512_permutexvar_ps((__m512i)i, tblf); }
  vf Ig(vi i) const { return (vf)_mm512_permutexvar_ps((__m512i)i, ig); }
};
#endif

inline void StoreIdx(uint8_t* out, vi q) {
  typedef uint8_t v8 __attribute__((vector_size(THC_W)));
  const v8 b = __builtin_convertvector(q, v8);
  std::memcpy(out, &b, sizeof b);
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

template <class Lut>
void QuantizeLoop(float* y, size_t n, uint64_t j0, const QuantParams& p, uint8_t* idx,
                  const Lut& lut) {
  const vf c1 = BroadcastF(p.c1), c0 = BroadcastF(p.c0), g = BroadcastF(p.gmax);
  const vf zero = vf{}, k1 = BroadcastF(p.k1), k0 = BroadcastF(p.k0);
  const vu key = BroadcastU(p.round_key), lanes = Iota();
  size_t i = 0;
  for (; i + W <= n; i += W) {
    const vf yv = LoadF(y + i);
    vf t = yv * c1;
    t = t + c0;
    t = (t > zero) ? t : zero;
    t = (t < g) ? t : g;
    const vi k = __builtin_convertvector(t, vi);
    const vi lv = lut.Level(k);
    vf pr = t - lut.Tblf(lv);
    pr = pr * lut.Ig(lv);
    const vu h = Hash32V(key ^ (BroadcastU((uint32_t)(j0 + i)) + lanes));
    const vf u = __builtin_convertvector((vi)(h >> 8), vf) * 0x1p-24f;
    const vi q = lv - (vi)(u < pr);
    StoreIdx(idx + i, q);
    if (p.ef) {
      vf r = lut.Tblf(q) * k1;
      r = r + k0;
      StoreF(y + i, yv - r);
    }
  }
  for (; i < n; ++i) idx[i] = QuantizeOne(y + i, j0 + i, p);
}

void PackScalar(const uint8_t* idx, size_t n, int bits, uint8_t* out) {
  uint64_t acc = 0;
  int nb = 0;
  size_t o = 0;
  for (size_t i = 0; i < n; ++i) {
    acc |= (uint64_t)idx[i] << nb;
    nb += bits;
    while (nb >= 8) { out[o++] = (uint8_t)acc; acc >>= 8; nb -= 8; }
  }
  if (nb > 0) out[o++] = (uint8_t)acc;
}

}  // namespace

bool LoadSigned(const float* grad, const float* res, size_t nvalid, size_t n, uint64_t j0,
                uint32_t sign_key, float* v) {
  vu bad = vu{};
  size_t i = 0;
  if (res) {
    for (; i + W <= nvalid; i += W) {
      const vf x = LoadF(grad + i) + LoadF(res + i);
      bad |= NonFiniteMask(x);
      StoreF(v + i, AsF(AsU(x) ^ SignBitsV(sign_key, j0 + i)));
    }
  } else {
    for (; i + W <= nvalid; i += W) {
      const vf x = LoadF(grad + i);
      bad |= NonFiniteMask(x);
      StoreF(v + i, AsF(AsU(x) ^ SignBitsV(sign_key, j0 + i)));
    }
  }
  bool ok = true;
  for (int l = 0; l < W; ++l) ok &= (bad[l] == 0);
  for (; i < nvalid; ++i) {
    const float x = res ? grad[i] + res[i] : grad[i];
    ok &= IsFinite(x);
    v[i] = FlipSign(x, SignBit(sign_key, j0 + i));
  }
  // Padding: signed zeros.
  for (; i < n && ((j0 + i) % W) != 0; ++i) v[i] = FlipSign(0.0f, SignBit(sign_key, j0 + i));
  for (; i + W <= n; i += W) StoreF(v + i, AsF(SignBitsV(sign_key, j0 + i)));
  for (; i < n; ++i) v[i] = FlipSign(0.0f, SignBit(sign_key, j0 + i));
  return ok;
}

void Quantize(float* y, size_t n, uint64_t j0, const QuantParams& p, uint8_t* idx) {
#if THC_W == 16
  if (p.lvl && p.levels <= 16 && p.tbl[p.levels - 1] < 32) {
    QuantizeLoop(y, n, j0, p, idx, PermLut(p));
    return;
  }
#endif
  QuantizeLoop(y, n, j0, p, idx, GatherLut(p));
}

void Pack(const uint8_t* idx, size_t n, int bits, uint8_t* out) {
  if (bits == 8) { std::memcpy(out, idx, n); return; }
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

bool SumSquares(const float* grad, const float* res, size_t n, double* out) {
  typedef double vd __attribute__((vector_size(THC_W * 8)));
  vd acc0 = vd{}, acc1 = vd{};
  vu bad = vu{};
  size_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    vf x0 = LoadF(grad + i), x1 = LoadF(grad + i + W);
    if (res) { x0 = x0 + LoadF(res + i); x1 = x1 + LoadF(res + i + W); }
    bad |= NonFiniteMask(x0) | NonFiniteMask(x1);
    const vd d0 = __builtin_convertvector(x0, vd), d1 = __builtin_convertvector(x1, vd);
    acc0 = acc0 + d0 * d0;
    acc1 = acc1 + d1 * d1;
  }
  bool ok = true;
  for (int l = 0; l < W; ++l) ok &= (bad[l] == 0);
  double s = 0;
  for (int l = 0; l < W; ++l) s += acc0[l] + acc1[l];
  for (; i < n; ++i) {
    const float x = res ? grad[i] + res[i] : grad[i];
    ok &= IsFinite(x);
    s += (double)x * (double)x;
  }
  *out = s;
  return ok;
}

}  // namespace THC_ISA
}  // namespace detail
}  // namespace thc
