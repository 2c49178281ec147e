// byteps-thc: the Python binding of the codec core (module byteps_thc._C).
//
// Thin on purpose: argument checks, NumPy buffers (1-D, C-contiguous, exact dtype: conversions
// are byteps_thc/codec.py's job), the GIL released around every kernel, core errors turned into
// ValueError with the core's message. The math is all in csrc/thc.
//
// CUDA: a build with THC_WITH_CUDA defined links csrc/python/binding_cuda.cc, whose
// thc_python::RegisterCuda(module) adds the device functions to this same module (it can take
// `const thc::Config&` arguments: the Config class is registered here). `_C.with_cuda` tells
// Python which build it has.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "lhc/lhc.h"
#include "python/errors.h"
#include "thc/thc.h"

namespace py = pybind11;

namespace thc_python {
void RegisterLhc(py::module_& m);  // csrc/python/binding_lhc.cc: the LHC core's functions
}  // namespace thc_python

#ifdef THC_WITH_CUDA
namespace thc_python {
void RegisterCuda(py::module_& m);  // csrc/python/binding_cuda.cc
}  // namespace thc_python
#endif

namespace {

using thc_python::Fail;

void CheckConfig(const thc::Config& cfg) {
  const std::string err = thc::Validate(cfg);
  if (!err.empty()) Fail("invalid THC configuration: " + err);
}

// A core call failed: what it was, the core's text for the status, and what became of the state.
[[noreturn]] void FailStatus(const std::string& what, thc::Status st, const char* after = "") {
  Fail(what + ": " + thc::StatusText(st) + after);
}

// The one ThcConfig -> thc::Config conversion (codec.py, cuda.py and the tests call it as
// _C.core_config): the dataclass's fields, rotation_block None = 0 (the whole partition), checked.
thc::Config CoreConfig(const py::handle& c) {
  thc::Config cfg;
  cfg.bits = c.attr("bits").cast<int>();
  cfg.granularity = c.attr("granularity").cast<uint32_t>();
  cfg.clip = c.attr("clip").cast<double>();
  cfg.seed = c.attr("seed").cast<uint64_t>();
  py::object block = c.attr("rotation_block");
  cfg.rotation_block = block.is_none() ? 0 : block.cast<uint64_t>();
  cfg.table = c.attr("table").cast<std::vector<uint32_t>>();
  // absent (a duck-typed configuration of the tests): one norm per partition
  cfg.block_scale = py::hasattr(c, "block_scale") && c.attr("block_scale").cast<bool>();
  CheckConfig(cfg);
  return cfg;
}

// A 1-D C-contiguous array of exactly dtype T.
template <class T>
py::array_t<T> Vector(const py::handle& obj, const char* what, size_t expect = 0,
                      bool check_len = false) {
  if (!py::isinstance<py::array>(obj)) {
    std::ostringstream m;
    m << what << " must be a NumPy array, got " << std::string(py::str(py::type::of(obj)));
    Fail(m.str());
  }
  py::array a = py::reinterpret_borrow<py::array>(obj);
  if (!a.dtype().is(py::dtype::of<T>())) {
    std::ostringstream m;
    m << what << " must have dtype " << std::string(py::str(py::dtype::of<T>())) << ", got "
      << std::string(py::str(a.dtype()));
    Fail(m.str());
  }
  if (a.ndim() != 1) {
    std::ostringstream m;
    m << what << " must be 1-D, got " << a.ndim() << " dimensions";
    Fail(m.str());
  }
  if (!(a.flags() & py::array::c_style)) Fail(std::string(what) + " must be contiguous");
  if (check_len && (size_t)a.size() != expect) {
    std::ostringstream m;
    m << what << " has " << a.size() << " elements, expected " << expect;
    Fail(m.str());
  }
  return py::reinterpret_borrow<py::array_t<T>>(a);
}

// An output of n elements: `out_obj` (n writeable elements of T), or a new array when it is None.
template <typename T>
py::array_t<T> OutArray(const py::handle& out_obj, size_t n) {
  py::array_t<T> out = out_obj.is_none() ? py::array_t<T>(n) : Vector<T>(out_obj, "out", n, true);
  if (!out.writeable()) Fail("out must be writeable");
  return out;
}

void CheckMaxNorm(double max_norm) {
  if (!std::isfinite(max_norm)) {
    std::ostringstream m;
    m << "max_norm must be finite, got " << max_norm;
    Fail(m.str());
  }
  if (max_norm < 0) {
    std::ostringstream m;
    m << "max_norm must be >= 0, got " << max_norm;
    Fail(m.str());
  }
}

void CheckSize(size_t d) {
  if (d == 0) Fail("size must be >= 1, got 0");
  if (d > thc::kMaxSize) {
    std::ostringstream m;
    m << "size must be at most " << thc::kMaxSize << " elements, got " << d;
    Fail(m.str());
  }
}

int CheckThreads(int threads) {
  if (threads < 1 || threads > thc::kMaxThreads) {
    std::ostringstream m;
    m << "threads must be in 1.." << thc::kMaxThreads << ", got " << threads;
    Fail(m.str());
  }
  return threads;
}

// The max norm(s) of an encode or a decode: one number, or with block_scale a float64 array of
// one per rotation block (`blocks` of them), each checked as CheckMaxNorm checks one.
struct MaxNorms {
  double scalar = 0;
  py::array_t<double> blocks;
  const double* data() const { return blocks.data(); }
  size_t count() const { return (size_t)blocks.size(); }
};
MaxNorms CheckMaxNorms(const thc::Config& cfg, const py::handle& obj, size_t blocks) {
  MaxNorms m;
  const bool is_array = py::isinstance<py::array>(obj);
  if (!cfg.block_scale) {
    if (is_array) Fail("max_norm must be one number: block_scale is off");
    m.scalar = obj.cast<double>();
    CheckMaxNorm(m.scalar);
    return m;
  }
  if (!is_array) {
    std::ostringstream e;
    e << "block_scale: max_norm must be a float64 array of one max norm per rotation block ("
      << blocks << ")";
    Fail(e.str());
  }
  m.blocks = Vector<double>(obj, "max_norm (one per rotation block)", blocks, true);
  const double* v = m.blocks.data();
  for (size_t i = 0; i < blocks; ++i) {
    if (!std::isfinite(v[i]) || v[i] < 0) {
      std::ostringstream e;
      e << "block_scale: the max norm of block " << i << " must be finite and >= 0, got " << v[i];
      Fail(e.str());
    }
  }
  return m;
}

py::dict GeometryDict(const thc::Geometry& g) {
  py::dict r;
  r["d"] = g.d;
  r["block"] = g.block;
  r["padded"] = g.padded;
  r["payload_bytes"] = g.payload_bytes;
  r["tail_block"] = g.tail_block;
  return r;
}

class PyEncoder {
 public:
  PyEncoder(const thc::Config& cfg, size_t d, uint32_t rank, bool error_feedback) {
    CheckConfig(cfg);
    CheckSize(d);
    if (rank > thc::kMaxRank) {
      std::ostringstream m;
      m << "rank must be at most " << thc::kMaxRank << ", got " << rank;
      Fail(m.str());
    }
    enc_ = std::make_unique<thc::Encoder>(cfg, d, rank, error_feedback);
    ef_ = error_feedback;
    cfg_ = cfg;
  }
  double Norm(const py::handle& x) {
    auto a = Vector<float>(x, "x", enc_->geometry().d, true);
    double n = 0;
    thc::Status st;
    {
      py::gil_scoped_release nogil;
      st = enc_->Norm(a.data(), &n);
    }
    if (st != thc::Status::kOk) FailStatus(ef_ ? "norm of x + residual" : "norm of x", st);
    return n;
  }
  // block_scale: the norm of each rotation block (float64, NumBlocks of them).
  py::array_t<double> BlockNorms(const py::handle& x) {
    if (!cfg_.block_scale) Fail("block_norms needs block_scale=True");
    auto a = Vector<float>(x, "x", enc_->geometry().d, true);
    py::array_t<double> out(thc::NumBlocks(enc_->geometry()));
    thc::Status st;
    {
      py::gil_scoped_release nogil;
      st = enc_->BlockNorms(a.data(), out.mutable_data());
    }
    if (st != thc::Status::kOk)
      FailStatus(ef_ ? "block norms of x + residual" : "block norms of x", st);
    return out;
  }
  py::array_t<uint8_t> Encode(const py::handle& x, const py::handle& max_norm,
                              const py::handle& out_obj) {
    auto a = Vector<float>(x, "x", enc_->geometry().d, true);
    const MaxNorms m = CheckMaxNorms(cfg_, max_norm, thc::NumBlocks(enc_->geometry()));
    py::array_t<uint8_t> out = OutArray<uint8_t>(out_obj, enc_->geometry().payload_bytes);
    thc::Status st;
    {
      py::gil_scoped_release nogil;
      st = cfg_.block_scale ? enc_->EncodeBlocks(a.data(), m.data(), m.count(), out.mutable_data())
                            : enc_->Encode(a.data(), m.scalar, out.mutable_data());
    }
    if (st != thc::Status::kOk)
      FailStatus(ef_ ? "encode of x + residual" : "encode of x", st, "; nothing was changed");
    return out;
  }
  py::object Residual() const {
    const float* r = enc_->residual();
    if (!r) return py::none();
    py::array_t<float> out(enc_->geometry().padded);  // rotated: padded floats
    std::memcpy(out.mutable_data(), r, enc_->geometry().padded * sizeof(float));
    return std::move(out);
  }
  thc::Encoder& core() { return *enc_; }

