// byteps-thc codec core: the encoder driver (docs/ALGORITHM.md, "Encode" and "Norm").
//
// The partition is walked in chunks of whole blocks (kChunk elements, or one block when blocks
// are larger), so that each chunk is read from the gradient once and then stays in cache through
// sign, transform, residual add, quantize, pack and the new residual. The residual is kept in the
// rotated domain (docs/ALGORITHM.md, "Error-feedback state"): one transform per step.
//
// With error feedback the norm needs the transform (y = Hu(sign * grad) + r), so Norm() keeps y
// in `scratch` and the Encode() of the same step and gradient quantises it instead of rotating
// again. Every new residual is written to `scratch`, which replaces `res` only when the whole
// call succeeded. The encoder keeps a bound on |r| from step to step (res_bound), with which
// the fused pipeline proves the new residual finite without reading it back (it is written with
// streaming stores, past the caches).
//
// With set_threads(T) the chunks are split over up to T threads (parallel.h), or, when the
// partition is one chunk, its kernel splits the block's transform (transform.h,
// BlockToThreads) and the prepared quantise its slices. Every chunk's
// work depends only on its own coordinates (the signs and the rounding are hashes of the
// coordinate, the seed, the rank and the step), and what chunks share is combined in chunk order
// after they are all done: the norm's binary64 sum, the first error, the residual's bound (a
// maximum). So the payload, the residual, the norm and the status are those of one thread.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "thc/internal.h"
#include "thc/parallel.h"
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
  detail::AlignedArray<float> res;      // the rotated residual r, padded floats (EF only)
  detail::AlignedArray<float> scratch;  // y of Norm(), then the new residual (EF only)
  // What Norm() left in scratch: valid for the Encode() of step `prep_step` of the gradient at
  // `prep_grad` whose values at `probe_at` are still `probe` (a cheap guard against a caller
  // that changed the gradient in between; a changed gradient fails it almost surely).
  static constexpr int kProbes = 16;
  // A bound on |r| of the residual (0 at the start; HUGE_VAL: not known, the next encode
  // checks every value), so that the encode can prove the new one finite without reading it.
  double res_bound = 0;
  bool prepared = false;
  uint64_t prep_step = 0;
  const float* prep_grad = nullptr;
  size_t probe_at[kProbes] = {};
  uint32_t probe[kProbes] = {};
  bool Probe(const float* grad, bool save);
  // y for the whole partition into scratch (sum of y^2 into *sumsq): a Status.
  Status Rotate(const float* grad, double* sumsq);
  std::vector<int32_t> lvl, tbl;
  std::vector<float> tblf, ig, ig24, efr[2];  // efr: per run (its block scales the error)
  detail::Run runs[2];
  int nruns = 0;
  // The chunks of the partition in order (runs, then coordinates), and one result slot each.
  struct ChunkTask {
    int run;
    size_t j0, n;
  };
  std::vector<ChunkTask> tasks;
  std::vector<double> task_value;  // Rotate: the chunk's sum of squares; Encode: its bound
  std::vector<int> task_status;
  int threads = 1;
  // Runs body(i, inner) for every chunk i below the first failing one (a ChunkStatus other
  // than kChunkOk) and returns that failure's index (tasks.size() if none); chunks after it
  // may or may not have run. Several chunks go to the threads; a partition of one chunk (one
  // block) runs it on this thread with `inner` threads for its kernel (1 otherwise).
  template <class Body>
  size_t ForChunks(Body body);
  // Whether scratch holds Norm()'s y for this Encode of `grad`; it no longer does after this.
  bool TakePrepared(const float* grad);
  // qp (its error levels in efr, 2^bits floats) for max norm M of a partition of
  // sqrt(d_pad) = sd whose run of blocks scales by sqrt(B) = sb (Encode steps 4 and 7).
  void Quant(double M, double sd, double sb, uint32_t key, detail::QuantParams* qp,
             float* efr) const;
  // Encode steps 4-8 over the chunks, chunk i with the params qp_of(i, local, local_efr)
  // returns (nullptr: its M is 0, so its indices are 0 and its residual is y).
  template <class QpOf>
  Status Quantise(const float* grad, bool prep, uint8_t* payload, QpOf qp_of);
};

