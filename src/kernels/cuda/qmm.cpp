#include "kernels/cuda/qmm.h"

#include <cstdlib>

#include <mlx/fast.h>

#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/qmv_source.h"

namespace lmx::kernels::cuda {

namespace {

// One line that calls qmv.cuh's lmx_qmv; bench/gpu/qmv_bench.py uses the same line. MLX passes
// the shapes of x (..., K) and w (N, K * bits / 32) because the body names them, so x needs no
// reshape (each reshape is one more graph node for the host to run per call).
constexpr const char* kBody =
    "lmx_qmv<T, BITS, GS, TT>(x, w, scales, biases, out, lmx_qmv_rows(x_shape, x_ndim), "
    "w_shape[0], x_shape[x_ndim - 1]);";
constexpr int kThreads = 256;  // 32 * qmv.cuh's LMX_QMV_WARPS
constexpr int kFeatures = 16;  // output features per block

const mx::fast::CustomKernelFunction& kernel() {
  static const mx::fast::CustomKernelFunction k = mx::fast::cuda_kernel(
      "lmx_qmv", {"x", "w", "scales", "biases"}, {"out"}, kBody, detail::kQmvSource,
      /*ensure_row_contiguous=*/true);
  return k;
}

int rows_of(const mx::array& x) {
  return x.ndim() == 0 ? 0 : static_cast<int>(x.size() / x.shape(-1));
}

}  // namespace

bool available() {
  static const bool on = std::string(LMX_BACKEND) == "cuda" && mx::cu::is_available();
  return on && mx::default_device() == mx::Device::gpu;
}

bool enabled() {
  static const bool on = [] {
    const char* v = std::getenv("LMX_CUDA_KERNELS");
    const std::string s = v ? v : "0";
    check(s == "0" || s == "1", "LMX_CUDA_KERNELS", "expected 0 or 1, got '", s, "'");
    return s == "1";
  }();
  return on;
}

bool supports(int bits, int group_size, const std::string& mode, mx::Dtype scale_dtype, int N,
              int K) {
  return (bits == 4 || bits == 8) && (group_size == 32 || group_size == 64 || group_size == 128) &&
         (scale_dtype == mx::bfloat16 || scale_dtype == mx::float16) && mode == "affine" && N > 0 &&
         N % kFeatures == 0 && K > 0 && K % 128 == 0;
}

bool takes_kernel(const mx::array& x, const mx::array& w, const mx::array& scales,
                  const QmmOptions& opt) {
  if (x.ndim() < 1 || w.ndim() != 2) return false;
  const int M = rows_of(x);
  return available() && M >= 1 && M <= kMaxRows && x.dtype() == scales.dtype() &&
         supports(opt.bits, opt.group_size, "affine", scales.dtype(), w.shape(0), x.shape(-1));
}

mx::array qmv(const mx::array& x, const mx::array& w, const mx::array& scales,
              const mx::array& biases, const QmmOptions& opt, std::optional<float> prefill) {
  const char* where = "cuda quantized_matmul";
  check(x.ndim() >= 1 && w.ndim() == 2 && w.dtype() == mx::uint32, where,
        "expected x (..., K) and a 2-D uint32 weight, got x of ", x.ndim(), " dims, weight of ",
        w.ndim(), " dims");
  const int K = x.shape(-1), N = w.shape(0), M = rows_of(x);
  check(supports(opt.bits, opt.group_size, "affine", scales.dtype(), N, K), where,
        "unsupported layout, expected bits 4/8, group size 32/64/128, bfloat16/float16 scales, ",
        "N % 16 == 0 and K % 128 == 0, got bits=", opt.bits, " group_size=", opt.group_size,
        " scales ", scales.dtype(), " N=", N, " K=", K);
  check(x.dtype() == scales.dtype(), where, "x must have the scales' dtype ", scales.dtype(),
        ", got ", x.dtype());
  check(M >= 1 && M <= kMaxRows, where, "expected 1 to ", kMaxRows, " rows, got ", M);
  check(w.shape(1) * 32 == K * opt.bits, where, "x has K=", K, ", expected ",
        w.shape(1) * 32 / opt.bits, " for the packed weight of ", w.shape(1), " words");
  const mx::Shape gshape{N, K / opt.group_size};
  check(scales.shape() == gshape && biases.shape() == gshape && biases.dtype() == scales.dtype(),
        where, "scales and biases must both be (", N, ", ", K / opt.group_size, ") of one dtype");
  check(available(), where, "needs a CUDA build running on the GPU");
  mx::Shape out_shape = x.shape();
  out_shape.back() = N;
  std::vector<mx::array> outs = kernel()(
      {x, w, scales, biases}, {out_shape}, {x.dtype()}, {N / kFeatures * kThreads, 1, 1},
      {kThreads, 1, 1},
      {{"T", x.dtype()}, {"BITS", opt.bits}, {"GS", opt.group_size}, {"TT", M > 8 ? 2 : 1}},
      prefill, false, {});
  return outs[0];
}

mx::array quantized_matmul(const mx::array& x, const mx::array& w, const mx::array& scales,
                           const mx::array& biases, const QmmOptions& opt) {
  if (takes_kernel(x, w, scales, opt)) return qmv(x, w, scales, biases, opt);
  return mx::quantized_matmul(x, w, scales, biases, true, opt.group_size, opt.bits, "affine");
}

const char* kernel_source() { return detail::kQmvSource; }
const char* kernel_body() { return kBody; }

}  // namespace lmx::kernels::cuda
