// The MLP products built for generic (mlp_gemm.h; flags in CMakeLists.txt).
#define XSILO_GEMM_ISA generic
#include "fl/mlp_gemm_impl.inc"
