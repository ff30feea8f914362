// The int8-activation kernel compiled for AVX-VNNI: the VEX-encoded 256-bit vpdpbusd, for CPUs
// without AVX-512 (this file's flags are set in CMakeLists.txt).
#include "kernels/cpu/qmm_args.h"

#if defined(__x86_64__)
#define LMX_QMM_NS i8_avxvnni
#include "kernels/cpu/qmm_i8_kernel.h"

namespace lmx::kernels::cpu {
QmmI8Kernel kernels_i8_avxvnni() {
  return {
      &i8_avxvnni::qmm_i8_rows, &i8_avxvnni::quantize_x, i8_avxvnni::kChunk, nullptr, 8, "avxvnni"};
}
}  // namespace lmx::kernels::cpu
#else
namespace lmx::kernels::cpu {
QmmI8Kernel kernels_i8_avxvnni() { return {}; }
}  // namespace lmx::kernels::cpu
#endif
