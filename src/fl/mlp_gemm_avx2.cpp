// The MLP products built for avx2 (mlp_gemm.h; flags in CMakeLists.txt).
#define XSILO_GEMM_ISA avx2
#include "fl/mlp_gemm_impl.inc"
