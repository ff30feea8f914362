// The int8-activation kernel compiled for AVX512-VNNI: 512-bit vpdpbusd (this file's flags are set
// in CMakeLists.txt).
#include "kernels/cpu/qmm_args.h"

#if defined(__x86_64__)
#define LMX_QMM_NS i8_avx512vnni
#include "kernels/cpu/qmm_i8_kernel.h"

namespace lmx::kernels::cpu {
QmmI8Kernel kernels_i8_avx512vnni() {
  return {&i8_avx512vnni::qmm_i8_rows,
          &i8_avx512vnni::quantize_x,
          i8_avx512vnni::kChunk,
          &i8_avx512vnni::qmm_i8_packed_rows,
          8,
          "avx512vnni"};
}
}  // namespace lmx::kernels::cpu
#else
namespace lmx::kernels::cpu {
QmmI8Kernel kernels_i8_avx512vnni() { return {}; }
}  // namespace lmx::kernels::cpu
#endif
