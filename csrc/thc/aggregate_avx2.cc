// byteps-thc codec core: the aggregate kernels, avx2 build (8 floats a vector). See aggregate_impl.h.
#define THC_ISA avx2
#define THC_W 8
#include "aggregate_impl.h"
