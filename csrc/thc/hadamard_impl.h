// byteps-thc codec core: the Walsh-Hadamard kernel family (included by hadamard*.cc): the
// transform alone. Its building blocks are in transform.h.
#pragma once

#include "transform.h"

namespace thc {
namespace detail {
namespace THC_ISA {

void Fwht(float* x, size_t n, size_t block) {
  for (size_t i = 0; i < n; i += block) BlockFwht(x + i, block);
}

}  // namespace THC_ISA
}  // namespace detail
}  // namespace thc
