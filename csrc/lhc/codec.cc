// byteps-thc LHC core: keys, fixed point, sparsifier, encoder, aggregator and peeling decoder.
//
// Every step is the reference's (byteps_thc/lhc_reference.py) in the same integer arithmetic;
// the dense scans go through the dispatched kernels (internal.h), the rest is scalar.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <vector>

#include "lhc/internal.h"
#include "lhc/lhc.h"

namespace lhc {

namespace {
constexpr uint64_t kTagKey = 0x4C48435F4B455921ull;
constexpr uint64_t kTagHash = 0x4C48435F48415348ull;
constexpr uint64_t kTagRound = 0x4C48435F524E4421ull;
constexpr uint64_t kTagSample = 0x4C48435F53414D50ull;
constexpr uint64_t kTagFp = 0x4C48435F46505249ull;
constexpr int64_t kInt32Max = 0x7FFFFFFF;
constexpr uint32_t kAbs = 0x7FFFFFFFu;

uint32_t Bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}
float FromBits(uint32_t b) {
  float v;
  std::memcpy(&v, &b, 4);
  return v;
}
const detail::Kernels& K() { return detail::ActiveKernels(); }

std::string Str(double v) {
  std::ostringstream s;
  s.precision(17);
  s << v;
  return s.str();
}
}  // namespace

const char* StatusText(Status st) {
  switch (st) {
    case Status::kOk: return "";
    case Status::kNonFinite: return "NaN or Inf in the input (or x + residual overflowed float32)";
    case Status::kBadArgument: return "bad argument (a size, payload, scale or count)";
    case Status::kUnresolved:
      return "peeling left indices unresolved: the sketch was overloaded for its buckets";
  }
  return "unknown status";
}

// -- geometry, keys, streams ---------------------------------------------------------------------
std::string CheckGeometry(size_t d, size_t m) {
  std::ostringstream s;
  if (d < 1 || d > kMaxSize) s << "size=" << d << " must be in [1, 2^32]";
  else if (m < 3 || m % 3 || m > kMaxBuckets)
    s << "m_buckets=" << m << " must be a multiple of 3 in [3, " << kMaxBuckets << "]";
  return s.str();
}

Geometry MakeGeometry(size_t d, size_t m) {
  Geometry g;
  g.d = d;
  g.m = m;
  g.sub = m / 3;
  g.bitmap_bytes = 8 * ((d + 63) / 64);
  g.payload_bytes = kHeaderBytes + g.bitmap_bytes + 4 * m;
  return g;
}

uint64_t PartitionSeed(uint64_t seed, uint64_t key) {
  return SplitMix64(seed ^ SplitMix64(key ^ kTagKey));
}

void HashKeys(uint64_t pseed, uint32_t keys[3]) {
  for (uint64_t j = 0; j < 3; ++j) keys[j] = (uint32_t)SplitMix64(pseed ^ (kTagHash + j));
}

uint64_t RoundKey(uint64_t pseed, uint32_t rank, uint64_t step) {
  return SplitMix64(SplitMix64(pseed ^ kTagRound) ^ SplitMix64(codec::RankStep(rank, step)));
}

uint32_t SampleKey(uint64_t pseed, uint32_t rank, uint64_t step) {
  return (uint32_t)SplitMix64(RoundKey(pseed, rank, step) ^ kTagSample);
}

uint64_t Fingerprint(size_t d, size_t m, uint64_t pseed) {
  return SplitMix64(SplitMix64(SplitMix64(kTagFp ^ kVersion) ^ d) ^ m) ^ pseed;
}

void Buckets(uint64_t pseed, const uint32_t* idx, size_t n, uint32_t sub, uint32_t* b,
             uint8_t* neg) {
  uint32_t keys[3];
  HashKeys(pseed, keys);
  K().buckets(keys, idx, n, sub, b, neg);
}

// -- fixed point ---------------------------------------------------------------------------------
int ScaleExponent(double max_abs, uint32_t n) {
  if (max_abs == 0) return 0;
  int ex = 0;
  std::frexp((double)n * max_abs, &ex);
  int e = 31 - ex;
  if ((double)n * std::ceil(std::ldexp(max_abs, e)) > (double)kInt32Max) --e;
  return e;
}

