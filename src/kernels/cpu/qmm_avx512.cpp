// The CPU kernels compiled for AVX512 (this file's flags are set in CMakeLists.txt).
#include "kernels/cpu/qmm_args.h"

#if defined(__x86_64__)
#define LMX_QMM_NS avx512
#include "kernels/cpu/qmm_kernel.h"

namespace lmx::kernels::cpu {
IsaKernels kernels_avx512() {
  return {&avx512::qmm_rows, &avx512::attn_group, &avx512::max_exp_sum, &avx512::gate_act};
}
}  // namespace lmx::kernels::cpu
#else
namespace lmx::kernels::cpu {
IsaKernels kernels_avx512() { return {}; }
}  // namespace lmx::kernels::cpu
#endif
