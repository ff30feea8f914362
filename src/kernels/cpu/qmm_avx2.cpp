// The CPU kernels compiled for AVX2 (this file's flags are set in CMakeLists.txt).
#include "kernels/cpu/qmm_args.h"

#if defined(__x86_64__)
#define LMX_QMM_NS avx2
#include "kernels/cpu/qmm_kernel.h"

namespace lmx::kernels::cpu {
IsaKernels kernels_avx2() {
  return {&avx2::qmm_rows, &avx2::attn_group, &avx2::max_exp_sum, &avx2::gate_act};
}
}  // namespace lmx::kernels::cpu
#else
namespace lmx::kernels::cpu {
IsaKernels kernels_avx2() { return {}; }
}  // namespace lmx::kernels::cpu
#endif
