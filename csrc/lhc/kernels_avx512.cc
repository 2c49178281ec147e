// byteps-thc LHC core: the kernels, AVX-512 build (16 lanes a vector). See kernels_impl.h.
#define LHC_ISA avx512
#define LHC_W 16
#include "kernels_impl.h"
