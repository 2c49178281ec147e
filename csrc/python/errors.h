// byteps-thc: what the Python bindings of byteps_thc._C (binding*.cc) share: a bad argument
// becomes a ValueError with a message that names it.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

namespace thc_python {

[[noreturn]] inline void Fail(const std::string& msg) { throw pybind11::value_error(msg); }

// The names force_isa and lhc_force_isa take (common/isa.h's).
inline void CheckIsaName(const std::string& name) {
  if (name != "portable" && name != "avx2" && name != "avx512")
    Fail("unknown ISA '" + name + "'; expected portable, avx2 or avx512");
}

}  // namespace thc_python
