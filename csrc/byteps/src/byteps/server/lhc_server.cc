// byteps-thc: the server's integer-only LHC path (see lhc_server.h).
//
// For a key registered with compressor_type=lhc the server never touches a float: each push is
// one lhc payload (header, support bitmap, int32 count sketch); it is checked and handed to
// lhc::Aggregator, which ORs the bitmap words and adds the sketch mod 2^32; the n-th push
// publishes the aggregated payload and every pull of the round returns it as it is.
//
// The scale rule (docs/LHC.md, "Scale"): every worker quantises on 2^e with e the largest for
// which n * M * 2^e < 2^31, M the max round's agreed max |v|; then every per-index sum of the n
// workers fits int32. The server knows M (the max round of the same key) and n, so it refuses a
// payload whose e is not the rule's: a larger e could overflow the int32 sums (silently wrong
// values after peeling), a smaller one would be a worker on another max.
#include "lhc_server.h"

#include <cstring>
#include <sstream>
#include <vector>

#include "../common/compressor/impl/lhc_wire.h"

namespace byteps {
namespace server {

namespace lw = common::compressor::lhcwire;

struct LhcKey {
  lw::LhcSettings settings;
  lhc::Geometry geo;
  uint64_t pseed = 0;
  uint64_t fingerprint = 0;
  uint32_t num_workers = 0;
  std::string description;
  std::unique_ptr<lhc::Aggregator> agg;
  std::vector<char> result;
  std::vector<uint32_t> fallback;  // the fallback round's sums, mod 2^32
  bool fallback_sized = false;
};

bool LhcIsRegistration(const LhcKwargs& kwargs) { return lw::IsLhcKwargs(kwargs); }

std::string LhcRegister(const LhcKwargs& kwargs, uint64_t key, int sender, size_t d, uint32_t n,
                        std::shared_ptr<LhcKey>* state, uint64_t* fingerprint,
                        std::string* description, bool* nonfinite_error) {
  lw::LhcSettings s;
  std::string err = lw::ParseLhcKwargs(kwargs, &s);
  if (!err.empty()) return err;
  lhc::Geometry geo;
  err = lw::PartitionGeometry(s, d, &geo);
  if (!err.empty()) return "partition of d=" + std::to_string(d) + ": " + err;
  const uint64_t pseed = lhc::PartitionSeed(s.seed, key);
  const uint64_t fp = lhc::Fingerprint(geo.d, geo.m, pseed);
  const std::string desc =
      lw::Describe(s) + " d=" + std::to_string(d) + " m=" + std::to_string(geo.m);
  if (*state) {
    const LhcKey& k = **state;
    if (fp != k.fingerprint) {
      return "LHC settings differ between workers: node " + std::to_string(sender) + " declared " +
             desc + ", but the key was registered with " + k.description;
    }
    if (s.nonfinite_error != k.settings.nonfinite_error) {
      return std::string("lhc_nonfinite differs between workers: node ") + std::to_string(sender) +
             " declared " + (s.nonfinite_error ? "error" : "propagate") +
             ", the key was registered with " +
             (k.settings.nonfinite_error ? "error" : "propagate");
    }
    return "";
  }
  if (n < 1 || n > lhc::kMaxWorkers) {
    return "overflow-prone configuration: " + std::to_string(n) +
           " workers; LHC's int32 sums with at least one bit per value take at most " +
           std::to_string(lhc::kMaxWorkers);
  }
  std::shared_ptr<LhcKey> k(new LhcKey);
  k->settings = s;
  k->geo = geo;
  k->pseed = pseed;
  k->fingerprint = fp;
  k->num_workers = n;
  k->description = desc;
  k->agg.reset(new lhc::Aggregator(geo, pseed, n));
  k->result.assign(geo.payload_bytes, 0);
  *state = k;
  *fingerprint = fp;
  *description = desc;
  *nonfinite_error = s.nonfinite_error;
  return "";
}

std::string LhcAdd(LhcKey* k, uint64_t key, int sender, const char* p, size_t len,
                   double agreed_max) {
  std::ostringstream os;
  os << "LHC key " << key << ": push from node " << sender << ": ";
  const std::string where = os.str();
  if (len < lhc::kHeaderBytes) {
    return where + std::to_string(len) + " bytes is shorter than the 24-byte LHC header";
  }
  lhc::Header h;
  std::memcpy(&h, p, sizeof(h));
  if (h.magic != lhc::kMagic || h.version != lhc::kVersion) {
    os << "not an LHC payload (magic 0x" << std::hex << h.magic << std::dec << ", version "
       << h.version << ")";
    return os.str();
  }
  if (h.fingerprint != k->fingerprint) {
    os << "LHC configuration mismatch (fingerprint 0x" << std::hex << h.fingerprint
       << ", the key was registered with 0x" << k->fingerprint << std::dec << ": " << k->description
       << "); every worker must use the same capacity, seed and partitioning";
    return os.str();
  }
  if (len == lhc::kHeaderBytes && h.count == 0) {
    return where + "that worker could not encode this round (its log and its exception say why)";
  }
  if (len != k->geo.payload_bytes) {
    os << "wrong payload length " << len << " bytes, expected " << k->geo.payload_bytes
       << " (24-byte header + " << k->geo.bitmap_bytes << "-byte bitmap + " << k->geo.m
       << " int32 buckets for d=" << k->geo.d << ")";
    return os.str();
  }
  if (h.count != 1) {
    os << "count " << h.count << " in a worker's payload (a worker sends one payload, count 1)";
    return os.str();
  }
  if (h.reserved != 0) {
    os << "reserved header field " << h.reserved << " (must be 0)";
    return os.str();
  }
  if (!common::compressor::thcwire::IsFinite(agreed_max) || agreed_max < 0) {
    os << "no finite agreed max |v| for this round (" << agreed_max << ")";
    return os.str();
  }
  const int rule = lhc::ScaleExponent(agreed_max, k->num_workers);
  if (h.scale_exp != rule) {
    os << "scale 2^" << h.scale_exp << " is not the scale rule's 2^" << rule
       << " for the agreed max |v| " << agreed_max << " and " << k->num_workers << " workers"
       << (h.scale_exp > rule ? ": its int32 sums could overflow" : "")
       << "; every worker must quantise on the scale of the max round";
    return os.str();
  }
  std::string err;
  if (k->agg->Add(reinterpret_cast<const uint8_t*>(p), len, &err) != lhc::Status::kOk) {
    return where + err;
  }
  return "";
}

std::string LhcFallbackAdd(LhcKey* k, uint64_t key, int sender, const char* p, size_t len,
                           bool first) {
  std::ostringstream os;
  os << "LHC key " << key << ": fallback push from node " << sender << ": ";
  lw::FallbackHeader h;
  if (len < sizeof(h)) {
    os << len << " bytes is shorter than the 16-byte fallback header";
    return os.str();
  }
  std::memcpy(&h, p, sizeof(h));
  if (h.magic != lw::kFallbackMagic) {
    os << "not an LHC fallback push (magic 0x" << std::hex << h.magic << ")";
    return os.str();
  }
  if (h.fingerprint != k->fingerprint) {
    os << "LHC configuration mismatch (fingerprint 0x" << std::hex << h.fingerprint
       << ", the key was registered with 0x" << k->fingerprint << std::dec << ": " << k->description
       << ")";
    return os.str();
  }
  if (h.count == 0 || h.count > k->geo.d || len != sizeof(h) + 4 * static_cast<size_t>(h.count)) {
    os << "count " << h.count << " and " << len
       << " bytes (16 + 4 count, count in [1, d=" << k->geo.d << "])";
    return os.str();
  }
  if (first || !k->fallback_sized) {
    k->fallback.assign(h.count, 0);
    k->fallback_sized = true;
  } else if (h.count != k->fallback.size()) {
    os << h.count << " unresolved indices, another worker sent " << k->fallback.size()
       << " (every worker peels the same sums: the workers are not in step)";
    return os.str();
  }
  const char* v = p + sizeof(h);
  for (size_t t = 0; t < h.count; ++t) {
    uint32_t x;
    std::memcpy(&x, v + 4 * t, 4);
    k->fallback[t] += x;
  }
  return "";
}

const char* LhcFallbackResult(LhcKey* k, size_t* bytes) {
  *bytes = 4 * k->fallback.size();
  return reinterpret_cast<const char*>(k->fallback.data());
}

void LhcFallbackReset(LhcKey* k) {
  k->fallback.clear();
  k->fallback_sized = false;
}

const char* LhcResult(LhcKey* k, size_t* bytes) {
  k->agg->Result(reinterpret_cast<uint8_t*>(k->result.data()));
  *bytes = k->result.size();
  return k->result.data();
}

void LhcReset(LhcKey* k) { k->agg->Reset(); }

}  // namespace server
}  // namespace byteps
