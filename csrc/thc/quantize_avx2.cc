// byteps-thc codec core: the quantize kernels, avx2 build (8 floats a vector). See quantize_impl.h.
#define THC_ISA avx2
// FMA (every AVX2 CPU has it; dispatch.cc checks): the transform's exact fma(x, +-1, s).
#pragma GCC target("fma")
#define THC_FMA 1
#define THC_W 8
#include "quantize_impl.h"
