// byteps-thc codec core: the hadamard kernels, portable build (4 floats a vector). See hadamard_impl.h.
#define THC_ISA portable
#define THC_W 4
#include "hadamard_impl.h"
