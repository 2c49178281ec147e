// byteps-thc: the Python binding of the LHC core (csrc/lhc), part of module byteps_thc._C.
//
// Thin, like binding.cc: exact dtypes and sizes (conversions are byteps_thc/lhc_codec.py's
// job), the GIL released around the core, core errors turned into ValueError with the core's
// message. binding.cc's module init calls RegisterLhc.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstring>
#include <memory>
#include <string>

#include "lhc/lhc.h"
#include "python/errors.h"

namespace py = pybind11;

namespace {

using thc_python::Fail;

template <class T>
py::array_t<T> Vector(const py::handle& obj, const char* what, size_t expect) {
  if (!py::isinstance<py::array>(obj)) Fail(std::string(what) + " must be a NumPy array");
  py::array a = py::reinterpret_borrow<py::array>(obj);
  if (!a.dtype().is(py::dtype::of<T>()))
    Fail(std::string(what) + " must have dtype " + std::string(py::str(py::dtype::of<T>())) +
         ", got " + std::string(py::str(a.dtype())));
  if (a.ndim() != 1 || !(a.flags() & py::array::c_style))
    Fail(std::string(what) + " must be 1-D and contiguous");
  if (expect != (size_t)-1 && (size_t)a.size() != expect)
    Fail(std::string(what) + " has " + std::to_string(a.size()) + " elements, expected " +
         std::to_string(expect));
  return py::reinterpret_borrow<py::array_t<T>>(a);
}

lhc::Geometry Geo(size_t d, size_t m) {
  const std::string err = lhc::CheckGeometry(d, m);
  if (!err.empty()) Fail(err);
  return lhc::MakeGeometry(d, m);
}

void CheckWorkers(uint32_t n) {
  if (n < 1 || n > lhc::kMaxWorkers)
    Fail("num_workers=" + std::to_string(n) + " must be in [1, " +
         std::to_string(lhc::kMaxWorkers) + "]");
}

class PyLhcEncoder {
 public:
  PyLhcEncoder(size_t d, size_t m, uint64_t pseed, uint32_t rank, double topk, bool sampled,
               bool ef) {
    if (rank > lhc::kMaxRank) Fail("rank=" + std::to_string(rank) + " is too large");
    if (!(topk >= 0 && topk <= 1)) Fail("topk must be 0 (off) or in (0, 1]");
    enc_ = std::make_unique<lhc::Encoder>(Geo(d, m), pseed, rank, topk, sampled, ef);
  }
  double MaxAbs(const py::handle& x) {
    auto a = Vector<float>(x, "x", enc_->geometry().d);
    double m = 0;
    std::string err;
    lhc::Status st;
    {
      py::gil_scoped_release nogil;
      st = enc_->MaxAbs(a.data(), &m, &err);
    }
    if (st != lhc::Status::kOk) Fail(err);
    return m;
  }
  py::array_t<uint8_t> Encode(const py::handle& x, double max_abs, uint32_t n) {
    auto a = Vector<float>(x, "x", enc_->geometry().d);
    CheckWorkers(n);
    py::array_t<uint8_t> out(enc_->geometry().payload_bytes);
    std::string err;
    lhc::Status st;
    {
      py::gil_scoped_release nogil;
      st = enc_->Encode(a.data(), max_abs, n, out.mutable_data(), &err);
    }
    if (st != lhc::Status::kOk) Fail(err);
    return out;
  }
  py::object Residual() const {
    const float* r = enc_->residual();
    if (!r) return py::none();
    py::array_t<float> out(enc_->geometry().d);
    std::memcpy(out.mutable_data(), r, enc_->geometry().d * sizeof(float));
    return std::move(out);
  }
  lhc::Encoder& core() { return *enc_; }

 private:
  std::unique_ptr<lhc::Encoder> enc_;
};

class PyLhcAggregator {
 public:
  PyLhcAggregator(size_t d, size_t m, uint64_t pseed, uint32_t n) {
    CheckWorkers(n);
    agg_ = std::make_unique<lhc::Aggregator>(Geo(d, m), pseed, n);
  }
  void Add(const py::handle& payload) {
    auto a = Vector<uint8_t>(payload, "payload", (size_t)-1);
    std::string err;
    lhc::Status st;
    {
      py::gil_scoped_release nogil;
      st = agg_->Add(a.data(), (size_t)a.size(), &err);
    }
    if (st != lhc::Status::kOk) Fail(err);
  }
  py::array_t<uint8_t> Result() const {
    py::array_t<uint8_t> out(agg_->geometry().payload_bytes);
    agg_->Result(out.mutable_data());
    return out;
  }
  lhc::Aggregator& core() { return *agg_; }

 private:
  std::unique_ptr<lhc::Aggregator> agg_;
};

// (out float32[d], None, rounds, |U|) on success; (out, unresolved uint32, rounds, |U|) when
// peeling fails (out then holds the resolved values, 0 at the unresolved). ValueError else.
py::tuple Decode(size_t d, size_t m, uint64_t pseed, const py::handle& sums, double max_abs,
                 uint32_t n) {
  const lhc::Geometry geo = Geo(d, m);
  CheckWorkers(n);
  auto s = Vector<uint8_t>(sums, "sums", (size_t)-1);
  py::array_t<float> out(d);
  lhc::DecodeResult res;
  std::string err;
  lhc::Status st;
  {
    py::gil_scoped_release nogil;
    st = lhc::Decode(geo, pseed, s.data(), (size_t)s.size(), max_abs, n, out.mutable_data(), &res,
                     &err);
  }
  if (st == lhc::Status::kUnresolved) {
    py::array_t<uint32_t> un(res.unresolved.size());
    std::memcpy(un.mutable_data(), res.unresolved.data(), res.unresolved.size() * 4);
    return py::make_tuple(out, un, res.rounds, res.union_size);
  }
  if (st != lhc::Status::kOk) Fail(err);
  return py::make_tuple(out, py::none(), res.rounds, res.union_size);
}

}  // namespace

