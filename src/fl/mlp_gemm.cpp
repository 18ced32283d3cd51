// Which build of the MLP products this process runs (mlp_gemm.h).
#include "fl/mlp_gemm.h"

#include <cstdlib>

namespace xsilo::fl::gemm {

namespace generic {
extern const Kernels kKernels;
}
#if XSILO_GEMM_X86
namespace avx2 {
extern const Kernels kKernels;
}
namespace avx512 {
extern const Kernels kKernels;
}
#endif

std::string_view IsaName(Isa isa) {
  switch (isa) {
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kGeneric:
      break;
  }
  return "generic";
}

bool IsaSupported(Isa isa) {
  switch (isa) {
    case Isa::kGeneric:
      return true;
#if XSILO_GEMM_X86
    // __builtin_cpu_supports also checks that the OS saves the wider
    // registers (XGETBV), not only that the CPU has them.
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
             IsaSupported(Isa::kAvx2);
#else
    default:
      return false;
#endif
  }
  return false;
}

Result<Isa> ChooseIsa() {
  const char* env = std::getenv("XSILO_MLP_ISA");
  if (env == nullptr || *env == 0) {
    for (Isa isa : {Isa::kAvx512, Isa::kAvx2}) {
      if (IsaSupported(isa)) return isa;
    }
    return Isa::kGeneric;
  }
  for (Isa isa : {Isa::kGeneric, Isa::kAvx2, Isa::kAvx512}) {
    if (IsaName(isa) != env) continue;
    if (!IsaSupported(isa)) {
      return InvalidArgument("XSILO_MLP_ISA=" + std::string(env) +
                             ": this build or this CPU cannot run it");
    }
    return isa;
  }
  return InvalidArgument("XSILO_MLP_ISA=" + std::string(env) +
                         ": unknown instruction set (generic, avx2 or avx512)");
}

const Kernels& KernelsFor(Isa isa) {
#if XSILO_GEMM_X86
  if (isa == Isa::kAvx512) return avx512::kKernels;
  if (isa == Isa::kAvx2) return avx2::kKernels;
#endif
  (void)isa;
  return generic::kKernels;
}

}  // namespace xsilo::fl::gemm
