// byteps-thc LHC core: the one place that chooses the instruction set.
//
// The kernel tables of the three builds; common/isa.h chooses the best one the CPU runs on
// first use, and ForceIsa caps the choice (tests and benchmarks compare them).
#include <string>

#include "common/isa.h"
#include "lhc/internal.h"
#include "lhc/lhc.h"

namespace lhc {
namespace detail {
namespace {

#define LHC_KERNEL_TABLE(ns) \
  Kernels { #ns, ns::Prepare, ns::NonzeroBitmap, ns::OrAdd, ns::BucketsK }

codec::IsaChoice<Kernels>& Choice() {
  static codec::IsaChoice<Kernels> choice(CODEC_ISA_TABLES(LHC_KERNEL_TABLE));
  return choice;
}

}  // namespace

const Kernels& ActiveKernels() { return Choice().active(); }

}  // namespace detail

const char* ActiveIsa() { return detail::ActiveKernels().name; }

bool ForceIsa(const std::string& name) { return detail::Choice().Force(name); }

}  // namespace lhc