namespace {

// A chunk's work floats and index bytes, per thread rather than per encoder: a worker that
// encodes many partitions in turn keeps one set in cache instead of touching a cold one each
// time (a whole-partition block makes it as large as the partition).
struct ChunkWork {
  detail::AlignedArray<float> work;
  detail::AlignedArray<uint8_t> idx;
};
ChunkWork& ThreadChunkWork(size_t chunk) {
  thread_local ChunkWork w;
  if (w.work.size() < chunk) {
    w.work.resize(chunk);
    w.idx.resize(chunk);
  }
  return w;
}

}  // namespace

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
  if (cfg.block_scale) m.chunk = m.geo.block;  // a chunk per block: each has its own scale
  m.nruns = detail::Runs(m.geo.padded, m.geo.block, m.geo.tail_block, m.runs);
  for (int r = 0; r < m.nruns; ++r)
    for (size_t j0 = m.runs[r].start; j0 < m.runs[r].end; j0 += m.chunk)
      m.tasks.push_back({r, j0, std::min(m.chunk, m.runs[r].end - j0)});
  m.task_value.resize(m.tasks.size());
  m.task_status.resize(m.tasks.size());
  if (m.ef) {
    m.res.resize(m.geo.padded);
    m.scratch.resize(m.geo.padded);
  }
  for (int i = 0; i < Impl::kProbes; ++i)
    m.probe_at[i] = (size_t)((2 * i + 1) * d / (2 * Impl::kProbes));
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
  m.efr[0].resize(levels);
  m.efr[1].resize(levels);
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
void Encoder::set_step(uint64_t step) {
  impl_->step = step;
  impl_->prepared = false;
}
const float* Encoder::residual() const { return impl_->ef ? impl_->res.data() : nullptr; }
void Encoder::set_threads(int threads) {
  impl_->threads = std::max(1, std::min(threads, kMaxThreads));
}
int Encoder::threads() const { return impl_->threads; }
void Encoder::ResetResidual() {
  if (impl_->ef) std::fill(impl_->res.data(), impl_->res.data() + impl_->res.size(), 0.0f);
  impl_->res_bound = 0;
  impl_->prepared = false;
}

bool Encoder::Impl::Probe(const float* grad, bool save) {
  bool same = true;
  for (int i = 0; i < kProbes; ++i) {
    uint32_t v;
    std::memcpy(&v, grad + probe_at[i], 4);
    if (save) probe[i] = v;
    same &= (v == probe[i]);
  }
  return same;
}

template <class Body>
size_t Encoder::Impl::ForChunks(Body body) {
  const size_t nt = tasks.size();
  const int t = detail::UsefulThreads(threads, (size_t)-1, geo.padded);
  const int outer = nt >= 2 ? std::min(t, (int)std::min<size_t>(nt, kMaxThreads)) : 1;
  const int inner = nt >= 2 ? 1 : t;
  std::atomic<size_t> first_fail{nt};
  detail::ParallelTasks(outer, nt, [&](size_t i) {
    if (i > first_fail.load(std::memory_order_relaxed)) return;
    const int st = body(i, inner);
    task_status[i] = st;
    if (st == detail::kChunkOk) return;
    size_t f = first_fail.load();
    while (i < f && !first_fail.compare_exchange_weak(f, i)) {
    }
  });
  return first_fail.load();
}

namespace {
Status FromChunk(int st) {
  return st == detail::kChunkNonFinite ? Status::kNonFinite : Status::kOverflow;
}
}  // namespace

Status Encoder::Impl::Rotate(const float* grad, double* sumsq) {
  const detail::Kernels& k = detail::ActiveKernels();
  const size_t fail = ForChunks([&](size_t i, int inner) {
    const ChunkTask& c = tasks[i];
    const size_t nvalid = c.j0 < geo.d ? std::min(c.n, geo.d - c.j0) : 0;
    double part = 0;
    const int st =
        k.rotate_chunk(nvalid ? grad + c.j0 : nullptr, res.data() + c.j0, nvalid, c.n, c.j0,
                       runs[c.run].block, sign_key, scratch.data() + c.j0, &part, inner);
    task_value[i] = part;
    return st;
  });
  if (fail < tasks.size()) return FromChunk(task_status[fail]);
  double s = 0;  // in chunk order, as one thread adds them
  size_t i = 0;
  for (int r = 0; r < nruns; ++r) {
    double s_run = 0;
    for (; i < tasks.size() && tasks[i].run == r; ++i) s_run += task_value[i];
    s += s_run / (double)runs[r].block;
  }
  *sumsq = s;
  return Status::kOk;
}

Status Encoder::Norm(const float* grad, double* norm) {
  Impl& m = *impl_;
  m.prepared = false;
  double s = 0;
  if (!m.ef) {
    if (!detail::ActiveKernels().sum_squares(grad, m.geo.d, &s)) return Status::kNonFinite;
    *norm = std::sqrt(s);
    return Status::kOk;
  }
  const Status st = m.Rotate(grad, &s);
  if (st != Status::kOk) return st;
  *norm = std::sqrt(s);  // Rotate() divided each run's sum by its block
  m.prepared = true;
  m.prep_step = m.step;
  m.prep_grad = grad;
  m.Probe(grad, true);
  return Status::kOk;
}

bool Encoder::Impl::TakePrepared(const float* grad) {
  const bool ok = prepared && prep_step == step && prep_grad == grad && Probe(grad, false);
  prepared = false;  // scratch is rewritten by the encode, whatever happens
  return ok;
}

