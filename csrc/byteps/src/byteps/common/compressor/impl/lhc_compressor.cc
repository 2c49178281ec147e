// byteps-thc: LHC in BytePS's compressor registry (worker side). See lhc_compressor.h.
#include "lhc_compressor.h"

#include <cmath>
#include <cstring>
#include <sstream>

#include "../compressor_registry.h"

namespace byteps {
namespace common {
namespace compressor {
namespace {

std::unique_ptr<Compressor> MakeLhc(const kwargs_t& kwargs, size_t size, DataType dtype) {
  // the adapters push compressed tensors as float32 (byteps_thc.compression)
  static const CodecDtypes kDtypes{{BYTEPS_FLOAT32}, "float32"};
  return MakeMaxRoundCompressor<LhcCompressor>(kwargs, size, dtype, "LHC", lhcwire::ParseLhcKwargs,
                                               kDtypes);
}

CompressorRegistry::Register reg("lhc_compressor", MakeLhc);

}  // namespace

LhcCompressor::LhcCompressor(size_t size, DataType dtype, lhcwire::LhcSettings settings)
    : MaxRoundCompressor(size, dtype, ""), settings_(settings) {}

LhcCompressor::LhcCompressor(size_t size, DataType dtype, std::string error)
    : MaxRoundCompressor(size, dtype, std::move(error)) {}

LhcCompressor::~LhcCompressor() = default;

std::string LhcCompressor::Bind(uint64_t key, size_t bytes, uint32_t rank,
                                const std::string& name) {
  size_t d = 0;
  bool again = false;
  std::string err = CheckBind(key, bytes, &d, &again);
  if (!err.empty() || again) return err;
  if (rank > lhc::kMaxRank) return "rank " + std::to_string(rank) + " is beyond LHC's limit";
  err = lhcwire::PartitionGeometry(settings_, d, &geo_);
  if (!err.empty()) return err;
  key_ = key;
  name_ = name;
  d_ = d;
  pseed_ = lhc::PartitionSeed(settings_.seed, key);
  const bool ef = settings_.error_feedback && settings_.topk > 0;
  encoder_.reset(new lhc::Encoder(geo_, pseed_, rank, settings_.topk, settings_.sampled, ef));
  fingerprint_ = lhc::Fingerprint(geo_.d, geo_.m, pseed_);
  send_.assign(geo_.payload_bytes, 0);
  recv_.assign(sizeof(thcwire::PullHeader) + std::max(geo_.payload_bytes, thcwire::kMaxErrorBytes),
               0);
  BPS_LOG(DEBUG) << "LHC key " << key << ": " << lhcwire::Describe(settings_) << " d=" << d
                 << " m=" << geo_.m << " payload=" << geo_.payload_bytes << "B";
  return "";
}

std::string LhcCompressor::LocalNorm(tensor_t grad, double* max_abs, std::string* nonfinite) {
  nonfinite->clear();
  if (!encoder_) return "the max was asked for before the partition was bound";
  std::string err = CheckGradient(grad);
  if (!err.empty()) return err;
  const float* x = reinterpret_cast<const float*>(grad.data);
  lhc::Status st = encoder_->MaxAbs(x, max_abs, &err);
  if (st == lhc::Status::kOk) return "";
  if (st == lhc::Status::kNonFinite) {
    // the residual holds only finite values that the encoder kept from finite inputs
    ClassifyNonFinite(x, max_abs, nonfinite);
    return "";
  }
  return err.empty() ? lhc::StatusText(st) : err;
}

tensor_t LhcCompressor::Compress(tensor_t grad) {
  // The failure push: the header alone, count 0 ("this worker could not encode").
  const lhc::Header failed{lhc::kMagic, lhc::kVersion, 0, 0, 0, fingerprint_};
  if (send_.size() < lhc::kHeaderBytes) send_.assign(lhc::kHeaderBytes, 0);
  error_ = CheckCompress(grad);
  if (error_.empty() && num_workers_ == 0)
    error_ = "compress before the max round said how many workers there are";
  if (error_.empty()) {
    std::string err;
    lhc::Status st = encoder_->Encode(reinterpret_cast<const float*>(grad.data), max_abs_,
                                      num_workers_, reinterpret_cast<uint8_t*>(send_.data()), &err);
    if (st != lhc::Status::kOk) {
      std::ostringstream os;
      os << "encode failed: " << lhc::StatusText(st) << (err.empty() ? "" : ": ") << err
         << " (max |v| over the workers " << max_abs_ << ", " << num_workers_ << " workers)";
      error_ = os.str();
    }
  }
  if (!error_.empty()) {
    std::memcpy(send_.data(), &failed, lhc::kHeaderBytes);
    return {send_.data(), lhc::kHeaderBytes, grad.dtype};
  }
  return {send_.data(), geo_.payload_bytes, grad.dtype};
}

std::string LhcCompressor::ParseNormReply(size_t bytes, double* max_abs) const {
  thcwire::PullHeader h;
  double value = 0;
  std::string err = CheckMaxReply(bytes, "max-round", &h, &value);
  if (!err.empty()) return err;
  if (h.num_workers == 0 || h.num_workers > lhc::kMaxWorkers)
    return "max-round reply for " + std::to_string(h.num_workers) + " workers";
  *max_abs = value;
  // NaN and +inf are agreed non-finite values (the step is skipped); a negative one is malformed.
  if (*max_abs < 0) return "negative max |v|";
  num_workers_ = h.num_workers;
  return "";
}

tensor_t LhcCompressor::Decompress(tensor_t compressed) {
  const tensor_t none{compressed.data, 0, compressed.dtype};
  fallback_pending_ = false;
  thcwire::PullHeader h;
  error_ = CheckPullReply(compressed.size, "an LHC", &h);
  if (error_.empty() && (h.num_workers != num_workers_ || h.payload_bytes != geo_.payload_bytes)) {
    std::ostringstream os;
    os << "reply of " << h.payload_bytes << " bytes for " << h.num_workers
       << " workers; this partition has " << geo_.payload_bytes << "-byte payloads and "
       << num_workers_ << " workers";
    error_ = os.str();
  }
  if (!error_.empty()) return none;
  float* out = reinterpret_cast<float*>(compressed.data);
  lhc::DecodeResult res;
  std::string err;
  lhc::Status st =
      lhc::Decode(geo_, pseed_, reinterpret_cast<const uint8_t*>(recv_.data() + sizeof(h)),
                  h.payload_bytes, max_abs_, h.num_workers, out, &res, &err);
  if (st == lhc::Status::kUnresolved) {
    // Every worker peeled the same sums into the same unresolved set: the fallback round
    // (common/lhc_stage.cc) sends each one's values there and completes the decode exactly.
    const size_t k = res.unresolved.size();
    fb_idx_ = res.unresolved;
    fb_out_ = out;
    fb_n_ = h.num_workers;
    const lhcwire::FallbackHeader fh{lhcwire::kFallbackMagic, static_cast<uint32_t>(k),
                                     fingerprint_};
    fb_push_.assign(sizeof(fh) + 4 * k, 0);
    std::memcpy(fb_push_.data(), &fh, sizeof(fh));
    std::vector<int32_t> q(k);
    encoder_->ValuesAt(fb_idx_.data(), k, q.data());
    std::memcpy(fb_push_.data() + sizeof(fh), q.data(), 4 * k);
    fb_reply_.assign(sizeof(thcwire::PullHeader) + std::max(4 * k, thcwire::kMaxErrorBytes), 0);
    fallback_pending_ = true;
    ++fallback_rounds_;
    fallback_indices_ += k;
    // once per key, then at 10, 100, ... rounds
    if (fallback_rounds_ == 1 || fallback_rounds_ == 10 || fallback_rounds_ == 100 ||
        fallback_rounds_ % 1000 == 0) {
      BPS_LOG(WARNING) << "LHC key " << key_ << " ('" << name_ << "'): peeling left " << k << " of "
                       << res.union_size << " indices unresolved (load "
                       << static_cast<double>(res.union_size) / static_cast<double>(geo_.m)
                       << ", capacity " << settings_.capacity
                       << "): the exact fallback round sends them again. Fallback rounds of "
                       << "this key: " << fallback_rounds_ << ", indices: " << fallback_indices_
                       << "; a larger --lhc-capacity (BYTEPS_LHC_CAPACITY) avoids them";
    }
    return none;
  }
  if (st != lhc::Status::kOk) {
    error_ = std::string("decode failed: ") + lhc::StatusText(st) + (err.empty() ? "" : ": ") + err;
    return none;
  }
  // The decoded mean: the pull of an LHC tensor yields the mean (PullYieldsMean, thc_stage.h).
  return {compressed.data, d_ * 4, compressed.dtype};
}

std::string LhcCompressor::CompleteFallback(size_t bytes) {
  fallback_pending_ = false;
  const size_t k = fb_idx_.size();
  thcwire::PullHeader h;
  std::ostringstream os;
  if (bytes < sizeof(h) || bytes > fb_reply_.size()) {
    os << "fallback reply of " << bytes << " bytes (a " << sizeof(h) << "-byte header and " << 4 * k
       << " bytes of sums expected)";
    return os.str();
  }
  std::memcpy(&h, fb_reply_.data(), sizeof(h));
  if (h.magic != thcwire::kPullMagic || sizeof(h) + h.payload_bytes != bytes) {
    os << "malformed fallback reply (" << bytes << " bytes, magic 0x" << std::hex << h.magic << ")";
    return os.str();
  }
  if (h.status != 0) {
    return "the server failed the fallback round " + std::to_string(h.round) + ": " +
           std::string(fb_reply_.data() + sizeof(h), h.payload_bytes);
  }
  if (h.payload_bytes != 4 * k || h.num_workers != fb_n_) {
    os << "fallback reply of " << h.payload_bytes << " bytes for " << h.num_workers << " workers; "
       << k << " unresolved indices and " << fb_n_ << " workers expected";
    return os.str();
  }
  // Decode's value rule: float32(double(int32 sum) * 2^-e / n), the mean as Decompress yields.
  const int e = lhc::ScaleExponent(max_abs_, fb_n_);
  const double scale = std::ldexp(1.0, -e);
  const char* sums = fb_reply_.data() + sizeof(h);
  for (size_t t = 0; t < k; ++t) {
    int32_t x;
    std::memcpy(&x, sums + 4 * t, 4);
    fb_out_[fb_idx_[t]] = static_cast<float>(static_cast<double>(x) * scale / fb_n_);
  }
  return "";
}

}  // namespace compressor
}  // namespace common
}  // namespace byteps
