// byteps-thc codec core: the dequantize kernels, avx2 build (8 floats a vector). See dequantize_impl.h.
#define THC_ISA avx2
#define THC_W 8
#include "dequantize_impl.h"
