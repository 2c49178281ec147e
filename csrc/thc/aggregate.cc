// byteps-thc codec core: the aggregate kernels, portable build (4 floats a vector). See aggregate_impl.h.
#define THC_ISA portable
#define THC_W 4
#include "aggregate_impl.h"
