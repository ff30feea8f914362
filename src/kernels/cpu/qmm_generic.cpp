// The quantized-matmul kernel for the build's baseline ISA (no extra flags).
#define LMX_QMM_NS generic
#include "kernels/cpu/qmm_kernel.h"

namespace lmx::kernels::cpu {
QmmRowsFn qmm_rows_generic() { return &generic::qmm_rows; }
}  // namespace lmx::kernels::cpu
