// byteps-thc: THC kwargs, per-partition configuration, fingerprint (see thc_wire.h).
#include "thc_wire.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "../../nonfinite.h"

namespace byteps {
namespace common {
namespace compressor {
namespace thcwire {

const char* FindKwarg(const Kwargs& kwargs, const char* name) {
  auto it = kwargs.find(name);
  return it == kwargs.end() ? nullptr : it->second.c_str();
}

bool ParseU64(const char* text, uint64_t* out) {
  if (!text || !*text || *text == '-') return false;
  errno = 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(text, &end, 10);
  if (errno || *end) return false;
  *out = v;
  return true;
}

bool ParseDouble(const char* text, double* out) {
  if (!text || !*text) return false;
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(text, &end);
  if (errno || *end || !IsFinite(v)) return false;
  *out = v;
  return true;
}

namespace {

bool ParseBool(const std::string& text, bool* out) {
  if (text == "1" || text == "true" || text == "True" || text == "on" || text == "yes") {
    *out = true;
    return true;
  }
  if (text == "0" || text == "false" || text == "False" || text == "off" || text == "no") {
    *out = false;
    return true;
  }
  return false;
}

// Phi^-1(q) for 0 < q < 1: a rational first guess refined by Newton steps on erfc, accurate to
// a few ulps. Only used when the worker sends thc_overflow_prob without thc_clip (the Python
// side always sends thc_clip, computed once by byteps_thc).
double NormalQuantile(double q) {
  // Initial guess: the logistic-free approximation of Abramowitz & Stegun 26.2.23.
  double pp = q < 0.5 ? q : 1.0 - q;
  double t = std::sqrt(-2.0 * std::log(pp));
  double x = t - (2.515517 + 0.802853 * t + 0.010328 * t * t) /
                     (1.0 + 1.432788 * t + 0.189269 * t * t + 0.001308 * t * t * t);
  if (q < 0.5) x = -x;
  for (int i = 0; i < 6; ++i) {
    double cdf = 0.5 * std::erfc(-x / std::sqrt(2.0));
    double pdf = std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
    if (pdf <= 0) break;
    x -= (cdf - q) / pdf;
  }
  return x;
}

uint64_t Fnv1a(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

bool IsThcKwargs(const Kwargs& kwargs) {
  auto it = kwargs.find("compressor_type");
  return it != kwargs.end() && it->second == "thc";
}

std::string ParseThcKwargs(const Kwargs& kwargs, ThcSettings* out) {
  if (!IsThcKwargs(kwargs)) return "compressor_type is not 'thc'";
  ThcSettings s;
  thc::Config& c = s.config;
  const char* v;
  uint64_t u = 0;
  double f = 0;

  if ((v = FindKwarg(kwargs, "thc_bits"))) {
    if (!ParseU64(v, &u) || u < 1 || u > 8) return std::string("thc_bits=") + v + " must be 1..8";
    c.bits = static_cast<int>(u);
  }
  if ((v = FindKwarg(kwargs, "thc_granularity"))) {
    if (!ParseU64(v, &u) || u > 0xFFFFFFFFull)
      return std::string("thc_granularity=") + v + " is not an unsigned 32-bit integer";
    c.granularity = static_cast<uint32_t>(u);
  }
  const char* clip = FindKwarg(kwargs, "thc_clip");
  const char* prob = FindKwarg(kwargs, "thc_overflow_prob");
  if (clip) {
    if (!ParseDouble(clip, &f) || f <= 0)
      return std::string("thc_clip=") + clip + " must be a positive number";
    c.clip = f;
  }
  if (prob) {
    if (!ParseDouble(prob, &f) || f <= 0 || f >= 1)
      return std::string("thc_overflow_prob=") + prob + " must be in (0, 1)";
    double t = NormalQuantile(1.0 - f / 2.0);
    if (!clip) {
      c.clip = t;
    } else if (std::fabs(t - c.clip) > 1e-9 * t) {
      std::ostringstream os;
      os.precision(17);
      os << "thc_clip=" << clip << " does not match thc_overflow_prob=" << prob
         << " (Phi^-1(1 - p/2) = " << t << "); send one of them or consistent values";
      return os.str();
    }
  }
  if ((v = FindKwarg(kwargs, "thc_seed"))) {
    if (!ParseU64(v, &u))
      return std::string("thc_seed=") + v + " is not an unsigned 64-bit integer";
    c.seed = u;
  }
  if ((v = FindKwarg(kwargs, "thc_rotation_block"))) {
    if (!ParseU64(v, &u) || (u & (u - 1)))
      return std::string("thc_rotation_block=") + v +
             " must be 0 (the default per partition) or a power of two";
    c.rotation_block = u;
  }
  if ((v = FindKwarg(kwargs, "thc_tiling")) && std::string(v) != kTiling)
    return std::string("thc_tiling=") + v + ": this build tiles partitions as " + kTiling +
           "; every worker and the server must run the same byteps-thc";
  // A scale per rotation block (ThcConfig.block_scale) is the DDP hook's and FSDP's: this
  // compressor's max round carries one norm per partition, so it refuses the setting rather
  // than quantise otherwise than the declaring worker asked.
  if ((v = FindKwarg(kwargs, "thc_block_scale")) && std::string(v) != "0")
    return std::string("thc_block_scale=") + v +
           ": BytePS's thc compressor keeps one norm per partition; a scale per rotation block "
           "is for the DDP hook and FSDP (byteps_thc.ddp, byteps_thc.fsdp)";
  if ((v = FindKwarg(kwargs, "thc_sums")) && std::string(v) != kSums)
    return std::string("thc_sums=") + v + ": this build publishes the sums as " + kSums +
           "; every worker and the server must run the same byteps-thc";
  v = FindKwarg(kwargs, "thc_table");
  if (!v) {
    return "thc_table is missing: the worker must send the solved table "
           "(byteps_thc.ThcConfig(...).to_kwargs() includes it)";
  }
  c.table.clear();
  {
    std::string text(v), item;
    std::istringstream is(text);
    while (std::getline(is, item, ',')) {
      if (!ParseU64(item.c_str(), &u) || u > 0xFFFFFFFFull)
        return std::string("thc_table=") + v + ": '" + item + "' is not an unsigned integer";
      c.table.push_back(static_cast<uint32_t>(u));
    }
  }
  auto ef = kwargs.find("thc_error_feedback");
  if (ef != kwargs.end()) {
    if (!ParseBool(ef->second, &s.error_feedback))
      return "thc_error_feedback=" + ef->second + " must be 1 or 0";
  } else if (kwargs.count("ef_type")) {
    // BytePS's generic switch: THC keeps its own residual instead of the EF decorator.
    s.error_feedback = true;
  }
  auto nf = kwargs.find("thc_nonfinite");
  if (nf != kwargs.end()) {
    if (nf->second != "propagate" && nf->second != "error")
      return "thc_nonfinite=" + nf->second + " must be propagate or error";
    s.nonfinite_error = nf->second == "error";
  }
  if ((v = FindKwarg(kwargs, "thc_codec_threads"))) {
    if (!ParseU64(v, &u) || u < 1 || u > static_cast<uint64_t>(thc::kMaxThreads))
      return std::string("thc_codec_threads=") + v + " must be 1.." +
             std::to_string(thc::kMaxThreads) + " (BYTEPS_THC_CODEC_THREADS)";
    s.codec_threads = static_cast<int>(u);
  }
  std::string err = thc::Validate(c);
  if (!err.empty()) return err;
  *out = std::move(s);
  return "";
}

thc::Config PartitionConfig(const thc::Config& declared, uint64_t key) {
  thc::Config c = declared;
  c.seed = thc::SplitMix64(declared.seed ^ thc::SplitMix64(key ^ 0x7468635f6b657921ull));
  return c;
}

std::string Describe(const thc::Config& cfg) {
  char clip[40];
  std::snprintf(clip, sizeof(clip), "%.17g", cfg.clip);
  std::ostringstream os;
  os << "bits=" << cfg.bits << " granularity=" << cfg.granularity << " clip=" << clip
     << " seed=" << cfg.seed << " rotation_block=" << cfg.rotation_block << " tiling=" << kTiling
     << " sums=" << kSums << " table=";
  for (size_t i = 0; i < cfg.table.size(); ++i) os << (i ? "," : "") << cfg.table[i];
  return os.str();
}

uint64_t Fingerprint(const thc::Config& cfg, size_t d) {
  std::ostringstream os;
  os << "thc-wire-" << kWireVersion << " " << Describe(cfg) << " d=" << d;
  return thc::SplitMix64(Fnv1a(os.str()));
}

int CommandType(int request_type, int dtype) {
  // The same pairing as byteps::common::GetCommandType, which the server inverts.
  return (((request_type + dtype) * (request_type + dtype + 1)) / 2) + dtype;
}

}  // namespace thcwire
}  // namespace compressor
}  // namespace common
}  // namespace byteps
