// byteps-thc: the CUDA bindings, registered by binding.cc (RegisterCuda) when the extension is
// built with THC_WITH_CUDA. Device memory travels as raw pointers (ints) and the stream as its
// handle, so that no framework enters C++: byteps_thc/cuda.py passes torch's data_ptr() and
// torch.cuda.current_stream().cuda_stream. Everything is enqueued on that stream; nothing here
// synchronises. Importing works without a GPU or a driver (device_count() is then 0).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "thc/cuda/thc_cuda.h"
#include "thc/thc.h"

namespace py = pybind11;

namespace {

using namespace thc::cuda;

template <typename P>
P* Ptr(uintptr_t v) {
  return reinterpret_cast<P*>(v);
}
cudaStream_t Stream(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

void Raise(const std::string& err) {
  if (err.empty()) return;
  if (err.find(" launch: ") != std::string::npos) throw std::runtime_error(err);
  throw py::value_error(err);
}

Code MakeCode(int bits, uint32_t granularity, double clip, uint64_t seed, uint64_t rotation_block,
              const std::vector<uint32_t>& table, int fused_max_log, int column_max_bits,
              int chunk_log, bool block_scale) {
  Code code;
  code.block_scale = block_scale;
  code.fused_max_log = fused_max_log;
  code.column_max_bits = column_max_bits;
  code.chunk_log = chunk_log;
  code.bits = bits;
  code.granularity = granularity;
  code.clip = clip;
  code.seed = seed;
  code.rotation_block = rotation_block;
  if (bits < 1 || bits > 8) Raise("thc.cuda: bits=" + std::to_string(bits) + " must be in 1..8");
  if (table.size() != (size_t{1} << bits))
    Raise("thc.cuda: table has " + std::to_string(table.size()) +
          " levels; bits=" + std::to_string(bits) + " needs " + std::to_string(1 << bits));
  for (size_t i = 0; i < table.size(); ++i) code.table[i] = table[i];
  Raise(ValidateCode(code));
  return code;
}

}  // namespace

namespace thc_python {

void RegisterCuda(py::module_& parent) {
  py::module_ m = parent.def_submodule(
      "cuda", "CUDA twins of the THC kernels on raw device pointers and a stream handle "
              "(byteps_thc/cuda.py is the Python face)");
  m.attr("FLOAT32") = static_cast<int>(kFloat32);
  m.attr("FLOAT16") = static_cast<int>(kFloat16);
  m.attr("BFLOAT16") = static_cast<int>(kBFloat16);
  m.attr("STATUS_NON_FINITE_INPUT") = kStatusNonFiniteInput;
  m.attr("STATUS_NON_FINITE_NORM") = kStatusNonFiniteNorm;
  m.attr("STATUS_OVERFLOW") = kStatusOverflow;
  m.def(
      "status_text",
      [](int flags) {
        // The device status word's flags in the core's words (thc::StatusText). A NaN/Inf
        // gradient makes the rotation non-finite too: then only the cause is reported.
        std::string t;
        auto add = [&t](const char* where, thc::Status st) {
          t += (t.empty() ? "" : "; ") + std::string(where) + ": " + thc::StatusText(st);
        };
        if (flags & kStatusNonFiniteInput) add("gradient", thc::Status::kNonFinite);
        if (flags & kStatusNonFiniteNorm)
          add("max_norm (or it is negative)", thc::Status::kNonFinite);
        if ((flags & kStatusOverflow) && !(flags & kStatusNonFiniteInput))
          add("rotation", thc::Status::kOverflow);
        return t.empty() && flags ? "status " + std::to_string(flags) : t;
      },
      py::arg("flags"), "what a non-zero status word means (\"\" for 0)");

  // module_local: the CPU-emulation test module binds the same C++ type in the same process.
  py::class_<Code>(m, "Code", py::module_local())
      .def(py::init(&MakeCode), py::arg("bits"), py::arg("granularity"), py::arg("clip"),
           py::arg("seed"), py::arg("rotation_block"), py::arg("table"),
           py::arg("fused_max_log") = 14, py::arg("column_max_bits") = 11,
           py::arg("chunk_log") = 22, py::arg("block_scale") = false)
      .def_readonly("bits", &Code::bits)
      .def_readonly("granularity", &Code::granularity)
      .def_readonly("clip", &Code::clip)
      .def_readonly("seed", &Code::seed)
      .def_readonly("rotation_block", &Code::rotation_block)
      .def_readonly("block_scale", &Code::block_scale);

  m.def(
      "code_from_config",
      [](const thc::Config& cfg, int fused_max_log, int column_max_bits, int chunk_log) {
        return MakeCode(cfg.bits, cfg.granularity, cfg.clip, cfg.seed, cfg.rotation_block,
                        cfg.table, fused_max_log, column_max_bits, chunk_log, cfg.block_scale);
      },
      py::arg("config"), py::arg("fused_max_log") = 14, py::arg("column_max_bits") = 11,
      py::arg("chunk_log") = 22, "the device code of a core Config (byteps_thc._C.Config)");

  m.def("device_count", &DeviceCount, "CUDA devices seen (0 without a driver or a GPU)");
  m.def("device_name", &DeviceName, py::arg("device"));
  m.def(
      "geometry",
      [](const Code& code, uint64_t d) {
        const Geometry g = MakeGeometry(code, d);
        return py::make_tuple(g.d, g.block, g.padded, g.payload_bytes);
      },
      py::arg("code"), py::arg("d"), "(d, block, padded, payload_bytes)");
  m.def(
      "num_blocks", [](const Code& code, uint64_t d) { return MakeGeometry(code, d).blocks; },
      py::arg("code"), py::arg("d"),
      "rotation blocks of d elements: the length of block_scale's norms and max norms");
  m.def("lane_bits", &LaneBits, py::arg("code"), py::arg("num_workers"));
  m.def("sum_bits", &SumBits, py::arg("code"), py::arg("num_workers"));
  m.def("workspace_floats", &WorkspaceFloats, py::arg("code"), py::arg("d"),
        "floats of device workspace encode/decode need for d elements (0: none)");

  m.def(
      "norm",
      [](const Code& code, uintptr_t grad, int dtype, uintptr_t residual, uint64_t d,
         uintptr_t norm, uintptr_t workspace, uintptr_t status, uintptr_t stream,
         uint64_t norm_count) {
        NormArgs a;
        a.norm_count = norm_count;
        a.grad = Ptr<const void>(grad);
        a.dtype = static_cast<DType>(dtype);
        a.residual = Ptr<const float>(residual);
        a.d = d;
        a.norm = Ptr<double>(norm);
        a.workspace = Ptr<float>(workspace);
        a.status = Ptr<int>(status);
        Raise(LaunchNorm(code, a, Stream(stream)));
      },
      py::arg("code"), py::arg("grad"), py::arg("dtype"), py::arg("residual"), py::arg("d"),
      py::arg("norm"), py::arg("workspace"), py::arg("status"), py::arg("stream"),
      py::arg("norm_count") = 0,
      "the local norm into *norm (binary64): ||grad||, or with the rotated state r (d_pad floats) "
      "sqrt(sum (Hu(sign*grad) + r)^2 / B); with block_scale one per rotation block into "
      "norm[0, norm_count = num_blocks); clears *status, then flags NaN/Inf and overflow");

  m.def(
      "encode",
      [](const Code& code, uintptr_t grad, int dtype, uintptr_t residual, uint64_t d, uint32_t rank,
         uint64_t step, double max_norm, uintptr_t max_norm_ptr, uintptr_t payload,
         uintptr_t workspace, uintptr_t status, uintptr_t stream, uint64_t max_norm_count) {
        EncodeArgs a;
        a.max_norm_count = max_norm_count;
        a.grad = Ptr<const void>(grad);
        a.dtype = static_cast<DType>(dtype);
        a.residual = Ptr<float>(residual);
        a.d = d;
        a.rank = rank;
        a.step = step;
        a.max_norm = max_norm;
        a.max_norm_dev = Ptr<const double>(max_norm_ptr);
        a.payload = Ptr<uint8_t>(payload);
        a.workspace = Ptr<float>(workspace);
        a.status = Ptr<const int>(status);
        a.status_out = Ptr<int>(status);
        Raise(LaunchEncode(code, a, Stream(stream)));
      },
      py::arg("code"), py::arg("grad"), py::arg("dtype"), py::arg("residual"), py::arg("d"),
      py::arg("rank"), py::arg("step"), py::arg("max_norm"), py::arg("max_norm_ptr"),
      py::arg("payload"), py::arg("workspace"), py::arg("status"), py::arg("stream"),
      py::arg("max_norm_count") = 0,
      "with block_scale max_norm_ptr holds M_k of each rotation block (max_norm_count of them)");

  m.def(
      "aggregate",
      [](const Code& code, uintptr_t payloads, uint32_t count, uint64_t stride, uint64_t d,
         uintptr_t sums, int lane_bits, bool accumulate, uintptr_t stream) {
        AggregateArgs a;
        a.payloads = Ptr<const uint8_t>(payloads);
        a.count = count;
        a.stride = stride;
        a.d = d;
        a.sums = Ptr<void>(sums);
        a.lane_bits = lane_bits;
        a.accumulate = accumulate;
        Raise(LaunchAggregate(code, a, Stream(stream)));
      },
      py::arg("code"), py::arg("payloads"), py::arg("count"), py::arg("stride"), py::arg("d"),
      py::arg("sums"), py::arg("lane_bits"), py::arg("accumulate"), py::arg("stream"));

  m.def(
      "decode",
      [](const Code& code, uintptr_t sums, int lane_bits, uint32_t num_workers, uint64_t d,
         double max_norm, uintptr_t max_norm_ptr, uintptr_t out, uintptr_t out_cast, int out_dtype,
         uintptr_t workspace, uintptr_t status, uintptr_t stream, int sum_bits,
         uint64_t max_norm_count) {
        DecodeArgs a;
        a.max_norm_count = max_norm_count;
        a.sums = Ptr<const void>(sums);
        a.lane_bits = lane_bits;
        a.sum_bits = sum_bits;
        a.num_workers = num_workers;
        a.d = d;
        a.max_norm = max_norm;
        a.max_norm_dev = Ptr<const double>(max_norm_ptr);
        a.out = Ptr<float>(out);
        a.out_cast = Ptr<void>(out_cast);
        a.out_dtype = static_cast<DType>(out_dtype);
        a.workspace = Ptr<float>(workspace);
        a.status = Ptr<const int>(status);
        a.status_out = Ptr<int>(status);
        Raise(LaunchDecode(code, a, Stream(stream)));
      },
      py::arg("code"), py::arg("sums"), py::arg("lane_bits"), py::arg("num_workers"), py::arg("d"),
      py::arg("max_norm"), py::arg("max_norm_ptr"), py::arg("out"), py::arg("out_cast"),
      py::arg("out_dtype"), py::arg("workspace"), py::arg("status"), py::arg("stream"),
      py::arg("sum_bits") = 0, py::arg("max_norm_count") = 0,
      "with block_scale max_norm_ptr holds M_k of each rotation block (max_norm_count of them)");
}

}  // namespace thc_python
