// byteps-thc: LHC kwargs and per-partition geometry (see lhc_wire.h).
#include "lhc_wire.h"

#include <cmath>
#include <sstream>

namespace byteps {
namespace common {
namespace compressor {
namespace lhcwire {
namespace {

// lhc_config.MAX_CAPACITY: keeps m (about 1.33 capacity) below 2^32.
constexpr uint64_t kMaxCapacity = uint64_t{1} << 31;

// The kwarg `name`, where present, must be `no` or `yes`: *out says which (unchanged when absent).
// Returns "" or the message, which names the two in the order `first_yes` says.
std::string ParseEither(const thcwire::Kwargs& kwargs, const char* name, const std::string& no,
                        const std::string& yes, bool first_yes, bool* out) {
  const char* v = thcwire::FindKwarg(kwargs, name);
  if (!v) return "";
  const std::string m(v);
  if (m != no && m != yes) {
    return std::string(name) + "=" + m + " must be " + (first_yes ? yes : no) + " or " +
           (first_yes ? no : yes);
  }
  *out = m == yes;
  return "";
}

}  // namespace

bool IsLhcKwargs(const thcwire::Kwargs& kwargs) {
  auto it = kwargs.find("compressor_type");
  return it != kwargs.end() && it->second == "lhc";
}

std::string ParseLhcKwargs(const thcwire::Kwargs& kwargs, LhcSettings* out) {
  if (!IsLhcKwargs(kwargs)) return "compressor_type is not 'lhc'";
  LhcSettings s;
  const char* v;
  uint64_t u = 0;
  double f = 0;
  if (!(v = thcwire::FindKwarg(kwargs, "lhc_capacity")))
    return "lhc_capacity is missing (byteps_thc.LhcConfig(...).to_kwargs() includes it)";
  if (!thcwire::ParseU64(v, &u) || u < 1 || u > kMaxCapacity)
    return std::string("lhc_capacity=") + v + " must be an integer in [1, 2^31]";
  s.capacity = u;
  if ((v = thcwire::FindKwarg(kwargs, "lhc_topk"))) {
    if (!thcwire::ParseDouble(v, &f) || f < 0 || f > 1)
      return std::string("lhc_topk=") + v + " must be 0 (no sparsifier) or a fraction in (0, 1]";
    s.topk = f;
  }
  std::string err = ParseEither(kwargs, "lhc_topk_method", "exact", "sampled", false, &s.sampled);
  if (!err.empty()) return err;
  if ((v = thcwire::FindKwarg(kwargs, "lhc_seed"))) {
    if (!thcwire::ParseU64(v, &u))
      return std::string("lhc_seed=") + v + " is not an unsigned 64-bit integer";
    s.seed = u;
  }
  err = ParseEither(kwargs, "lhc_error_feedback", "0", "1", true, &s.error_feedback);
  if (err.empty()) {
    err = ParseEither(kwargs, "lhc_nonfinite", "propagate", "error", false, &s.nonfinite_error);
  }
  if (!err.empty()) return err;
  *out = s;
  return "";
}

uint64_t BucketsFor(uint64_t n) {
  // lhc_config.buckets_for, step by step in the same arithmetic: ceil(4n/9) exactly; the pair
  // floor from the binary64 n^2 / (2 * 1e-3), its cube root less 1e-9 rounded up, then raised
  // while the exact cube is below it (compared in long double, exact for s^3 < 2^64).
  const uint64_t by_load = (n * 4 + 8) / 9;
  const double need = static_cast<double>(n * n) / (2 * 1e-3);
  double root = std::ceil(std::pow(need, 1.0 / 3.0) - 1e-9);
  uint64_t by_pairs = root < 1 ? 1 : static_cast<uint64_t>(root);
  while (static_cast<long double>(by_pairs) * by_pairs * by_pairs < static_cast<long double>(need))
    ++by_pairs;
  return 3 * (by_load > by_pairs ? by_load : by_pairs);
}

std::string PartitionGeometry(const LhcSettings& s, size_t d, lhc::Geometry* geo) {
  const uint64_t nonzeros = s.capacity < d ? s.capacity : d;
  const uint64_t m = BucketsFor(nonzeros);
  std::string err = lhc::CheckGeometry(d, m);
  if (!err.empty()) return err;
  *geo = lhc::MakeGeometry(d, m);
  return "";
}

std::string Describe(const LhcSettings& s) {
  std::ostringstream os;
  os << "capacity=" << s.capacity << " seed=" << s.seed;
  return os.str();
}

}  // namespace lhcwire
}  // namespace compressor
}  // namespace common
}  // namespace byteps
