// The MLP trainer's matrix products, built once per instruction set and
// chosen at run time: Eigen compiled for baseline x86-64 multiplies with
// 4-wide SSE; the same code built for AVX2+FMA or AVX-512 is 2-4 times
// faster on the FedAvg tiers' layers, and a package must still run on a
// CPU without them.
//
// Each set lives in a translation unit of its own (mlp_gemm_<isa>.cpp,
// compiled with that ISA's flags) that renames Eigen's namespace, so that
// no template instantiated there shares a symbol with the rest of the
// program: the linker could otherwise keep an AVX-512 copy of a function
// every other file calls. tests/fl/mlp_isa_symbols_test.sh checks that.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "xsilo/core/status.h"

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

enum class Isa { kGeneric, kAvx2, kAvx512 };

std::string_view IsaName(Isa isa);
// Whether this build has the set and this CPU (and its OS) can run it.
bool IsaSupported(Isa isa);
// The fastest supported set, or the one XSILO_MLP_ISA names (generic,
// avx2, avx512): InvalidArgument when it names an unknown or unsupported
// one.
Result<Isa> ChooseIsa();
const Kernels& KernelsFor(Isa isa);

}  // namespace xsilo::fl::gemm