void Encoder::Impl::Quant(double M, double sd, double sb, uint32_t key, detail::QuantParams* out,
                          float* efr) const {
  const double T = cfg.clip, g = cfg.granularity;
  detail::QuantParams& qp = *out;
  qp.c1 = (float)(g / (2.0 * T) * sd / M / sb);
  qp.c0 = (float)(g / 2.0);
  qp.gmax = (float)g;
  qp.k1 = (float)(2.0 * T / g * M / sd * sb);
  qp.k0 = (float)(-T * M / sd * sb);
  qp.ef = ef;
  qp.round_key = key;
  qp.levels = 1 << cfg.bits;
  qp.lvl = lvl.empty() ? nullptr : lvl.data();
  qp.tbl = tbl.data();
  qp.tblf = tblf.data();
  qp.ig = ig.data();
  qp.ig24 = ig24.data();
  for (int i = 0; i < qp.levels; ++i) {  // the error's level values, as step 7 computes them
    const float e = tblf[i] * qp.k1;
    efr[i] = e + qp.k0;
  }
  qp.efr = efr;
  qp.res_bound = 0;
  qp.efr_absmax = 0;
  if (ef) {
    qp.res_bound = res_bound;
    for (int i = 0; i < qp.levels; ++i) {
      const double a = std::fabs((double)efr[i]);
      qp.efr_absmax = std::isfinite(a) ? std::max(qp.efr_absmax, a) : HUGE_VAL;
    }
  }
}

template <class QpOf>
Status Encoder::Impl::Quantise(const float* grad, bool prep, uint8_t* payload, QpOf qp_of) {
  const detail::Kernels& k = detail::ActiveKernels();
  const size_t bits = (size_t)cfg.bits;
  const size_t fail = ForChunks([&](size_t i, int inner) -> int {
    const ChunkTask& c = tasks[i];
    const size_t j0 = c.j0, n = c.n;
    const size_t nvalid = j0 < geo.d ? std::min(n, geo.d - j0) : 0;
    uint8_t* out = payload + j0 * bits / 8;
    detail::QuantParams local;
    float local_efr[256];  // 2^bits <= 256 levels
    const detail::QuantParams* qpp = qp_of(i, &local, local_efr);
    if (!qpp) {  // this block's M is 0: every index 0; with error feedback its residual is y
      const size_t end = j0 + n == geo.padded ? geo.payload_bytes : (j0 + n) * bits / 8;
      std::memset(out, 0, end - j0 * bits / 8);
      task_value[i] = HUGE_VAL;  // y: finite, but unbounded here (the next encode checks)
      double s = 0;
      if (!ef)
        return nvalid == 0 || k.sum_squares(grad + j0, nvalid, &s) ? detail::kChunkOk
                                                                   : detail::kChunkNonFinite;
      if (prep) return detail::kChunkOk;  // y of this block is in scratch already
      return k.rotate_chunk(nvalid ? grad + j0 : nullptr, res.data() + j0, nvalid, n, j0,
                            runs[c.run].block, sign_key, scratch.data() + j0, &s, inner);
    }
    const detail::QuantParams& qp = *qpp;
    ChunkWork& cw = ThreadChunkWork(chunk);  // this thread's
    int st;
    double chunk_bound = 0;
    if (prep) {  // y is in scratch: quantise it there (it becomes the new residual)
      // Pointwise: slices of whole kChunks (aligned for the kernels, whole payload bytes) on
      // the inner threads, their bounds' maximum (float bits in unsigned order) in the end.
      const size_t units = (n + detail::kChunk - 1) / detail::kChunk;
      const size_t parts = std::min<size_t>((size_t)inner, units);
      uint32_t slice_mb[kMaxThreads] = {};
      detail::ParallelTasks((int)parts, parts, [&](size_t sl) {
        const size_t lo = sl * units / parts * detail::kChunk;
        const size_t hi = std::min(n, (sl + 1) * units / parts * detail::kChunk);
        uint8_t* idx = cw.idx.data() + lo;  // the caller's buffer, each slice its own range
        slice_mb[sl] = k.quantize(scratch.data() + j0 + lo, hi - lo, j0 + lo, qp, idx);
        k.pack(idx, hi - lo, (int)bits, out + lo * bits / 8);
      });
      uint32_t mb = 0;
      for (size_t sl = 0; sl < parts; ++sl) mb = std::max(mb, slice_mb[sl]);
      float e;
      std::memcpy(&e, &mb, 4);
      chunk_bound = e;
      st = mb < 0x7F800000u ? detail::kChunkOk : detail::kChunkOverflow;
    } else {
      st = k.encode_chunk(nvalid ? grad + j0 : nullptr, ef ? res.data() + j0 : nullptr, nvalid, n,
                          j0, runs[c.run].block, sign_key, qp, cw.work.data(), cw.idx.data(), out,
                          ef ? scratch.data() + j0 : nullptr, &chunk_bound, inner);
    }
    task_value[i] = chunk_bound;
    return st;
  });
  if (fail < tasks.size()) return FromChunk(task_status[fail]);
  double bound = 0;  // of the new residual
  for (size_t i = 0; i < tasks.size(); ++i) bound = std::max(bound, task_value[i]);
  if (ef) {
    res.swap(scratch);
    res_bound = bound;
  }
  ++step;
  return Status::kOk;
}

