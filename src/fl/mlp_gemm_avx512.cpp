// The MLP products built for avx512 (mlp_gemm.h; flags in CMakeLists.txt).
#define XSILO_GEMM_ISA avx512
#include "fl/mlp_gemm_impl.inc"
