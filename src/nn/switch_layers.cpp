#include "nn/switch_layers.h"

#include "kernels/cpu/gather_qmm.h"

namespace lmx::nn {

namespace {

kernels::cpu::QmmOptions kernel_options(const QuantSpec& q, const mx::array& x, bool from_mxfp4) {
  kernels::cpu::QmmOptions opt;
  opt.group_size = q.group_size;
  opt.bits = q.bits;
  if (from_mxfp4) opt.out_dtype = x.dtype();  // as MLX's gather_qmm with uint8 scales
  return opt;
}

}  // namespace

SwitchLinear SwitchLinear::load(WeightStore& w, const std::string& path, int in, int out,
                                int experts, bool has_bias) {
  SwitchLinear l;
  l.quant = w.quant_for(path, in);
  if (l.quant) {
    const int groups = in / l.quant->group_size;
    l.weight = w.take(path + ".weight", {experts, out, in * l.quant->bits / 32});
    l.scales = w.take(path + ".scales", {experts, out, groups});
    l.biases = w.take_optional(path + ".biases", {experts, out, groups});
    // Tier L3 as for a Linear (nn/layers.cpp): the store asks for it and the kernels handle the
    // layout; MXFP4 experts as their 8-bit affine copy.
    if (w.cpu_kernels() && kernels::cpu::moe_experts() &&
        widen_mxfp4_weight(l.weight, l.scales, l.biases, l.quant))
      l.from_mxfp4 = true;
    l.cpu_kernel = w.cpu_kernels() && kernels::cpu::moe_experts() && l.biases &&
                   kernels::cpu::supports(l.quant->bits, l.quant->group_size, l.quant->mode,
                                          l.scales->dtype());
    if (l.cpu_kernel) {
      // The kernel reads each expert in place: a view (a split of fused gate/up) is copied once.
      for (mx::array* a : {&l.weight, &*l.scales, &*l.biases}) {
        mx::eval(*a);
        if (!a->flags().row_contiguous) {
          *a = mx::contiguous(*a);
          mx::eval(*a);
        }
      }
      kernels::cpu::prepack_experts(l.weight, *l.scales, *l.biases, l.quant->group_size,
                                    l.quant->bits);
    }
  } else {
    l.weight = w.take(path + ".weight", {experts, out, in});
  }
  if (has_bias) l.bias = w.take(path + ".bias", {experts, out});
  if (w.adapters()) l.adapters = w.adapters()->switch_linear(path, in, out, experts);
  return l;
}

mx::array SwitchLinear::operator()(const mx::array& x, const mx::array& indices,
                                   bool sorted_indices) const {
  mx::array y =
      cpu_kernel ? kernels::cpu::gather_quantized_matmul(x, weight, *scales, *biases, indices,
                                                         kernel_options(*quant, x, from_mxfp4))
      : quant
          ? mx::gather_qmm(x, weight, *scales, biases, std::nullopt, indices,
                           /*transpose=*/true, quant->group_size, quant->bits, quant->mode,
                           std::nullopt, sorted_indices)
          : mx::gather_mm(x, mx::swapaxes(weight, -1, -2), std::nullopt, indices, sorted_indices);
  if (bias) y = mx::add(y, mx::expand_dims(mx::take(*bias, indices, 0), -2));
  for (const auto& a : adapters) y = (*a)(x, indices, sorted_indices, y);
  return y;
}

SwitchGLU SwitchGLU::load(WeightStore& w, const std::string& p, int dims, int hidden, int experts,
                          bool bias) {
  return {SwitchLinear::load(w, p + ".gate_proj", dims, hidden, experts, bias),
          SwitchLinear::load(w, p + ".up_proj", dims, hidden, experts, bias),
          SwitchLinear::load(w, p + ".down_proj", hidden, dims, experts, bias),
          [](const mx::array& x_up, const mx::array& x_gate) { return swiglu(x_gate, x_up); }};
}

mx::array SwitchGLU::operator()(const mx::array& x_in, const mx::array& indices) const {
  mx::array x = mx::expand_dims(x_in, {-2, -3});  // (B, L, 1, 1, dims)
  const bool do_sort = indices.size() >= 64;
  mx::array idx = indices;
  std::optional<mx::array> inv_order;
  if (do_sort) {
    // _gather_sort: one row per (token, expert) pair, ordered by expert.
    const int M = indices.shape(-1);
    mx::array flat = mx::flatten(indices);
    mx::array order = mx::argsort(flat);
    inv_order = mx::argsort(order);
    x = mx::take(mx::flatten(x, 0, -3), mx::floor_divide(order, mx::array(M, order.dtype())), 0);
    idx = mx::take(flat, order, 0);
  }
  mx::array x_up = up_proj(x, idx, do_sort);
  mx::array x_gate = gate_proj(x, idx, do_sort);
  x = down_proj(activation(x_up, x_gate), idx, do_sort);
  if (do_sort) x = mx::unflatten(mx::take(x, *inv_order, 0), 0, indices.shape());
  return mx::squeeze(x, -2);
}

mx::array top_k_experts(const mx::array& scores, int k) {
  const int E = scores.shape(-1);
  mx::array inds = mx::argpartition(scores, -k, -1);
  mx::Shape lo(inds.ndim(), 0), hi = inds.shape();
  lo.back() = E - k;
  return mx::slice(inds, lo, hi);
}

}  // namespace lmx::nn
