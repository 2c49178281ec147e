// byteps-thc codec core: the aggregate kernels, avx512 build (16 floats a vector). See aggregate_impl.h.
#define THC_ISA avx512
#define THC_W 16
#include "aggregate_impl.h"
