// The MLP trainer's matrix products (mlp_gemm.h): the table each
// instruction set's build fills. No includes but <cstdint>: the files built
// with wider instruction sets include this and Eigen only, so that nothing
// inline from elsewhere is compiled into them (mlp_gemm.h).
#pragma once

#include <cstdint>

namespace xsilo::fl::gemm {

// Row-major W is out x in; A, D, Z and Y are column-major with n columns
// (one per sample). Results are overwritten, never accumulated.
struct Kernels {
  // Z (out x n) = W A, A in x n.
  void (*w_times_a)(const float* w, int64_t out, int64_t in, const float* a, int64_t n, float* z);
  // G (out x in, row-major) = D A^T, D out x n, A in x n.
  void (*d_times_at)(const float* d, int64_t out, const float* a, int64_t in, int64_t n, float* g);
  // Y (in x n) = W^T D, D out x n.
  void (*wt_times_d)(const float* w, int64_t out, int64_t in, const float* d, int64_t n, float* y);
};

}  // namespace xsilo::fl::gemm
