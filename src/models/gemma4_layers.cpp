// Gemma 4 text layers: mlx_lm/models/gemma4_text.py's MLP, Router, Attention and DecoderLayer.
// Attention: q/k RMSNorms with weights, v without, scale 1, values not rotated, per-layer-type
// RoPE; KV-shared layers reuse their donor's cached K/V (plain or quantized). The decoder layer
// runs the MoE block (router + top-k experts through SwitchGLU) in parallel with the dense MLP,
// adds the per-layer input and multiplies by the layer scalar.
#include "models/gemma4_layers.h"

#include <cmath>

namespace lmx::gemma4 {

namespace {

// mx.fast.rope with the offset as an array (mlx-lm passes mx.array(cache.offset) here).
mx::array rope_at(const nn::RoPE& r, const mx::array& x, const mx::array& offset) {
  return mx::fast::rope(x, r.dims, r.traditional, r.base, r.scale, offset, r.freqs);
}

// geglu (compiled, shapeless): gelu_approx(gate) * x.
mx::array geglu(const mx::array& gate, const mx::array& x) {
  static auto fn = mx::compile(
      [](const std::vector<mx::array>& in) {
        return std::vector<mx::array>{mx::multiply(nn::gelu_approx(in[0]), in[1])};
      },
      /*shapeless=*/true);
  return fn({gate, x})[0];
}

nn::RMSNorm norm(WeightStore& w, const std::string& path, const Args& a) {
  return nn::RMSNorm::load(w, path, a.hidden_size, a.rms_norm_eps);
}

}  // namespace

mx::array weak(double value, const mx::array& x) {
  return mx::array(static_cast<float>(value), x.dtype());
}

MLP MLP::load(WeightStore& w, const std::string& p, int dims, int hidden) {
  return {nn::Linear::load(w, p + ".gate_proj", dims, hidden, false),
          nn::Linear::load(w, p + ".up_proj", dims, hidden, false),
          nn::Linear::load(w, p + ".down_proj", hidden, dims, false)};
}

mx::array MLP::operator()(const mx::array& x) const {
  return down_proj(geglu(gate_proj(x), up_proj(x)));
}

std::pair<mx::array, mx::array> Router::operator()(const mx::array& x) const {
  mx::array w = mx::multiply(scale, mx::array(static_cast<float>(root_size), scale.dtype()));
  mx::array scores = proj(mx::fast::rms_norm(x, w, eps));
  mx::array idx = nn::top_k_experts(scores, top_k);
  mx::array weights = mx::softmax(mx::take_along_axis(scores, idx, -1), -1, /*precise=*/false);
  return {idx, mx::multiply(weights, mx::take(per_expert_scale, idx, 0))};
}

Attention::Attention(const Args& a, int i, WeightStore& w, const std::string& p,
                     const std::string& source)
    : has_kv(i < a.first_kv_shared()),
      use_k_eq_v(a.attention_k_eq_v && !a.is_sliding(i)),
      n_heads(a.num_attention_heads),
      n_kv_heads(use_k_eq_v && a.num_global_key_value_heads ? *a.num_global_key_value_heads
                                                            : a.num_key_value_heads),
      head_dim(!a.is_sliding(i) && a.global_head_dim ? a.global_head_dim : a.head_dim),
      eps(a.rms_norm_eps),
      q_proj(nn::Linear::load(w, p + ".q_proj", a.hidden_size, n_heads * head_dim, false)),
      o_proj(nn::Linear::load(w, p + ".o_proj", n_heads * head_dim, a.hidden_size, false)),
      q_norm(nn::RMSNorm::load(w, p + ".q_norm", head_dim, eps)) {
  if (has_kv) {
    k_proj = nn::Linear::load(w, p + ".k_proj", a.hidden_size, n_kv_heads * head_dim, false);
    if (!use_k_eq_v)
      v_proj = nn::Linear::load(w, p + ".v_proj", a.hidden_size, n_kv_heads * head_dim, false);
    k_norm = nn::RMSNorm::load(w, p + ".k_norm", head_dim, eps);
  }
  const std::string key = a.is_sliding(i) ? "sliding_attention" : "full_attention";
  const json params = a.rope_parameters.contains(key) ? a.rope_parameters[key] : json::object();
  const float theta = params.contains("rope_theta") ? params["rope_theta"].get<float>() : 1e4f;
  rope =
      nn::make_rope(head_dim, theta, a.rope_traditional, params, a.max_position_embeddings, source);
  check(!rope.dynamic && rope.mscale == 1.0f, source, "rope_parameters.", key,
        ": only default, linear, proportional, llama3 RoPE are supported for gemma4");
}

std::pair<mx::array, SharedKV> Attention::operator()(const mx::array& x, const Mask& mask,
                                                     KVCacheBase* cache,
                                                     const SharedKV* shared) const {
  const int B = x.shape(0), L = x.shape(1);
  mx::array q = q_norm(mx::reshape(q_proj(x), {B, L, n_heads, head_dim}));
  SharedKV kv;
  std::optional<mx::array> k, v;
  if (shared) {
    kv = *shared;
  } else {
    check(has_kv && cache, "gemma4", "a KV-shared layer got no shared K/V");
    k = mx::reshape((*k_proj)(x), {B, L, n_kv_heads, head_dim});
    v = use_k_eq_v ? *k : mx::reshape((*v_proj)(x), {B, L, n_kv_heads, head_dim});
    kv.offset = mx::array(cache->offset());
    k = rope_at(rope, mx::transpose((*k_norm)(*k), {0, 2, 1, 3}), kv.offset);
    v = mx::transpose(mx::fast::rms_norm(*v, std::nullopt, eps), {0, 2, 1, 3});
  }
  q = rope_at(rope, mx::transpose(q, {0, 2, 1, 3}), kv.offset);
  if (cache) {
    if (auto quant = cache->quantization()) {
      kv.quantized = cache->update_and_fetch_quantized(*k, *v);
      kv.quant = *quant;
    } else {
      kv.plain = cache->update_and_fetch(*k, *v);
    }
  }
  // Sharers of a quantized donor take the quantized path too (mlx-lm has no path for them).
  mx::array out = kv.quantized ? nn::quantized_attention(q, kv.quantized->first,
                                                         kv.quantized->second, 1.0f, mask, kv.quant)
                               : nn::attention(q, kv.plain->first, kv.plain->second, 1.0f, mask);
  return {o_proj(nn::merge_heads(out)), kv};
}

namespace {

MoE load_moe(const Args& a, WeightStore& w, const std::string& p) {
  const int H = a.hidden_size;
  Router router{nn::Linear::load(w, p + ".router.proj", H, a.num_experts, false),
                w.take(p + ".router.scale", {H}),
                w.take(p + ".router.per_expert_scale", {a.num_experts}),
                a.rms_norm_eps,
                a.top_k_experts,
                std::pow(H, -0.5)};
  nn::SwitchGLU experts = nn::SwitchGLU::load(w, p + ".experts.switch_glu", H,
                                              a.moe_intermediate_size, a.num_experts, false);
  experts.activation = [](const mx::array& x_up, const mx::array& x_gate) {
    return geglu(x_gate, x_up);
  };
  return MoE{std::move(router), std::move(experts), norm(w, p + ".post_feedforward_layernorm_1", a),
             norm(w, p + ".post_feedforward_layernorm_2", a),
             norm(w, p + ".pre_feedforward_layernorm_2", a)};
}

// KV-shared layers get a double-wide MLP when use_double_wide_mlp (and some layer shares).
int mlp_width(const Args& a, int i) {
  const bool wide = a.use_double_wide_mlp && i >= a.first_kv_shared() && a.first_kv_shared() > 0;
  return a.intermediate_size * (wide ? 2 : 1);
}

}  // namespace

DecoderLayer::DecoderLayer(const Args& a, int i, WeightStore& w, const std::string& p,
                           const std::string& source)
    : self_attn(a, i, w, p + ".self_attn", source),
      mlp(MLP::load(w, p + ".mlp", a.hidden_size, mlp_width(a, i))),
      input_layernorm(norm(w, p + ".input_layernorm", a)),
      post_attention_layernorm(norm(w, p + ".post_attention_layernorm", a)),
      pre_feedforward_layernorm(norm(w, p + ".pre_feedforward_layernorm", a)),
      post_feedforward_layernorm(norm(w, p + ".post_feedforward_layernorm", a)),
      layer_scalar(w.take(p + ".layer_scalar", {1})) {
  if (a.enable_moe_block) moe = load_moe(a, w, p);
  if (const int Hp = a.hidden_size_per_layer_input) {
    const int H = a.hidden_size;
    per_layer = PerLayerInput{nn::Linear::load(w, p + ".per_layer_input_gate", H, Hp, false),
                              nn::Linear::load(w, p + ".per_layer_projection", Hp, H, false),
                              norm(w, p + ".post_per_layer_input_norm", a)};
  }
}

std::pair<mx::array, SharedKV> DecoderLayer::operator()(
    const mx::array& x, const Mask& mask, KVCacheBase* cache,
    const std::optional<mx::array>& per_layer_input, const SharedKV* shared) const {
  auto [attn, kv] = self_attn(input_layernorm(x), mask, cache, shared);
  mx::array h = mx::add(x, post_attention_layernorm(attn));
  mx::array residual = h;
  if (moe) {
    mx::array h1 = moe->post_feedforward_layernorm_1(mlp(pre_feedforward_layernorm(h)));
    auto [idx, weights] = moe->router(h);
    mx::array h2 = moe->experts(moe->pre_feedforward_layernorm_2(h), idx);
    h2 = mx::sum(mx::multiply(mx::expand_dims(weights, -1), h2), -2);
    h = mx::add(h1, moe->post_feedforward_layernorm_2(h2));
  } else {
    h = mlp(pre_feedforward_layernorm(h));
  }
  h = mx::add(residual, post_feedforward_layernorm(h));
  if (per_layer && per_layer_input) {
    mx::array gate = nn::gelu_approx(per_layer->per_layer_input_gate(h));
    gate = per_layer->per_layer_projection(mx::multiply(gate, *per_layer_input));
    h = mx::add(h, per_layer->post_per_layer_input_norm(gate));
  }
  return {mx::multiply(h, layer_scalar), kv};
}

}  // namespace lmx::gemma4
