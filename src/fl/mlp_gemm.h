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
// every other file calls. They include nothing of ours but
// mlp_gemm_kernels.h, and are built at -O2 whatever the build type (at -O0
// the standard library's small templates Eigen calls, std::max and the
// like, would be emitted out of line, with AVX instructions, under their
// own names). tests/fl/mlp_isa_symbols_test.sh checks that.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "fl/mlp_gemm_kernels.h"
#include "xsilo/core/status.h"

namespace xsilo::fl::gemm {

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