int64_t Quantize(float v, int e, uint64_t u) {
  const uint32_t bits = Bits(v);
  const int ex = (int)((bits >> 23) & 0xFF);
  uint64_t mant = bits & 0x7FFFFFu;
  if (ex > 0) mant |= 1u << 23;
  const int sh = (ex > 0 ? ex - 150 : -149) + e;  // |v| * 2^e = mant * 2^sh
  uint64_t mag;
  if (sh >= 0) {
    mag = mant << sh;  // < 2^31: |v| <= max_abs keeps it there
  } else {
    const int k = -sh;  // fraction bits
    const uint64_t whole = k >= 64 ? 0 : mant >> k;
    const uint64_t frac = k >= 64 ? mant : mant & ((uint64_t{1} << k) - 1);
    bool up;
    if (k <= 64) up = (u >> (64 - k)) < frac;  // k >= 1 here
    else up = u < (k - 64 >= 64 ? 0 : frac >> (k - 64));
    mag = whole + (up ? 1 : 0);
  }
  return (bits >> 31) ? -(int64_t)mag : (int64_t)mag;
}

uint64_t KeepCount(double topk, size_t d) {
  const double k = std::ceil(topk * (double)d - 1e-9);
  return std::max<uint64_t>(1, std::min<uint64_t>(d, (uint64_t)std::max(k, 0.0)));
}

// -- encoder -------------------------------------------------------------------------------------
struct Encoder::Impl {
  Geometry geo;
  uint64_t pseed;
  uint32_t rank;
  double topk;
  bool sampled;
  bool ef;
  uint64_t step = 0;
  std::vector<float> residual;  // d floats when ef
  std::vector<float> a;         // x + residual, scratch
  std::vector<uint32_t> hist, idx, qidx, q, bk;
  std::vector<uint8_t> neg;
  std::vector<uint64_t> words;
};

Encoder::Encoder(const Geometry& geo, uint64_t pseed, uint32_t rank, double topk, bool sampled,
                 bool error_feedback)
    : impl_(new Impl) {
  impl_->geo = geo;
  impl_->pseed = pseed;
  impl_->rank = rank;
  impl_->topk = topk;
  impl_->sampled = sampled;
  impl_->ef = error_feedback && topk > 0;
  if (impl_->ef) impl_->residual.assign(geo.d, 0.0f);
}
Encoder::~Encoder() { delete impl_; }
const Geometry& Encoder::geometry() const { return impl_->geo; }
uint64_t Encoder::step() const { return impl_->step; }
void Encoder::set_step(uint64_t step) { impl_->step = step; }
const float* Encoder::residual() const { return impl_->ef ? impl_->residual.data() : nullptr; }
void Encoder::ValuesAt(const uint32_t* idx, size_t k, int32_t* out) const {
  const std::vector<uint32_t>& have = impl_->qidx;  // ascending: the last encode's support
  for (size_t t = 0; t < k; ++t) {
    const auto it = std::lower_bound(have.begin(), have.end(), idx[t]);
    out[t] =
        (it != have.end() && *it == idx[t]) ? (int32_t)impl_->q[(size_t)(it - have.begin())] : 0;
  }
}
void Encoder::ResetResidual() { std::fill(impl_->residual.begin(), impl_->residual.end(), 0.f); }

namespace {
// x (+ residual) into *a; the status and message of a NaN/Inf.
Status Prepare(const float* x, const std::vector<float>& res, bool ef, size_t d,
               std::vector<float>* a, const float** out, uint32_t* max_mag, std::string* error) {
  int rc;
  if (ef) {
    a->resize(d);
    rc = K().prepare(x, res.data(), a->data(), d, max_mag);
    *out = a->data();
  } else {
    rc = K().prepare(x, nullptr, nullptr, d, max_mag);
    *out = x;
  }
  if (rc == 0) return Status::kOk;
  for (size_t i = 0; i < d && rc == 1; ++i) {
    if ((Bits(x[i]) & 0x7F800000u) == 0x7F800000u) {
      *error = "x contains NaN or Inf (first at index " + std::to_string(i) + ")";
      return Status::kNonFinite;
    }
  }
  *error = "x + the error-feedback residual overflowed float32";
  return Status::kNonFinite;
}
}  // namespace