 private:
  std::unique_ptr<thc::Encoder> enc_;
  bool ef_ = false;
  thc::Config cfg_;
};

class PyAggregator {
 public:
  PyAggregator(const thc::Config& cfg, size_t d, uint32_t num_workers) {
    CheckConfig(cfg);
    CheckSize(d);
    if (num_workers == 0) Fail("num_workers must be >= 1, got 0");
    if (thc::LaneBits(cfg, num_workers) == 0) {
      std::ostringstream m;
      m << "num_workers * granularity = " << (uint64_t)num_workers * cfg.granularity
        << " overflows a 32-bit sum lane (num_workers=" << num_workers
        << ", granularity=" << cfg.granularity << ")";
      Fail(m.str());
    }
    agg_ = std::make_unique<thc::Aggregator>(cfg, d, num_workers);
  }
  void Add(const py::handle& payload) {
    auto a = Vector<uint8_t>(payload, "payload");
    std::string err;
    thc::Status st;
    {
      py::gil_scoped_release nogil;
      st = agg_->Add(a.data(), (size_t)a.size(), &err);
    }
    if (st != thc::Status::kOk) Fail(err);
  }
  py::array Result() const {
    const size_t n = agg_->geometry().padded;
    py::array out;
    switch (agg_->lane_bits()) {
      case 8: out = py::array_t<uint8_t>(n); break;
      case 16: out = py::array_t<uint16_t>(n); break;
      default: out = py::array_t<uint32_t>(n); break;
    }
    std::memcpy(out.mutable_data(), agg_->sums(), agg_->sums_bytes());
    return out;
  }
  thc::Aggregator& core() { return *agg_; }

