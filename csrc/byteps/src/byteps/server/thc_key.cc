// byteps-thc: THC's key on the server (codec_key.h), integer-only.
//
// For a key registered with compressor_type=thc the server never decompresses, never touches a
// float and never recompresses. Per round it does what docs/ALGORITHM.md "Aggregate" says and
// nothing else: each push is checked (magic, configuration fingerprint, length) and handed to
// thc::Aggregator (unpack, table lookup, integer add into lanes sized for n*g); the n-th push
// publishes the sums packed in thc::SumBits = ceil(log2(n*g + 1)) bits each (docs/ALGORITHM.md
// "Publish"), and every pull of that round returns them as they are.
#include <cstring>
#include <memory>
#include <sstream>
#include <string>

#include "../common/compressor/impl/thc_wire.h"
#include "../common/logging.h"
#include "../common/nonfinite.h"
#include "codec_key.h"

namespace byteps {
namespace server {
namespace {

namespace tw = common::compressor::thcwire;

int ElementBytes(int dtype) {
  switch (dtype) {
    case 0: return 4;  // BYTEPS_FLOAT32
    case 1: return 8;  // BYTEPS_FLOAT64
    case 2: return 2;  // BYTEPS_FLOAT16
    default: return 0;
  }
}

std::string Where(uint64_t key, int sender) {
  std::ostringstream os;
  os << "THC key " << key << ": push from node " << sender;
  return os.str();
}

class ThcKey : public CodecKey {
 public:
  const char* name() const override { return "THC"; }
  bool configured() const override { return agg_ != nullptr; }
  uint64_t fingerprint() const override { return fingerprint_; }
  const std::string& description() const override { return description_; }
  bool nonfinite_error() const override { return nonfinite_error_; }

  std::string Register(const Kwargs& kwargs, uint64_t key, int sender, size_t stored_len,
                       int stored_dtype, uint32_t num_workers) override {
    if (!tw::IsThcKwargs(kwargs)) {
      auto it = kwargs.find("compressor_type");
      return "compressor_type=" + (it == kwargs.end() ? std::string() : it->second) +
             " but other workers declared THC";
    }
    tw::ThcSettings settings;
    std::string err = tw::ParseThcKwargs(kwargs, &settings);
    if (!err.empty()) return err;
    const size_t elem = ElementBytes(stored_dtype);
    if (!stored_len || !elem || stored_len % elem) {
      return "no initial push of a float tensor before the registration (len=" +
             std::to_string(stored_len) + ", dtype=" + std::to_string(stored_dtype) + ")";
    }
    const thc::Config cfg = tw::PartitionConfig(settings.config, key);
    const size_t d = stored_len / elem;
    const uint64_t fp = tw::Fingerprint(cfg, d);
    if (registered_) {
      if (fp != fingerprint_) {
        return "THC settings differ between workers: node " + std::to_string(sender) +
               " declared " + tw::Describe(settings.config) + " d=" + std::to_string(d) +
               ", but the key was registered with " + description_;
      }
      if (settings.nonfinite_error != nonfinite_error_) {
        return std::string("BYTEPS_THC_NONFINITE differs between workers: node ") +
               std::to_string(sender) +
               " declared thc_nonfinite=" + common::NonfiniteName(settings.nonfinite_error) +
               ", but the key was registered with " + common::NonfiniteName(nonfinite_error_);
      }
      return "";
    }
    registered_ = true;
    cfg_ = cfg;
    d_ = d;
    fingerprint_ = fp;
    // As declared (the seed before mixing with the key), which is what users set.
    description_ = tw::Describe(settings.config) + " d=" + std::to_string(d);
    nonfinite_error_ = settings.nonfinite_error;
    num_workers_ = num_workers;
    lane_bits_ = thc::LaneBits(cfg, num_workers);
    sum_bits_ = thc::SumBits(cfg, num_workers);
    if (lane_bits_ == 0) {
      return "overflow-prone configuration: " + std::to_string(num_workers) +
             " workers x granularity " + std::to_string(cfg.granularity) +
             " does not fit a 32-bit lane; lower thc_granularity";
    }
    agg_.reset(new thc::Aggregator(cfg, d, num_workers));
    LOG(INFO) << "THC key " << key << " registered: " << description_ << ", " << num_workers
              << " workers, " << lane_bits_ << "-bit lanes, " << sum_bits_
              << "-bit sums on the wire";
    return "";
  }

  std::string Add(uint64_t key, int sender, const char* p, size_t len,
                  double /*agreed_max*/) override {
    tw::PushHeader h;
    if (len < sizeof(h)) {
      return Where(key, sender) + ": " + std::to_string(len) +
             " bytes is shorter than the 16-byte THC header";
    }
    std::memcpy(&h, p, sizeof(h));
    const size_t expect = sizeof(h) + agg_->geometry().payload_bytes;
    std::ostringstream os;
    if (h.magic != tw::kPushMagic || h.version != tw::kWireVersion) {
      os << Where(key, sender) << ": not a THC payload (magic 0x" << std::hex << h.magic << std::dec
         << ", version " << h.version << ")";
    } else if (h.fingerprint != fingerprint_) {
      os << Where(key, sender) << ": THC configuration mismatch (fingerprint 0x" << std::hex
         << h.fingerprint << ", the key was registered with 0x" << fingerprint_ << std::dec << ": "
         << description_ << "); every worker must use the same THC settings";
    } else if (len == sizeof(h) && expect > sizeof(h)) {
      os << Where(key, sender) << ": that worker could not encode this round (its log and its "
         << "exception say why)";
    } else if (len != expect) {
      os << Where(key, sender) << ": wrong payload length " << len << " bytes, expected " << expect
         << " (16-byte header + " << agg_->geometry().payload_bytes << " bytes of " << cfg_.bits
         << "-bit indices for d=" << d_ << ")";
    } else {
      std::string agg_err;
      if (agg_->Add(reinterpret_cast<const uint8_t*>(p + sizeof(h)), len - sizeof(h), &agg_err) !=
          thc::Status::kOk) {
        os << Where(key, sender) << ": " << agg_err;
      }
    }
    return os.str();
  }

  // The header, then the aggregator's lanes packed straight into the message (one pass).
  ps::SArray<char> Publish(uint64_t round) override {
    const size_t n = agg_->geometry().padded;
    char* payload = nullptr;
    ps::SArray<char> out = NewReply(static_cast<uint32_t>(sum_bits_), num_workers_, round,
                                    thc::PackedSumsBytes(n, sum_bits_), &payload);
    thc::PackSums(agg_->sums(), lane_bits_, n, sum_bits_, reinterpret_cast<uint8_t*>(payload));
    return out;
  }

  void Reset() override {
    if (agg_) agg_->Reset();
  }

 private:
  bool registered_ = false;  // the first registration was taken (it may have been refused)
  thc::Config cfg_;          // the partition's configuration (seed mixed with the key)
  std::string description_;
  size_t d_ = 0;
  uint64_t fingerprint_ = 0;
  uint32_t num_workers_ = 0;
  int lane_bits_ = 0;             // the aggregator's lanes
  int sum_bits_ = 0;              // one published sum
  bool nonfinite_error_ = false;  // thc_nonfinite=error: a non-finite norm fails the round
  std::unique_ptr<thc::Aggregator> agg_;
};

}  // namespace

std::unique_ptr<CodecKey> NewThcKey(const Kwargs& kwargs) {
  if (!tw::IsThcKwargs(kwargs)) return nullptr;
  return std::unique_ptr<CodecKey>(new ThcKey);
}

}  // namespace server
}  // namespace byteps
