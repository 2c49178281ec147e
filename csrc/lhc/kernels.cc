// byteps-thc LHC core: the kernels, portable build (4 lanes a vector). See kernels_impl.h.
#define LHC_ISA portable
#define LHC_W 4
#include "kernels_impl.h"
