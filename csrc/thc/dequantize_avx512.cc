// byteps-thc codec core: the dequantize kernels, avx512 build (16 floats a vector). See dequantize_impl.h.
#define THC_ISA avx512
#define THC_W 16
#include "dequantize_impl.h"
