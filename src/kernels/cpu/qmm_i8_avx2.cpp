// The int8-activation kernel for AVX2 CPUs without VNNI. One-row calls on 4-bit weights: each
// 4-input vpdpbusd is vpmaddubsw (u8 x s8 pairs summed in int16) then vpmaddwd by ones (pairs of
// int16 summed in int32), the same integers while no int16 sum overflows (4-bit weights). Calls
// of 2 or more rows, and 8-bit weights: tiles of 8 weight rows widened to int16 (tile_rows).
// This file's flags are set in CMakeLists.txt.
#include "kernels/cpu/qmm_args.h"

#if defined(__x86_64__)
#define LMX_QMM_NS i8_avx2
#define LMX_I8_MADDUBS 1
#include "kernels/cpu/qmm_i8_kernel.h"

namespace lmx::kernels::cpu {
QmmI8Kernel kernels_i8_avx2() {
  return {&i8_avx2::qmm_i8_rows,
          &i8_avx2::quantize_x,
          i8_avx2::kChunk,
          nullptr,
          8,
          "avx2",
          &i8_avx2::qmm_i8_tile_rows,
          2};
}
}  // namespace lmx::kernels::cpu
#else
namespace lmx::kernels::cpu {
QmmI8Kernel kernels_i8_avx2() { return {}; }
}  // namespace lmx::kernels::cpu
#endif
