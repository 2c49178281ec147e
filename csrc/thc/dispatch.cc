// byteps-thc codec core: the one place that chooses the instruction set.
//
// The kernel tables of the three builds; common/isa.h chooses the best one the CPU runs on
// first use, and ForceIsa caps the choice (tests and benchmarks compare them).
#include <string>

#include "common/isa.h"
#include "thc/internal.h"
#include "thc/thc.h"

namespace thc {
namespace detail {
namespace {

#define THC_KERNEL_TABLE(ns)                                                              \
  Kernels {                                                                               \
    #ns, ns::Fwht, ns::Quantize, ns::Pack, ns::SumSquares, ns::LoadSums, ns::ScaleSigned, \
        ns::EncodeChunk, ns::RotateChunk, ns::DecodeChunk, ns::AddIndices                 \
  }

codec::IsaChoice<Kernels>& Choice() {
  static codec::IsaChoice<Kernels> choice(CODEC_ISA_TABLES(THC_KERNEL_TABLE));
  return choice;
}

}  // namespace

const Kernels& ActiveKernels() { return Choice().active(); }

}  // namespace detail

void Fwht(float* x, size_t n, size_t block) { detail::ActiveKernels().fwht(x, n, block); }

const char* ActiveIsa() { return detail::ActiveKernels().name; }

bool ForceIsa(const std::string& name) { return detail::Choice().Force(name); }

}  // namespace thc
