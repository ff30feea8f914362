#include "nn/gated_delta.h"

#include <cmath>

namespace lmx::nn {

namespace {

mx::array silu_ops(const mx::array& x) { return mx::multiply(x, mx::sigmoid(x)); }

// _gated_delta_step_ops for a scalar gate: q, k (B, H, Dk), v (B, H, Dv), g and beta (B, H),
// state (B, H, Dv, Dk)[, mask (B,)].
std::vector<mx::array> step_ops(const std::vector<mx::array>& in) {
  const mx::array &q = in[0], &k = in[1], &v = in[2], &g = in[3], &beta = in[4];
  const mx::array& old_state = in[5];
  mx::array decay = mx::expand_dims(g, {-2, -1});
  mx::array state = mx::multiply(old_state, decay);
  mx::array k_row = mx::expand_dims(k, -2);
  mx::array kv_mem = mx::sum(mx::multiply(state, k_row), -1);
  mx::array delta = mx::multiply(mx::subtract(v, kv_mem), mx::expand_dims(beta, -1));
  state = mx::add(state, mx::multiply(k_row, mx::expand_dims(delta, -1)));
  mx::array y = mx::sum(mx::multiply(state, mx::expand_dims(q, -2)), -1);
  if (in.size() > 6) state = mx::where(mx::expand_dims(in[6], {1, 2, 3}), state, old_state);
  return {mx::astype(y, q.dtype()), state};
}

}  // namespace

mx::array silu(const mx::array& x) {
  static auto fn = mx::compile(
      [](const std::vector<mx::array>& in) { return std::vector<mx::array>{silu_ops(in[0])}; },
      /*shapeless=*/true);
  return fn({x})[0];
}

mx::array precise_swiglu(const mx::array& h, const mx::array& gate, const mx::array& x) {
  static auto fn = mx::compile(
      [](const std::vector<mx::array>& in) {
        mx::array g = silu_ops(mx::astype(in[1], mx::float32));
        mx::array x32 = mx::astype(in[2], mx::float32);
        return std::vector<mx::array>{mx::astype(mx::multiply(g, x32), in[0].dtype())};
      },
      /*shapeless=*/true);
  return fn({h, gate, x})[0];
}

mx::array compute_g(const mx::array& A_log, const mx::array& a, const mx::array& dt_bias) {
  static auto fn = mx::compile(
      [](const std::vector<mx::array>& in) {
        mx::array x = mx::add(in[1], in[2]);
        // nn.softplus: logaddexp(x, 0), the 0 a scalar of x's dtype.
        mx::array softplus = mx::logaddexp(x, mx::array(0, x.dtype()));
        mx::array decay = mx::negative(mx::exp(mx::astype(in[0], mx::float32)));
        return std::vector<mx::array>{mx::exp(mx::multiply(decay, softplus))};
      },
      /*shapeless=*/true);
  return fn({A_log, a, dt_bias})[0];
}

std::pair<mx::array, mx::array> normalize_qk(const mx::array& q, const mx::array& k,
                                             double inv_scale, double eps) {
  const double sq = std::pow(inv_scale, 2.0);
  const float rms_eps = static_cast<float>(eps * sq);
  mx::array qn = mx::multiply(mx::array(static_cast<float>(sq), q.dtype()),
                              mx::fast::rms_norm(q, std::nullopt, rms_eps));
  mx::array kn = mx::multiply(mx::array(static_cast<float>(inv_scale), k.dtype()),
                              mx::fast::rms_norm(k, std::nullopt, rms_eps));
  return {qn, kn};
}

std::pair<mx::array, mx::array> gated_delta_ops(mx::array q, mx::array k, const mx::array& v,
                                                const mx::array& g, const mx::array& beta,
                                                mx::array state,
                                                const std::optional<mx::array>& mask) {
  static auto step = mx::compile(step_ops);
  const int T = q.shape(1), Hk = q.shape(2);
  const int Hv = v.shape(-2);
  if (const int repeat = Hv / Hk; repeat > 1) {
    q = mx::repeat(q, repeat, -2);
    k = mx::repeat(k, repeat, -2);
  }
  // x[:, t]
  auto at = [&](const mx::array& x, int t) {
    mx::Shape lo(x.ndim(), 0), hi = x.shape();
    lo[1] = t;
    hi[1] = t + 1;
    return mx::squeeze(mx::slice(x, lo, hi), 1);
  };
  std::vector<mx::array> ys;
  ys.reserve(T);
  for (int t = 0; t < T; ++t) {
    std::vector<mx::array> in{at(q, t), at(k, t), at(v, t), at(g, t), at(beta, t), state};
    if (mask) in.push_back(at(*mask, t));
    auto out = step(in);
    ys.push_back(out[0]);
    state = out[1];
  }
  return {mx::stack(ys, 1), state};
}

std::pair<mx::array, mx::array> gated_delta_update(const mx::array& q, const mx::array& k,
                                                   const mx::array& v, const mx::array& a,
                                                   const mx::array& b, const mx::array& A_log,
                                                   const mx::array& dt_bias,
                                                   std::optional<mx::array> state,
                                                   const std::optional<mx::array>& mask) {
  mx::array beta = mx::sigmoid(b);
  mx::array g = compute_g(A_log, a, dt_bias);
  if (!state) {
    const int B = q.shape(0), Dk = q.shape(3), Hv = v.shape(-2), Dv = v.shape(-1);
    state = mx::zeros({B, Hv, Dv, Dk}, mx::float32);
  }
  return gated_delta_ops(q, k, v, g, beta, *state, mask);
}

}  // namespace lmx::nn