Status Encoder::Encode(const float* grad, double max_norm, uint8_t* payload) {
  Impl& m = *impl_;
  const detail::Kernels& k = detail::ActiveKernels();
  const bool prepared = m.TakePrepared(grad);
  if (!std::isfinite(max_norm)) return Status::kNonFinite;
  if (max_norm < 0 || m.cfg.block_scale) return Status::kBadArgument;
  const Geometry& geo = m.geo;

  if (max_norm == 0) {  // every index 0; the residual becomes y
    double s;
    if (m.ef) {
      if (!prepared) {
        const Status st = m.Rotate(grad, &s);
        if (st != Status::kOk) return st;
      }
      m.res.swap(m.scratch);
      m.res_bound = HUGE_VAL;  // y, finite but unbounded here: the next encode checks
    } else if (!k.sum_squares(grad, geo.d, &s)) {
      return Status::kNonFinite;
    }
    std::memset(payload, 0, geo.payload_bytes);
    ++m.step;
    return Status::kOk;
  }

  const double sd = std::sqrt((double)geo.padded);
  const uint32_t key = RoundKey(m.cfg.seed, m.rank, m.step);
  detail::QuantParams qps[2];
  for (int r = 0; r < m.nruns; ++r)  // each run scales by its own block
    m.Quant(max_norm, sd, std::sqrt((double)m.runs[r].block), key, &qps[r], m.efr[r].data());
  return m.Quantise(grad, prepared, payload,
                    [&](size_t i, detail::QuantParams*, float*) { return &qps[m.tasks[i].run]; });
}

Status Encoder::EncodeBlocks(const float* grad, const double* max_norms, size_t count,
                             uint8_t* payload) {
  Impl& m = *impl_;
  const bool prepared = m.TakePrepared(grad);
  if (!m.cfg.block_scale || count != m.tasks.size()) return Status::kBadArgument;
  for (size_t i = 0; i < count; ++i)
    if (!std::isfinite(max_norms[i])) return Status::kNonFinite;
  for (size_t i = 0; i < count; ++i)
    if (max_norms[i] < 0) return Status::kBadArgument;
  // block_scale: one chunk per block (the constructor), each a partition of its own: d_pad = B
  const uint32_t key = RoundKey(m.cfg.seed, m.rank, m.step);
  return m.Quantise(
      grad, prepared, payload,
      [&](size_t i, detail::QuantParams* local, float* efr) -> const detail::QuantParams* {
        if (max_norms[i] == 0) return nullptr;
        const double sb = std::sqrt((double)m.runs[m.tasks[i].run].block);
        m.Quant(max_norms[i], sb, sb, key, local, efr);
        return local;
      });
}

Status Encoder::BlockNorms(const float* grad, double* norms) {
  Impl& m = *impl_;
  m.prepared = false;
  if (!m.cfg.block_scale) return Status::kBadArgument;
  if (!m.ef) {
    const detail::Kernels& k = detail::ActiveKernels();
    const size_t fail = m.ForChunks([&](size_t i, int) {
      const Impl::ChunkTask& c = m.tasks[i];
      const size_t nvalid = c.j0 < m.geo.d ? std::min(c.n, m.geo.d - c.j0) : 0;
      double s = 0;
      const bool ok = nvalid == 0 || k.sum_squares(grad + c.j0, nvalid, &s);
      m.task_value[i] = s;
      return ok ? detail::kChunkOk : detail::kChunkNonFinite;
    });
    if (fail < m.tasks.size()) return Status::kNonFinite;
    for (size_t i = 0; i < m.tasks.size(); ++i) norms[i] = std::sqrt(m.task_value[i]);
    return Status::kOk;
  }
  double s;
  const Status st = m.Rotate(grad, &s);
  if (st != Status::kOk) return st;
  for (size_t i = 0; i < m.tasks.size(); ++i)  // one chunk per block: its sum of y^2
    norms[i] = std::sqrt(m.task_value[i] / (double)m.runs[m.tasks[i].run].block);
  m.prepared = true;
  m.prep_step = m.step;
  m.prep_grad = grad;
  m.Probe(grad, true);
  return Status::kOk;
}

}  // namespace thc
