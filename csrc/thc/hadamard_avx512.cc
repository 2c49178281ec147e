// byteps-thc codec core: the hadamard kernels, avx512 build (16 floats a vector). See hadamard_impl.h.
#define THC_ISA avx512
#define THC_W 16
#include "hadamard_impl.h"
