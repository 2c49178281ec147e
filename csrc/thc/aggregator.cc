// byteps-thc codec core: the aggregator (docs/ALGORITHM.md, "Aggregate"). Integer work only.
#include <cstring>
#include <sstream>
#include <vector>

#include "thc/internal.h"
#include "thc/thc.h"

namespace thc {

struct Aggregator::Impl {
  Config cfg;
  Geometry geo;
  uint32_t num_workers = 0;
  int lane_bits = 0;
  uint32_t count = 0;
  std::vector<uint32_t> tbl;
  detail::AlignedArray<uint8_t> sums;  // lanes of lane_bits, cache-line aligned
};

Aggregator::Aggregator(const Config& cfg, size_t d, uint32_t num_workers) : impl_(new Impl) {
  Impl& m = *impl_;
  m.cfg = cfg;
  m.geo = MakeGeometry(cfg, d);
  m.num_workers = num_workers;
  m.lane_bits = LaneBits(cfg, num_workers);
  m.tbl.assign(cfg.table.begin(), cfg.table.end());
  m.tbl.resize(1u << cfg.bits, cfg.granularity);
  if (m.lane_bits) m.sums.resize(m.geo.padded * (size_t)m.lane_bits / 8);
}

Aggregator::~Aggregator() { delete impl_; }

const Geometry& Aggregator::geometry() const { return impl_->geo; }
int Aggregator::lane_bits() const { return impl_->lane_bits; }
uint32_t Aggregator::count() const { return impl_->count; }
const void* Aggregator::sums() const { return impl_->sums.data(); }
size_t Aggregator::sums_bytes() const { return impl_->geo.padded * (size_t)impl_->lane_bits / 8; }
void Aggregator::Reset() {
  if (impl_->sums.size()) std::memset(impl_->sums.data(), 0, impl_->sums.size());
  impl_->count = 0;
}

Status Aggregator::Add(const uint8_t* payload, size_t bytes, std::string* error) {
  Impl& m = *impl_;
  auto fail = [&](const std::string& msg) {
    if (error) *error = msg;
    return Status::kBadArgument;
  };
  if (m.lane_bits == 0) {
    std::ostringstream s;
    s << "num_workers * granularity = " << (uint64_t)m.num_workers * m.cfg.granularity
      << " does not fit a 32-bit lane (num_workers=" << m.num_workers
      << ", granularity=" << m.cfg.granularity << ")";
    return fail(s.str());
  }
  if (bytes != m.geo.payload_bytes) {
    std::ostringstream s;
    s << "payload has " << bytes << " bytes, expected " << m.geo.payload_bytes << " (d=" << m.geo.d
      << ", padded=" << m.geo.padded << ", bits=" << m.cfg.bits << ")";
    return fail(s.str());
  }
  if (m.count >= m.num_workers) {
    std::ostringstream s;
    s << "already added " << m.count << " payloads, num_workers=" << m.num_workers
      << "; call reset() before the next round";
    return fail(s.str());
  }
  detail::ActiveKernels().add_indices(payload, m.geo.padded, m.cfg.bits, m.tbl.data(), m.lane_bits,
                                      m.sums.data());
  ++m.count;
  return Status::kOk;
}

}  // namespace thc
