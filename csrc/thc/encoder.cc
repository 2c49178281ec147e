// byteps-thc codec core: the encoder driver (docs/ALGORITHM.md, "Encode" and "Norm").
//
// The partition is walked in chunks of whole blocks (kChunk elements, or one block when blocks
// are larger), so that each chunk is read from the gradient once and then stays in cache through
// sign, transform, quantize, pack and the error-feedback transform. The new residual goes to a
// second buffer that replaces the old one only when the whole call succeeded.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "thc/internal.h"
#include "thc/thc.h"

namespace thc {

struct Encoder::Impl {
  Config cfg;
  Geometry geo;
  uint32_t rank = 0;
  bool ef = false;
  uint64_t step = 0;
  uint32_t sign_key = 0;
  size_t chunk = 0;
  detail::AlignedArray<float> res, res_next;  // d floats each (error feedback only)
  detail::AlignedArray<float> work;           // chunk floats
  detail::AlignedArray<uint8_t> idx;          // chunk indices
  std::vector<int32_t> lvl, tbl;
  std::vector<float> tblf, ig, ig24, efr;
};

Encoder::Encoder(const Config& cfg, size_t d, uint32_t rank, bool error_feedback)
    : impl_(new Impl) {
  Impl& m = *impl_;
  m.cfg = cfg;
  m.geo = MakeGeometry(cfg, d);
  m.rank = rank;
  m.ef = error_feedback;
  m.sign_key = SignKey(cfg.seed);
  m.chunk = std::max(m.geo.block, detail::kChunk);
  m.chunk = std::min(m.chunk, std::max(m.geo.padded, m.geo.block));
  m.work.resize(m.chunk);
  m.idx.resize(m.chunk);
  if (m.ef) {
    m.res.resize(d);
    m.res_next.resize(d);
  }
  const int levels = 1 << cfg.bits;
  const uint32_t g = cfg.granularity;
  m.tbl.assign(cfg.table.begin(), cfg.table.end());
  m.tbl.resize(levels, (int32_t)g);
  m.tblf.resize(levels);
  m.ig.assign(levels, 0.0f);
  for (int i = 0; i < levels; ++i) m.tblf[i] = (float)m.tbl[i];
  for (int i = 0; i + 1 < levels; ++i) m.ig[i] = (float)(1.0 / (double)(m.tbl[i + 1] - m.tbl[i]));
  m.ig24.resize(levels);
  for (int i = 0; i < levels; ++i) m.ig24[i] = m.ig[i] * 0x1p24f;  // exact: a power of two
  m.efr.resize(levels);
  if (g < (1u << 16)) {  // direct level table; larger g binary-searches the table instead
    m.lvl.resize(g + 1);
    int i = 0;
    for (uint32_t k = 0; k <= g; ++k) {
      while (i + 1 < levels && (uint32_t)m.tbl[i + 1] <= k) ++i;
      m.lvl[k] = std::min(i, levels - 2);
    }
  }
}

Encoder::~Encoder() { delete impl_; }

const Geometry& Encoder::geometry() const { return impl_->geo; }
uint64_t Encoder::step() const { return impl_->step; }
void Encoder::set_step(uint64_t step) { impl_->step = step; }
const float* Encoder::residual() const { return impl_->ef ? impl_->res.data() : nullptr; }
void Encoder::ResetResidual() {
  if (impl_->ef) std::fill(impl_->res.data(), impl_->res.data() + impl_->res.size(), 0.0f);
}

Status Encoder::Norm(const float* grad, double* norm) const {
  const Impl& m = *impl_;
  double s = 0;
  if (!detail::ActiveKernels().sum_squares(grad, m.ef ? m.res.data() : nullptr, m.geo.d, &s))
    return Status::kNonFinite;
  *norm = std::sqrt(s);
  return Status::kOk;
}

Status Encoder::Encode(const float* grad, double max_norm, uint8_t* payload) {
  Impl& m = *impl_;
  const detail::Kernels& k = detail::ActiveKernels();
  if (!std::isfinite(max_norm)) return Status::kNonFinite;
  if (max_norm < 0) return Status::kBadArgument;
  const Geometry& geo = m.geo;
  const float* res = m.ef ? m.res.data() : nullptr;

  if (max_norm == 0) {  // every index 0; the residual becomes x
    for (size_t i = 0; i < geo.d; ++i) {
      const float x = res ? grad[i] + res[i] : grad[i];
      if (!std::isfinite(x)) return Status::kNonFinite;
      if (m.ef) m.res_next.data()[i] = x;
    }
    std::memset(payload, 0, geo.payload_bytes);
    if (m.ef) m.res.swap(m.res_next);
    ++m.step;
    return Status::kOk;
  }

  const double T = m.cfg.clip, g = m.cfg.granularity, M = max_norm;
  const double sd = std::sqrt((double)geo.padded), sb = std::sqrt((double)geo.block);
  detail::QuantParams qp;
  qp.c1 = (float)(g / (2.0 * T) * sd / M / sb);
  qp.c0 = (float)(g / 2.0);
  qp.gmax = (float)g;
  qp.k1 = (float)(2.0 * T / g * M / sd * sb);
  qp.k0 = (float)(-T * M / sd * sb);
  qp.ef = m.ef;
  qp.round_key = RoundKey(m.cfg.seed, m.rank, m.step);
  qp.levels = 1 << m.cfg.bits;
  qp.lvl = m.lvl.empty() ? nullptr : m.lvl.data();
  qp.tbl = m.tbl.data();
  qp.tblf = m.tblf.data();
  qp.ig = m.ig.data();
  qp.ig24 = m.ig24.data();
  for (int i = 0; i < qp.levels; ++i) {  // the error's level values, as step 7 computes them
    const float r = m.tblf[i] * qp.k1;
    m.efr[i] = r + qp.k0;
  }
  qp.efr = m.efr.data();
  qp.efr_absmax = 0;
  if (m.ef)
    for (int i = 0; i < qp.levels; ++i) {
      const double a = std::fabs((double)m.efr[i]);
      qp.efr_absmax = std::isfinite(a) ? std::max(qp.efr_absmax, a) : HUGE_VAL;
    }
  const float inv_block = (float)(1.0 / (double)geo.block);

  const size_t bits = (size_t)m.cfg.bits;
  for (size_t j0 = 0; j0 < geo.padded; j0 += m.chunk) {
    const size_t n = std::min(m.chunk, geo.padded - j0);
    const size_t nvalid = j0 < geo.d ? std::min(n, geo.d - j0) : 0;
    const int st = k.encode_chunk(
        nvalid ? grad + j0 : nullptr, res && nvalid ? res + j0 : nullptr, nvalid, n, j0,
        geo.block, m.sign_key, qp, m.work.data(), m.idx.data(), payload + j0 * bits / 8,
        m.ef && nvalid ? m.res_next.data() + j0 : nullptr, inv_block);
    if (st == detail::kChunkNonFinite) return Status::kNonFinite;
    if (st == detail::kChunkOverflow) return Status::kOverflow;
  }
  if (m.ef) m.res.swap(m.res_next);
  ++m.step;
  return Status::kOk;
}

}  // namespace thc