namespace thc_python {

void RegisterLhc(py::module_& m) {
  m.attr("LHC_MAX_SIZE") = lhc::kMaxSize;
  m.attr("LHC_MAX_WORKERS") = lhc::kMaxWorkers;
  m.attr("LHC_HEADER_BYTES") = lhc::kHeaderBytes;
  m.def("lhc_partition_seed", &lhc::PartitionSeed, py::arg("seed"), py::arg("key"));
  m.def("lhc_round_key", &lhc::RoundKey, py::arg("pseed"), py::arg("rank"), py::arg("step"));
  m.def("lhc_sample_key", &lhc::SampleKey, py::arg("pseed"), py::arg("rank"), py::arg("step"));
  m.def("lhc_fingerprint", &lhc::Fingerprint, py::arg("d"), py::arg("m"), py::arg("pseed"));
  m.def("lhc_scale_exponent", &lhc::ScaleExponent, py::arg("max_abs"), py::arg("num_workers"));
  m.def(
      "lhc_hash_keys",
      [](uint64_t pseed) {
        uint32_t k[3];
        lhc::HashKeys(pseed, k);
        return py::make_tuple(k[0], k[1], k[2]);
      },
      py::arg("pseed"));
  m.def(
      "lhc_quantize",
      [](const py::handle& v, int e, const py::handle& u) {
        auto a = Vector<float>(v, "v", (size_t)-1);
        auto b = Vector<uint64_t>(u, "u", (size_t)a.size());
        py::array_t<int64_t> out(a.size());
        for (py::ssize_t i = 0; i < a.size(); ++i)
          out.mutable_data()[i] = lhc::Quantize(a.data()[i], e, b.data()[i]);
        return out;
      },
      py::arg("v"), py::arg("e"), py::arg("u"));
  m.def(
      "lhc_buckets",
      [](uint64_t pseed, const py::handle& idx, uint32_t sub) {
        auto a = Vector<uint32_t>(idx, "idx", (size_t)-1);
        if (sub < 1 || (uint64_t)sub * 3 > lhc::kMaxBuckets) Fail("sub must be in [1, 2^32 / 3)");
        const size_t n = (size_t)a.size();
        py::array_t<uint32_t> b(3 * n);
        py::array_t<uint8_t> neg(n);
        lhc::Buckets(pseed, a.data(), n, sub, b.mutable_data(), neg.mutable_data());
        return py::make_tuple(b, neg);
      },
      py::arg("pseed"), py::arg("idx"), py::arg("sub"),
      "(b uint32[3n], neg uint8[n]): index i's buckets b[3i + j], bit j of neg[i] its sign.");

  py::class_<PyLhcEncoder>(m, "LhcEncoder")
      .def(py::init<size_t, size_t, uint64_t, uint32_t, double, bool, bool>(), py::arg("d"),
           py::arg("m"), py::arg("pseed"), py::arg("rank"), py::arg("topk"), py::arg("sampled"),
           py::arg("error_feedback"))
      .def("max_abs", &PyLhcEncoder::MaxAbs, py::arg("x"))
      .def("encode", &PyLhcEncoder::Encode, py::arg("x"), py::arg("max_abs"),
           py::arg("num_workers"))
      .def_property(
          "step", [](PyLhcEncoder& e) { return e.core().step(); },
          [](PyLhcEncoder& e, uint64_t s) {
            if (s > lhc::kMaxStep) Fail("step=" + std::to_string(s) + " is too large");
            e.core().set_step(s);
          })
      .def_property_readonly("residual", &PyLhcEncoder::Residual)
      .def(
          "values_at",
          [](PyLhcEncoder& e, const py::handle& idx) {
            auto a = Vector<uint32_t>(idx, "indices", (size_t)-1);
            py::array_t<int32_t> out(a.size());
            e.core().ValuesAt(a.data(), (size_t)a.size(), out.mutable_data());
            return out;
          },
          py::arg("indices"), "int32 q of the last encode at these indices (0 off its support).")
      .def("reset_residual", [](PyLhcEncoder& e) { e.core().ResetResidual(); });

  py::class_<PyLhcAggregator>(m, "LhcAggregator")
      .def(py::init<size_t, size_t, uint64_t, uint32_t>(), py::arg("d"), py::arg("m"),
           py::arg("pseed"), py::arg("num_workers"))
      .def("add", &PyLhcAggregator::Add, py::arg("payload"))
      .def("result", &PyLhcAggregator::Result)
      .def_property_readonly("count", [](PyLhcAggregator& a) { return a.core().count(); })
      .def("reset", [](PyLhcAggregator& a) { a.core().Reset(); });

  m.def("lhc_decode", &Decode, py::arg("d"), py::arg("m"), py::arg("pseed"), py::arg("sums"),
        py::arg("max_abs"), py::arg("num_workers"));
  m.def("lhc_active_isa", &lhc::ActiveIsa);
  m.def(
      "lhc_force_isa",
      [](const std::string& name) {
        thc_python::CheckIsaName(name);
        return lhc::ForceIsa(name);
      },
      py::arg("name"), "Caps the LHC kernels' instruction set; False if this CPU lacks it.");
}

}  // namespace thc_python
