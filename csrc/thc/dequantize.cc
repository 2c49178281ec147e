// byteps-thc codec core: the dequantize kernels, portable build (4 floats a vector). See dequantize_impl.h.
#define THC_ISA portable
#define THC_W 4
#include "dequantize_impl.h"