namespace {
// The k-th largest magnitude (float bits without the sign) of a[0, d), 1 <= k <= d, and in
// *above how many are larger: a radix select on the top then the low 16 bits (two passes).
uint32_t KthLargest(const float* a, size_t d, uint64_t k, std::vector<uint32_t>* hist,
                    uint64_t* above) {
  hist->assign(1u << 16, 0);
  uint32_t* h = hist->data();
  for (size_t i = 0; i < d; ++i) ++h[(Bits(a[i]) & kAbs) >> 16];
  uint64_t cum = 0;
  uint32_t hi = 0xFFFF;
  for (;; --hi) {  // the bin holding the k-th largest: cum (larger bins) < k <= cum + h[hi]
    if (cum + h[hi] >= k) break;
    cum += h[hi];
  }
  hist->assign(1u << 16, 0);
  h = hist->data();
  for (size_t i = 0; i < d; ++i) {
    const uint32_t mag = Bits(a[i]) & kAbs;
    if ((mag >> 16) == hi) ++h[mag & 0xFFFF];
  }
  uint32_t lo = 0xFFFF;
  for (;; --lo) {
    if (cum + h[lo] >= k) break;
    cum += h[lo];
  }
  *above = cum;
  return (hi << 16) | lo;
}
}  // namespace

Status Encoder::MaxAbs(const float* x, double* max_abs, std::string* error) {
  Impl& s = *impl_;
  const float* a = nullptr;
  uint32_t mm = 0;
  const Status st = Prepare(x, s.residual, s.ef, s.geo.d, &s.a, &a, &mm, error);
  if (st != Status::kOk) return st;
  *max_abs = (double)FromBits(mm);
  return Status::kOk;
}

