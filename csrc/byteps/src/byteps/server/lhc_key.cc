// byteps-thc: LHC's key on the server (codec_key.h), integer-only.
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
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "../common/compressor/impl/lhc_wire.h"
#include "../common/logging.h"
#include "../common/nonfinite.h"
#include "codec_key.h"

namespace byteps {
namespace server {

namespace {

namespace lw = common::compressor::lhcwire;

class LhcKey : public CodecKey {
 public:
  const char* name() const override { return "LHC"; }
  bool configured() const override { return agg_ != nullptr; }
  uint64_t fingerprint() const override { return fingerprint_; }
  const std::string& description() const override { return description_; }
  bool nonfinite_error() const override { return settings_.nonfinite_error; }
  bool has_fallback() const override { return true; }

  std::string Register(const Kwargs& kwargs, uint64_t key, int sender, size_t stored_len,
                       int stored_dtype, uint32_t n) override {
    if (!lw::IsLhcKwargs(kwargs)) {
      auto it = kwargs.find("compressor_type");
      return "compressor_type=" + (it == kwargs.end() ? std::string() : it->second) +
             " but other workers declared LHC";
    }
    if (stored_dtype != 0 || !stored_len || stored_len % 4) {
      return "no initial push of a float32 tensor before the registration (len=" +
             std::to_string(stored_len) + ", dtype=" + std::to_string(stored_dtype) + ")";
    }
    const size_t d = stored_len / 4;
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
    if (agg_) {
      if (fp != fingerprint_) {
        return "LHC settings differ between workers: node " + std::to_string(sender) +
               " declared " + desc + ", but the key was registered with " + description_;
      }
      if (s.nonfinite_error != settings_.nonfinite_error) {
        return std::string("lhc_nonfinite differs between workers: node ") +
               std::to_string(sender) + " declared " + common::NonfiniteName(s.nonfinite_error) +
               ", the key was registered with " + common::NonfiniteName(settings_.nonfinite_error);
      }
      return "";
    }
    if (n < 1 || n > lhc::kMaxWorkers) {
      return "overflow-prone configuration: " + std::to_string(n) +
             " workers; LHC's int32 sums with at least one bit per value take at most " +
             std::to_string(lhc::kMaxWorkers);
    }
    settings_ = s;
    geo_ = geo;
    fingerprint_ = fp;
    num_workers_ = n;
    description_ = desc;
    agg_.reset(new lhc::Aggregator(geo, pseed, n));
    result_.assign(geo.payload_bytes, 0);
    LOG(INFO) << "LHC key " << key << " registered: " << description_ << ", " << n << " workers";
    return "";
  }

  // Checked (size, header, fingerprint, count, the scale the rule gives for the agreed max and
  // n) and added.
  std::string Add(uint64_t key, int sender, const char* p, size_t len, double agreed_max) override {
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
    if (h.fingerprint != fingerprint_) {
      os << Mismatch(h.fingerprint)
         << "; every worker must use the same capacity, seed and partitioning";
      return os.str();
    }
    if (len == lhc::kHeaderBytes && h.count == 0) {
      return where + "that worker could not encode this round (its log and its exception say why)";
    }
    if (len != geo_.payload_bytes) {
      os << "wrong payload length " << len << " bytes, expected " << geo_.payload_bytes
         << " (24-byte header + " << geo_.bitmap_bytes << "-byte bitmap + " << geo_.m
         << " int32 buckets for d=" << geo_.d << ")";
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
    if (!common::IsFinite(agreed_max) || agreed_max < 0) {
      os << "no finite agreed max |v| for this round (" << agreed_max << ")";
      return os.str();
    }
    const int rule = lhc::ScaleExponent(agreed_max, num_workers_);
    if (h.scale_exp != rule) {
      os << "scale 2^" << h.scale_exp << " is not the scale rule's 2^" << rule
         << " for the agreed max |v| " << agreed_max << " and " << num_workers_ << " workers"
         << (h.scale_exp > rule ? ": its int32 sums could overflow" : "")
         << "; every worker must quantise on the scale of the max round";
      return os.str();
    }
    std::string err;
    if (agg_->Add(reinterpret_cast<const uint8_t*>(p), len, &err) != lhc::Status::kOk) {
      return where + err;
    }
    return "";
  }

  // The aggregated payload (bitmaps ORed, sketches added mod 2^32), as 32-bit values.
  ps::SArray<char> Publish(uint64_t round) override {
    agg_->Result(reinterpret_cast<uint8_t*>(result_.data()));
    char* payload = nullptr;
    ps::SArray<char> out = NewReply(32, num_workers_, round, result_.size(), &payload);
    std::memcpy(payload, result_.data(), result_.size());
    return out;
  }

  void Reset() override {
    if (agg_) agg_->Reset();
  }

  // The exact fallback round (lhc_wire.h): checked (header, fingerprint, length, the same count
  // as the round's other pushes) and the workers' int32 values at the unresolved indices added
  // mod 2^32. `first`: the round's first push, which sets the count.
  std::string FallbackAdd(uint64_t key, int sender, const char* p, size_t len,
                          bool first) override {
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
    if (h.fingerprint != fingerprint_) {
      os << Mismatch(h.fingerprint);
      return os.str();
    }
    if (h.count == 0 || h.count > geo_.d || len != sizeof(h) + 4 * static_cast<size_t>(h.count)) {
      os << "count " << h.count << " and " << len
         << " bytes (16 + 4 count, count in [1, d=" << geo_.d << "])";
      return os.str();
    }
    if (first || !fallback_sized_) {
      fallback_.assign(h.count, 0);
      fallback_sized_ = true;
    } else if (h.count != fallback_.size()) {
      os << h.count << " unresolved indices, another worker sent " << fallback_.size()
         << " (every worker peels the same sums: the workers are not in step)";
      return os.str();
    }
    const char* v = p + sizeof(h);
    for (size_t t = 0; t < h.count; ++t) {
      uint32_t x;
      std::memcpy(&x, v + 4 * t, 4);
      fallback_[t] += x;
    }
    return "";
  }

  ps::SArray<char> FallbackPublish(uint64_t round) override {
    const size_t bytes = 4 * fallback_.size();
    char* payload = nullptr;
    ps::SArray<char> out = NewReply(32, num_workers_, round, bytes, &payload);
    if (bytes) std::memcpy(payload, fallback_.data(), bytes);
    return out;
  }

  void FallbackReset() override {
    fallback_.clear();
    fallback_sized_ = false;
  }

 private:
  // A push whose fingerprint is not the key's: both, and what the key was registered with.
  std::string Mismatch(uint64_t fp) const {
    std::ostringstream os;
    os << "LHC configuration mismatch (fingerprint 0x" << std::hex << fp
       << ", the key was registered with 0x" << fingerprint_ << std::dec << ": " << description_
       << ")";
    return os.str();
  }

  lw::LhcSettings settings_;
  lhc::Geometry geo_;
  uint64_t fingerprint_ = 0;
  uint32_t num_workers_ = 0;
  std::string description_;
  std::unique_ptr<lhc::Aggregator> agg_;  // set by the first registration that is taken
  std::vector<char> result_;
  std::vector<uint32_t> fallback_;  // the fallback round's sums, mod 2^32
  bool fallback_sized_ = false;
};

}  // namespace

std::unique_ptr<CodecKey> NewLhcKey(const Kwargs& kwargs) {
  if (!lw::IsLhcKwargs(kwargs)) return nullptr;
  return std::unique_ptr<CodecKey>(new LhcKey);
}

}  // namespace server
}  // namespace byteps