 private:
  std::unique_ptr<thc::Aggregator> agg_;
};

// Integer sums given to decode or publish: a 1-D contiguous uint8, uint16 or uint32 array;
// *lane its lane width in bits.
py::array SumsArray(const py::handle& sums, int* lane) {
  if (!py::isinstance<py::array>(sums)) Fail("sums must be a NumPy array");
  py::array a = py::reinterpret_borrow<py::array>(sums);
  if (a.dtype().is(py::dtype::of<uint8_t>())) *lane = 8;
  else if (a.dtype().is(py::dtype::of<uint16_t>())) *lane = 16;
  else if (a.dtype().is(py::dtype::of<uint32_t>())) *lane = 32;
  else Fail("sums must have dtype uint8, uint16 or uint32, got " + std::string(py::str(a.dtype())));
  if (a.ndim() != 1 || !(a.flags() & py::array::c_style)) Fail("sums must be 1-D and contiguous");
  return a;
}

py::array_t<float> DecodePy(const thc::Config& cfg, size_t d, const py::handle& sums,
                            uint32_t num_workers, const py::handle& max_norm,
                            const py::handle& out_obj, int threads) {
  CheckConfig(cfg);
  CheckThreads(threads);
  CheckSize(d);
  if (num_workers == 0) Fail("num_workers must be >= 1, got 0");
  const thc::Geometry geo = thc::MakeGeometry(cfg, d);
  const MaxNorms m = CheckMaxNorms(cfg, max_norm, thc::NumBlocks(geo));
  int lane = 0;
  py::array a = SumsArray(sums, &lane);
  const int need = thc::LaneBits(cfg, num_workers);
  if (need == 0) Fail("num_workers * granularity overflows a 32-bit sum lane");
  if (lane != need) {
    std::ostringstream m;
    m << "sums have " << lane << "-bit lanes, but num_workers=" << num_workers
      << " and granularity=" << cfg.granularity << " need " << need << "-bit lanes";
    Fail(m.str());
  }
  if ((size_t)a.size() != geo.padded) {
    std::ostringstream m;
    m << "sums have " << a.size() << " elements, expected the padded size " << geo.padded;
    Fail(m.str());
  }
  py::array_t<float> out = OutArray<float>(out_obj, d);
  thc::Status st;
  {
    py::gil_scoped_release nogil;
    st = cfg.block_scale ? thc::DecodeBlocks(cfg, d, a.data(), lane, num_workers, m.data(),
                                             m.count(), out.mutable_data(), threads)
                         : thc::Decode(cfg, d, a.data(), lane, num_workers, m.scalar,
                                       out.mutable_data(), threads);
  }
  if (st != thc::Status::kOk) FailStatus("decode", st);
  return out;
}

int SumBitsChecked(const thc::Config& cfg, uint32_t num_workers) {
  CheckConfig(cfg);
  if (num_workers == 0) Fail("num_workers must be >= 1, got 0");
  const int w = thc::SumBits(cfg, num_workers);
  if (w == 0) Fail("num_workers * granularity overflows a 32-bit sum");
  return w;
}

// The server's reply: the aggregator's lanes packed in SumBits(cfg, n) bits each.
py::array_t<uint8_t> PublishPy(const thc::Config& cfg, uint32_t num_workers,
                               const py::handle& sums) {
  const int w = SumBitsChecked(cfg, num_workers);
  int lane = 0;
  py::array a = SumsArray(sums, &lane);
  if (lane < w) {
    std::ostringstream m;
    m << "sums have " << lane << "-bit lanes, narrower than the " << w << " bits they need";
    Fail(m.str());
  }
  const size_t n = (size_t)a.size();
  py::array_t<uint8_t> out(thc::PackedSumsBytes(n, w));
  {
    py::gil_scoped_release nogil;
    thc::PackSums(a.data(), lane, n, w, out.mutable_data());
  }
  return out;
}

py::array_t<float> DecodePublishedPy(const thc::Config& cfg, size_t d, const py::handle& packed,
                                     uint32_t num_workers, const py::handle& max_norm, bool total,
                                     int threads, const py::handle& out_obj) {
  CheckSize(d);
  CheckThreads(threads);
  const int w = SumBitsChecked(cfg, num_workers);
  auto a = Vector<uint8_t>(packed, "packed");
  const thc::Geometry geo = thc::MakeGeometry(cfg, d);
  const MaxNorms m = CheckMaxNorms(cfg, max_norm, thc::NumBlocks(geo));
  const size_t want = thc::PackedSumsBytes(geo.padded, w);
  if ((size_t)a.size() != want) {
    std::ostringstream m;
    m << "packed sums of " << a.size() << " bytes, expected " << want << " (" << geo.padded
      << " sums of " << w << " bits)";
    Fail(m.str());
  }
  py::array_t<float> out = OutArray<float>(out_obj, d);
  thc::Status st;
  {
    py::gil_scoped_release nogil;
    st = cfg.block_scale
             ? thc::DecodePackedBlocks(cfg, d, a.data(), (size_t)a.size(), w, num_workers, m.data(),
                                       m.count(), out.mutable_data(), total, threads)
             : thc::DecodePacked(cfg, d, a.data(), (size_t)a.size(), w, num_workers, m.scalar,
                                 out.mutable_data(), total, threads);
  }
  if (st != thc::Status::kOk) FailStatus("decode", st);
  return out;
}

py::array_t<float> FwhtPy(const py::handle& x, size_t block) {
  auto a = Vector<float>(x, "x");
  const size_t n = (size_t)a.size();
  if (block == 0) block = n;
  if (block == 0 || (block & (block - 1)) != 0) {
    std::ostringstream m;
    m << "block must be a power of two, got " << block;
    Fail(m.str());
  }
  if (n % block != 0) {
    std::ostringstream m;
    m << "length " << n << " is not a multiple of block " << block;
    Fail(m.str());
  }
  py::array_t<float> out(n);
  std::memcpy(out.mutable_data(), a.data(), n * sizeof(float));
  {
    py::gil_scoped_release nogil;
    thc::Fwht(out.mutable_data(), n, block);
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "byteps-thc codec core (docs/ALGORITHM.md); use byteps_thc.ThcCodec / ThcAggregator";

  py::class_<thc::Config>(m, "Config")
      .def(py::init<>())
      .def_readwrite("bits", &thc::Config::bits)
      .def_readwrite("granularity", &thc::Config::granularity)
      .def_readwrite("clip", &thc::Config::clip)
      .def_readwrite("seed", &thc::Config::seed)
      .def_readwrite("rotation_block", &thc::Config::rotation_block)
      .def_readwrite("table", &thc::Config::table)
      .def_readwrite("block_scale", &thc::Config::block_scale);

  // The core's limits (inclusive) and status texts: Python restates none of them.
  m.attr("MAX_SIZE") = thc::kMaxSize;
  m.attr("MAX_RANK") = thc::kMaxRank;
  m.attr("MAX_STEP") = thc::kMaxStep;
  m.attr("MAX_GRANULARITY") = thc::kMaxGranularity;
  m.attr("MAX_ROTATION_BLOCK") = thc::kMaxRotationBlock;
  m.attr("MAX_WORKERS") = thc::kMaxWorkers;
  m.attr("MAX_THREADS") = thc::kMaxThreads;
  m.def(
      "status_text", [](int code) { return thc::StatusText(static_cast<thc::Status>(code)); },
      py::arg("code"), "The core's sentence for a thc::Status code (\"\" for 0, ok).");
  m.def("core_config", &CoreConfig, py::arg("cfg"),
        "The codec core's Config of a ThcConfig, validated (ValueError otherwise).");

  m.def("validate", &thc::Validate, py::arg("cfg"),
        "Empty string when valid, else a message naming the bad field and value.");
  m.def(
      "geometry",
      [](const thc::Config& cfg, size_t d) { return GeometryDict(thc::MakeGeometry(cfg, d)); },
      py::arg("cfg"), py::arg("d"));
  m.def("lane_bits", &thc::LaneBits, py::arg("cfg"), py::arg("num_workers"));
  m.def("splitmix64", &thc::SplitMix64, py::arg("x"));
  m.def("hash32", &thc::Hash32, py::arg("x"));
  m.def("sign_key", &thc::SignKey, py::arg("seed"));
  m.def("round_key", &thc::RoundKey, py::arg("seed"), py::arg("rank"), py::arg("step"));
  m.def("fwht", &FwhtPy, py::arg("x"), py::arg("block") = 0,
        "Unnormalised Walsh-Hadamard transform of each block (0 = whole array); returns a copy.");

  m.def(
      "_time_fwht",
      [](py::array_t<float> x, size_t block, int reps) {
        // Benchmark helper: median seconds of an in-place transform of x (x is overwritten).
        float* p = x.mutable_data();
        const size_t n = (size_t)x.size();
        if (block == 0 || (block & (block - 1)) != 0 || n % block != 0) Fail("bad block");
        std::vector<double> ts;
        py::gil_scoped_release nogil;
        for (int r = 0; r < reps; ++r) {
          const auto t0 = std::chrono::steady_clock::now();
          thc::Fwht(p, n, block);
          ts.push_back(
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        std::sort(ts.begin(), ts.end());
        return ts.empty() ? 0.0 : ts[ts.size() / 2];
      },
      py::arg("x"), py::arg("block"), py::arg("reps"));

  py::class_<PyEncoder>(m, "Encoder")
      .def(py::init<const thc::Config&, size_t, uint32_t, bool>(), py::arg("cfg"), py::arg("d"),
           py::arg("rank"), py::arg("error_feedback"))
      .def("norm", &PyEncoder::Norm, py::arg("x"))
      .def("block_norms", &PyEncoder::BlockNorms, py::arg("x"))
      .def("encode", &PyEncoder::Encode, py::arg("x"), py::arg("max_norm"),
           py::arg("out") = py::none())
      .def_property(
          "step", [](PyEncoder& e) { return e.core().step(); },
          [](PyEncoder& e, uint64_t s) {
            if (s > thc::kMaxStep) {
              std::ostringstream m;
              m << "step must be at most " << thc::kMaxStep << ", got " << s;
              Fail(m.str());
            }
            e.core().set_step(s);
          })
      .def_property(
          "threads", [](PyEncoder& e) { return e.core().threads(); },
          [](PyEncoder& e, int t) { e.core().set_threads(CheckThreads(t)); })
      .def_property_readonly("residual", &PyEncoder::Residual)
      .def_property_readonly("blocks",
                             [](PyEncoder& e) { return thc::NumBlocks(e.core().geometry()); })
      .def("reset_residual", [](PyEncoder& e) { e.core().ResetResidual(); })
      .def_property_readonly("geometry",
                             [](PyEncoder& e) { return GeometryDict(e.core().geometry()); });

  py::class_<PyAggregator>(m, "Aggregator")
      .def(py::init<const thc::Config&, size_t, uint32_t>(), py::arg("cfg"), py::arg("d"),
           py::arg("num_workers"))
      .def("add", &PyAggregator::Add, py::arg("payload"))
      .def("result", &PyAggregator::Result)
      .def_property_readonly("count", [](PyAggregator& a) { return a.core().count(); })
      .def_property_readonly("lane_bits", [](PyAggregator& a) { return a.core().lane_bits(); })
      .def("reset", [](PyAggregator& a) { a.core().Reset(); })
      .def_property_readonly("geometry",
                             [](PyAggregator& a) { return GeometryDict(a.core().geometry()); });

  m.def("decode", &DecodePy, py::arg("cfg"), py::arg("d"), py::arg("sums"), py::arg("num_workers"),
        py::arg("max_norm"), py::arg("out") = py::none(), py::arg("threads") = 1);
  m.def("sum_bits", &SumBitsChecked, py::arg("cfg"), py::arg("num_workers"));
  m.def("publish", &PublishPy, py::arg("cfg"), py::arg("num_workers"), py::arg("sums"));
  m.def("decode_published", &DecodePublishedPy, py::arg("cfg"), py::arg("d"), py::arg("packed"),
        py::arg("num_workers"), py::arg("max_norm"), py::arg("total") = false,
        py::arg("threads") = 1, py::arg("out") = py::none());
  m.def("active_isa", &thc::ActiveIsa);
  m.def(
      "force_isa",
      [](const std::string& name) {
        thc_python::CheckIsaName(name);
        const bool ok = thc::ForceIsa(name);
        if (ok) lhc::ForceIsa(name);  // one cap for both cores (one rule: common/isa.h)
        return ok;
      },
      py::arg("name"), "Caps the instruction set (THC's and LHC's); False if this CPU lacks it.");
  thc_python::RegisterLhc(m);

#ifdef THC_WITH_CUDA
  thc_python::RegisterCuda(m);
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif
}
