// byteps-thc LHC core: the kernels, AVX2 build (8 lanes a vector). See kernels_impl.h.
#define LHC_ISA avx2
#define LHC_W 8
#include "kernels_impl.h"