Status Encoder::Encode(const float* x, double max_abs, uint32_t n, uint8_t* payload,
                       std::string* error) {
  Impl& s = *impl_;
  const size_t d = s.geo.d;
  if (!std::isfinite(max_abs) || max_abs < 0) {
    *error = "max_abs=" + Str(max_abs) + " must be finite and >= 0";
    return Status::kBadArgument;
  }
  if (n < 1 || n > kMaxWorkers) {
    *error =
        "num_workers=" + std::to_string(n) + " must be in [1, " + std::to_string(kMaxWorkers) + "]";
    return Status::kBadArgument;
  }
  const float* a = nullptr;
  uint32_t mm = 0;
  Status st = Prepare(x, s.residual, s.ef, d, &s.a, &a, &mm, error);
  if (st != Status::kOk) return st;
  const int e = ScaleExponent(max_abs, n);

  // Which values are kept: the nonzeros, or the top-k of them (exact or sampled threshold).
  s.words.assign((d + 63) / 64, 0);
  const size_t nnz = K().nonzero_bitmap(a, d, s.words.data());
  enum { kAll, kExact, kAtLeast } rule = kAll;
  uint32_t tau = 0;   // exact: keep magnitudes > tau and the first `ties` equal to it;
  uint64_t ties = 0;  // sampled: keep magnitudes >= tau
  if (s.topk > 0 && !s.sampled) {
    const uint64_t k = KeepCount(s.topk, d);
    if (nnz > k) {
      uint64_t above = 0;
      tau = KthLargest(a, d, k, &s.hist, &above);  // > 0 since nnz > k
      ties = k - above;
      rule = kExact;
    }
  } else if (s.topk > 0) {
    const uint32_t skey = SampleKey(s.pseed, s.rank, s.step);
    std::vector<uint32_t> smp(kSamples);
    for (uint32_t j = 0; j < kSamples; ++j)
      smp[j] = Bits(a[((uint64_t)Hash32(skey ^ j) * (uint64_t)d) >> 32]) & kAbs;
    std::sort(smp.begin(), smp.end(), [](uint32_t p, uint32_t q) { return p > q; });
    const double rr = std::ceil(s.topk * kSamples - 1e-9) - 1;
    tau = smp[(size_t)std::min<double>(kSamples - 1, std::max(0.0, rr))];
    rule = kAtLeast;
  }
  // The kept indices, ascending (ties go to the lower index), and their largest magnitude.
  s.idx.clear();
  uint32_t kept_max = 0;
  for (size_t w = 0; w < s.words.size(); ++w) {
    for (uint64_t word = s.words[w]; word; word &= word - 1) {
      const uint32_t i = (uint32_t)(w * 64 + (size_t)__builtin_ctzll(word));
      const uint32_t mag = Bits(a[i]) & kAbs;
      if (rule == kAtLeast && mag < tau) continue;
      if (rule == kExact && mag <= tau) {
        if (mag < tau || ties == 0) continue;
        --ties;
      }
      s.idx.push_back(i);
      kept_max = std::max(kept_max, mag);
    }
  }
  if (!s.idx.empty() && (double)FromBits(kept_max) > max_abs) {
    *error = "max_abs=" + Str(max_abs) +
             " is below this worker's max |v| = " + Str((double)FromBits(kept_max)) +
             ": pass the max over workers of max_abs()";
    return Status::kBadArgument;
  }
  // Quantise, drop what rounds to 0, write bitmap and sketch.
  const Header h{kMagic, kVersion, 0, e, 1, Fingerprint(d, s.geo.m, s.pseed)};
  std::memcpy(payload, &h, kHeaderBytes);
  uint8_t* bitmap = payload + kHeaderBytes;
  uint8_t* sketch = bitmap + s.geo.bitmap_bytes;
  std::memset(bitmap, 0, s.geo.bitmap_bytes + 4 * s.geo.m);
  const uint64_t rk = RoundKey(s.pseed, s.rank, s.step);
  s.qidx.clear();
  s.q.clear();
  for (const uint32_t i : s.idx) {
    const int64_t v = Quantize(a[i], e, SplitMix64(rk ^ i));
    if (v == 0) continue;
    s.qidx.push_back(i);
    s.q.push_back((uint32_t)v);  // two's complement: the sketch adds mod 2^32
    bitmap[i / 8] |= (uint8_t)(1u << (i % 8));
  }
  const size_t nq = s.qidx.size();
  s.bk.resize(3 * nq);
  s.neg.resize(nq);
  Buckets(s.pseed, s.qidx.data(), nq, (uint32_t)s.geo.sub, s.bk.data(), s.neg.data());
  for (size_t t = 0; t < nq; ++t) {
    for (int j = 0; j < 3; ++j) {
      uint8_t* p = sketch + 4 * (size_t)s.bk[3 * t + j];
      uint32_t y;
      std::memcpy(&y, p, 4);
      y += ((s.neg[t] >> j) & 1) ? 0u - s.q[t] : s.q[t];
      std::memcpy(p, &y, 4);
    }
  }
  // Commit: the residual keeps what top-k dropped (every kept value leaves it), then the step.
  if (s.ef) {
    std::copy(a, a + d, s.residual.begin());
    for (const uint32_t i : s.idx) s.residual[i] = 0.0f;
  }
  ++s.step;
  return Status::kOk;
}

// -- aggregator ----------------------------------------------------------------------------------
namespace {
// The header of a payload of this partition; "" when it is one, else what is wrong.
std::string ParseHeader(const Geometry& geo, uint64_t fp, const uint8_t* p, size_t bytes,
                        const char* what, Header* h) {
  std::ostringstream m;
  if (bytes != geo.payload_bytes) {
    m << what << " has " << bytes << " bytes; this partition (d=" << geo.d << ", m=" << geo.m
      << ") has " << geo.payload_bytes << "-byte payloads";
    return m.str();
  }
  std::memcpy(h, p, kHeaderBytes);
  if (h->magic != kMagic || h->version != kVersion) {
    m << what << " is not an LHC v" << kVersion << " payload (magic 0x" << std::hex << h->magic
      << std::dec << ", version " << h->version << ")";
    return m.str();
  }
  if (h->fingerprint != fp) {
    m << what << " has fingerprint 0x" << std::hex << h->fingerprint << ", expected 0x" << fp
      << ": it comes from another configuration (capacity, seed, key or size)";
    return m.str();
  }
  return "";
}
}  // namespace

