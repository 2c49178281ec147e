// byteps-thc codec core: the quantize kernels, portable build (4 floats a vector). See quantize_impl.h.
#define THC_ISA portable
#define THC_W 4
#include "quantize_impl.h"
