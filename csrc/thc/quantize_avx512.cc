// byteps-thc codec core: the quantize kernels, avx512 build (16 floats a vector). See quantize_impl.h.
#define THC_ISA avx512
#define THC_W 16
#include "quantize_impl.h"