struct Aggregator::Impl {
  Geometry geo;
  uint64_t fp;
  uint32_t n;
  uint32_t count = 0;
  int32_t e = 0;
  std::vector<uint64_t> words;
  std::vector<uint32_t> y;
};

Aggregator::Aggregator(const Geometry& geo, uint64_t pseed, uint32_t n) : impl_(new Impl) {
  impl_->geo = geo;
  impl_->fp = Fingerprint(geo.d, geo.m, pseed);
  impl_->n = n;
  Reset();
}
Aggregator::~Aggregator() { delete impl_; }
const Geometry& Aggregator::geometry() const { return impl_->geo; }
uint32_t Aggregator::count() const { return impl_->count; }
void Aggregator::Reset() {
  impl_->count = 0;
  impl_->e = 0;
  impl_->words.assign(impl_->geo.bitmap_bytes / 8, 0);
  impl_->y.assign(impl_->geo.m, 0);
}

Status Aggregator::Add(const uint8_t* p, size_t bytes, std::string* error) {
  Impl& s = *impl_;
  Header h;
  *error = ParseHeader(s.geo, s.fp, p, bytes, "payload", &h);
  if (!error->empty()) return Status::kBadArgument;
  if (s.count && h.scale_exp != s.e) {
    *error = "payload has scale 2^" + std::to_string(h.scale_exp) + ", the ones before 2^" +
             std::to_string(s.e) + ": every worker must encode with the same max_abs and " +
             "num_workers";
    return Status::kBadArgument;
  }
  if ((uint64_t)s.count + h.count > s.n) {
    *error = std::to_string((uint64_t)s.count + h.count) +
             " payloads summed for num_workers=" + std::to_string(s.n);
    return Status::kBadArgument;
  }
  K().or_add(s.words.data(), p + kHeaderBytes, s.words.size(), s.y.data(),
             p + kHeaderBytes + s.geo.bitmap_bytes, s.geo.m);
  s.e = h.scale_exp;
  s.count += h.count;
  return Status::kOk;
}

void Aggregator::Result(uint8_t* out) const {
  const Impl& s = *impl_;
  const Header h{kMagic, kVersion, 0, s.e, s.count, s.fp};
  std::memcpy(out, &h, kHeaderBytes);
  std::memcpy(out + kHeaderBytes, s.words.data(), s.geo.bitmap_bytes);
  std::memcpy(out + kHeaderBytes + s.geo.bitmap_bytes, s.y.data(), 4 * s.geo.m);
}

