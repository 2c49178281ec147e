// byteps-thc codec core: the hadamard kernels, avx2 build (8 floats a vector). See hadamard_impl.h.
#define THC_ISA avx2
#define THC_W 8
#include "hadamard_impl.h"
