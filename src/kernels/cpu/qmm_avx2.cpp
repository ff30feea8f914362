// The quantized-matmul kernel compiled for AVX2 (this file's flags are set in CMakeLists.txt).
#include "kernels/cpu/qmm_args.h"

#if defined(__x86_64__)
#define LMX_QMM_NS avx2
#include "kernels/cpu/qmm_kernel.h"

namespace lmx::kernels::cpu {
QmmRowsFn qmm_rows_avx2() { return &avx2::qmm_rows; }
}  // namespace lmx::kernels::cpu
#else
namespace lmx::kernels::cpu {
QmmRowsFn qmm_rows_avx2() { return nullptr; }
}  // namespace lmx::kernels::cpu
#endif
