// byteps-thc: LHC in BytePS's compressor registry (worker side). See lhc_compressor.h.
#include "lhc_compressor.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "../compressor_registry.h"

namespace byteps {
namespace common {
namespace compressor {
namespace {

CompressorRegistry::Register reg(
    "lhc_compressor",
    [](const kwargs_t& kwargs, size_t size, DataType dtype) -> std::unique_ptr<Compressor> {
      lhcwire::LhcSettings settings;
      std::string err = lhcwire::ParseLhcKwargs(kwargs, &settings);
      if (!err.empty()) {
        err = "invalid LHC compressor kwargs: " + err;
      } else if (dtype != BYTEPS_FLOAT32) {
        // the adapters push compressed tensors as float32 (byteps_thc.compression)
        err = "LHC compresses float32 tensors, not BytePS dtype " +
              std::to_string(static_cast<int>(dtype));
      }
      if (!err.empty()) return std::unique_ptr<Compressor>(new LhcCompressor(size, dtype, err));
      return std::unique_ptr<Compressor>(new LhcCompressor(size, dtype, settings));
    });

// The first NaN among n floats (bit test: BytePS's -Ofast may fold std::isnan to false).
bool HasNaN(const float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, x + i, 4);
    if ((b & 0x7FFFFFFFu) > 0x7F800000u) return true;
  }
  return false;
}

}  // namespace

LhcCompressor::LhcCompressor(size_t size, DataType dtype, lhcwire::LhcSettings settings)
    : Compressor(size, dtype), settings_(settings) {
  norm_reply_.resize(sizeof(thcwire::PullHeader) + thcwire::kMaxErrorBytes);
}

LhcCompressor::LhcCompressor(size_t size, DataType dtype, std::string error)
    : Compressor(size, dtype), invalid_(std::move(error)) {
  norm_reply_.resize(sizeof(thcwire::PullHeader) + thcwire::kMaxErrorBytes);
}

LhcCompressor::~LhcCompressor() = default;

std::string LhcCompressor::TakeError() {
  std::string e;
  e.swap(error_);
  return e;
}

void LhcCompressor::FillNonFinite(char* out, bool nan) const {
  const uint32_t v = nan ? 0x7FC00000u : 0x7F800000u;
  for (size_t i = 0; i < d_; ++i) std::memcpy(out + 4 * i, &v, 4);
}

std::string LhcCompressor::Bind(uint64_t key, size_t bytes, uint32_t rank,
                                const std::string& name) {
  if (!invalid_.empty()) return invalid_;
  if (bytes == 0 || bytes % 4) return "partition of " + std::to_string(bytes) + " bytes";
  const size_t d = bytes / 4;
  if (encoder_) {
    if (key != key_ || d != d_) {
      return "compressor bound to key " + std::to_string(key_) + " (" + std::to_string(d_) +
             " elements) used for key " + std::to_string(key) + " (" + std::to_string(d) + ")";
    }
    return "";
  }
  if (rank > lhc::kMaxRank) return "rank " + std::to_string(rank) + " is beyond LHC's limit";
  std::string err = lhcwire::PartitionGeometry(settings_, d, &geo_);
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
  if (grad.size != d_ * 4)
    return "a gradient of " + std::to_string(grad.size) + " bytes for a partition of " +
           std::to_string(d_ * 4);
  const float* x = reinterpret_cast<const float*>(grad.data);
  std::string err;
  lhc::Status st = encoder_->MaxAbs(x, max_abs, &err);
  if (st == lhc::Status::kOk) return "";
  if (st == lhc::Status::kNonFinite) {
    // the residual holds only finite values that the encoder kept from finite inputs
    const bool nan = HasNaN(x, d_);
    *max_abs = nan ? std::numeric_limits<double>::quiet_NaN() : HUGE_VAL;
    *nonfinite = nan ? "NaN" : "Inf";
    return "";
  }
  return err.empty() ? lhc::StatusText(st) : err;
}

tensor_t LhcCompressor::Compress(tensor_t grad) {
  // The failure push: the header alone, count 0 ("this worker could not encode").
  const lhc::Header failed{lhc::kMagic, lhc::kVersion, 0, 0, 0, fingerprint_};
  if (send_.size() < lhc::kHeaderBytes) send_.assign(lhc::kHeaderBytes, 0);
  error_.clear();
  if (!encoder_) {
    error_ = "compress before the THC_NORM stage bound the partition";
  } else if (grad.size != d_ * 4) {
    error_ = "a gradient of " + std::to_string(grad.size) + " bytes for a partition of " +
             std::to_string(d_ * 4);
  } else if (num_workers_ == 0) {
    error_ = "compress before the max round said how many workers there are";
  } else {
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
  if (bytes < sizeof(h)) return "max-round reply of " + std::to_string(bytes) + " bytes";
  std::memcpy(&h, norm_reply_.data(), sizeof(h));
  if (h.magic != thcwire::kPullMagic || sizeof(h) + h.payload_bytes != bytes)
    return "malformed max-round reply (" + std::to_string(bytes) + " bytes)";
  if (h.status != 0) return std::string(norm_reply_.data() + sizeof(h), h.payload_bytes);
  if (h.payload_bytes != sizeof(double)) return "max-round reply without a double";
  if (h.num_workers == 0 || h.num_workers > lhc::kMaxWorkers)
    return "max-round reply for " + std::to_string(h.num_workers) + " workers";
  std::memcpy(max_abs, norm_reply_.data() + sizeof(h), sizeof(double));
  // NaN and +inf are agreed non-finite values (the step is skipped); a negative one is malformed.
  if (*max_abs < 0) return "negative max |v|";
  num_workers_ = h.num_workers;
  return "";
}

tensor_t LhcCompressor::Decompress(tensor_t compressed) {
  const tensor_t none{compressed.data, 0, compressed.dtype};
  error_.clear();
  fallback_pending_ = false;
  thcwire::PullHeader h;
  std::ostringstream os;
  if (!encoder_) {
    os << "decompress before the partition was bound";
  } else if (compressed.size < sizeof(h) || compressed.size > recv_.size()) {
    os << "pulled " << compressed.size << " bytes, not an LHC reply (a " << sizeof(h)
       << "-byte header and at most " << recv_.size() - sizeof(h) << " bytes)";
  } else {
    std::memcpy(&h, recv_.data(), sizeof(h));
    if (h.magic != thcwire::kPullMagic) {
      os << "the pulled bytes are not an LHC reply (magic 0x" << std::hex << h.magic << ")";
    } else if (sizeof(h) + h.payload_bytes != compressed.size) {
      os << "truncated reply: its header says " << h.payload_bytes << " bytes follow, "
         << compressed.size - sizeof(h) << " did";
    } else if (h.status != 0) {
      os << "the server failed round " << h.round << ": "
         << std::string(recv_.data() + sizeof(h), h.payload_bytes);
    } else if (h.num_workers != num_workers_ || h.payload_bytes != geo_.payload_bytes) {
      os << "reply of " << h.payload_bytes << " bytes for " << h.num_workers
         << " workers; this partition has " << geo_.payload_bytes << "-byte payloads and "
         << num_workers_ << " workers";
    }
  }
  if (!os.str().empty()) {
    error_ = os.str();
    return none;
  }
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
  // The decoded mean, times n: BytePS's pull yields sums (average=True divides by n). For n a
  // power of two this is the float32 of the exact integer sum, and the average gives back the
  // decoded mean bit for bit.
  const float n = static_cast<float>(h.num_workers);
  for (size_t i = 0; i < d_; ++i) out[i] = out[i] * n;
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
  // Decode's value rule: float32(double(int32 sum) * 2^-e / n), then times n as Decompress.
  const int e = lhc::ScaleExponent(max_abs_, fb_n_);
  const double scale = std::ldexp(1.0, -e);
  const float n = static_cast<float>(fb_n_);
  const char* sums = fb_reply_.data() + sizeof(h);
  for (size_t t = 0; t < k; ++t) {
    int32_t x;
    std::memcpy(&x, sums + 4 * t, 4);
    fb_out_[fb_idx_[t]] = static_cast<float>(static_cast<double>(x) * scale / fb_n_);
  }
  for (size_t i = 0; i < d_; ++i) fb_out_[i] = fb_out_[i] * n;
  return "";
}

}  // namespace compressor
}  // namespace common
}  // namespace byteps
