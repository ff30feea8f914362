// The CPU kernels for the build's baseline ISA (no extra flags).
#define LMX_QMM_NS generic
#include "kernels/cpu/qmm_kernel.h"

namespace lmx::kernels::cpu {
IsaKernels kernels_generic() {
  return {&generic::qmm_rows, &generic::attn_group, &generic::max_exp_sum, &generic::gate_act};
}
}  // namespace lmx::kernels::cpu