// -- decode --------------------------------------------------------------------------------------
Status Decode(const Geometry& geo, uint64_t pseed, const uint8_t* sums, size_t bytes,
              double max_abs, uint32_t n, float* out, DecodeResult* res, std::string* error) {
  Header h;
  *error = ParseHeader(geo, Fingerprint(geo.d, geo.m, pseed), sums, bytes, "sums", &h);
  if (!error->empty()) return Status::kBadArgument;
  if (h.count != n) {
    *error = "the sums hold " + std::to_string(h.count) +
             " payloads, but num_workers=" + std::to_string(n);
    return Status::kBadArgument;
  }
  if (!std::isfinite(max_abs) || max_abs < 0 || n < 1 || n > kMaxWorkers) {
    *error = "max_abs=" + Str(max_abs) + " must be finite and >= 0";
    return Status::kBadArgument;
  }
  const int e = ScaleExponent(max_abs, n);
  if (h.scale_exp != e) {
    *error = "the sums are on scale 2^" + std::to_string(h.scale_exp) +
             ", but max_abs=" + Str(max_abs) + " with num_workers=" + std::to_string(n) +
             " gives 2^" + std::to_string(e) + ": decode with the max round's max_abs";
    return Status::kBadArgument;
  }
  const size_t d = geo.d, m = geo.m, nw = geo.bitmap_bytes / 8;
  // U, the union: the set bits, ascending; none past d.
  std::vector<uint32_t> u;
  for (size_t w = 0; w < nw; ++w) {
    uint64_t word;
    std::memcpy(&word, sums + kHeaderBytes + 8 * w, 8);
    for (; word; word &= word - 1) {
      const uint64_t i = w * 64 + (uint64_t)__builtin_ctzll(word);
      if (i >= d) {
        *error = "the sums' bitmap has bits set past size=" + std::to_string(d);
        return Status::kBadArgument;
      }
      u.push_back((uint32_t)i);
    }
  }
  const size_t nu = u.size();
  res->union_size = nu;
  res->rounds = 0;
  res->unresolved.clear();
  // Per bucket, in one cache line's worth: the sketch value, C[b] and the XOR of the positions
  // in U of its members (when C[b] == 1 that XOR is the one remaining member). Neither C nor the
  // XOR is sent; both follow from the bitmap.
  struct Cell {
    uint32_t y, cnt, xr;
  };
  std::vector<Cell> c(m);
  std::vector<uint32_t> b(3 * nu), x(nu, 0);
  std::vector<uint8_t> neg(nu), alive(nu, 1);
  for (size_t k = 0; k < m; ++k) {
    std::memcpy(&c[k].y, sums + kHeaderBytes + geo.bitmap_bytes + 4 * k, 4);
    c[k].cnt = c[k].xr = 0;
  }
  Buckets(pseed, u.data(), nu, (uint32_t)geo.sub, b.data(), neg.data());
  for (size_t t = 0; t < nu; ++t)
    for (int j = 0; j < 3; ++j) {
      Cell& cell = c[b[3 * t + j]];
      ++cell.cnt;
      cell.xr ^= (uint32_t)t;
    }
  std::vector<uint32_t> cand, next, p;
  for (size_t k = 0; k < m; ++k)
    if (c[k].cnt == 1) cand.push_back((uint32_t)k);
  // Round-synchronous: every pure bucket of the snapshot yields its member (phase 1), then all
  // of them leave their buckets (phase 2). A bucket is pure at the start of a round exactly
  // when the previous round brought it to count 1 (or it started so, in round one). A member
  // found twice in phase 1 is taken once (alive is cleared at once; phase 2 reads no y of P).
  while (!cand.empty()) {
    p.clear();
    for (const uint32_t k : cand) {
      if (c[k].cnt != 1) continue;
      const uint32_t t = c[k].xr;
      if (!alive[t]) continue;
      alive[t] = 0;
      const int j = (int)(k / geo.sub);  // the sub-table of bucket k
      x[t] = ((neg[t] >> j) & 1) ? 0u - c[k].y : c[k].y;
      p.push_back(t);
    }
    if (p.empty()) break;
    ++res->rounds;
    next.clear();
    for (const uint32_t t : p) {
      for (int j = 0; j < 3; ++j) {
        Cell& cell = c[b[3 * t + j]];
        cell.y -= ((neg[t] >> j) & 1) ? 0u - x[t] : x[t];
        cell.xr ^= t;
        if (--cell.cnt == 1) next.push_back(b[3 * t + j]);
      }
    }
    cand.swap(next);
  }
  // The values: every resolved index (exact even when others are not), 0 elsewhere.
  std::memset(out, 0, d * sizeof(float));
  const double scale = std::ldexp(1.0, -e);
  for (size_t t = 0; t < nu; ++t) {
    if (alive[t]) res->unresolved.push_back(u[t]);
    else out[u[t]] = (float)((double)(int32_t)x[t] * scale / (double)n);
  }
  if (!res->unresolved.empty()) return Status::kUnresolved;
  for (size_t k = 0; k < m; ++k) {
    if (c[k].y != 0) {
      *error = "the sums are inconsistent: the sketch is not zero after every index of the "
               "bitmap was peeled (a corrupted or truncated payload)";
      return Status::kBadArgument;
    }
  }
  return Status::kOk;
}

}  // namespace lhc
