// byteps-thc codec core: the quantize kernels, avx2 build (8 floats a vector). See quantize_impl.h.
#define THC_ISA avx2
#define THC_W 8
#include "quantize_impl.h"
