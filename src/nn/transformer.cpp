#include "nn/transformer.h"

#include <algorithm>
#include <cmath>

#include "cache/rotating_kv_cache.h"
#include "nn/shard.h"

namespace lmx::nn {

SwiGLUMLP SwiGLUMLP::load(WeightStore& w, const std::string& path, int dims, int hidden, bool bias,
                          bool fused_gate_up) {
  SwiGLUMLP m;
  if (fused_gate_up) {
    m.gate_up_proj = Linear::load(w, path + ".gate_up_proj", dims, 2 * hidden, bias);
  } else {
    m.gate_proj = Linear::load(w, path + ".gate_proj", dims, hidden, bias);
    m.up_proj = Linear::load(w, path + ".up_proj", dims, hidden, bias);
  }
  m.down_proj = Linear::load(w, path + ".down_proj", hidden, dims, bias);
  return m;
}

mx::array SwiGLUMLP::gated(const mx::array& x_in, const RMSNorm* pre_norm) const {
  if (!gate_up_proj)
    if (auto y = cuda_fused_swiglu(x_in, *gate_proj, *up_proj, pre_norm)) return *y;
  const mx::array x = pre_norm ? (*pre_norm)(x_in) : x_in;
  if (gate_up_proj) {
    auto gate_up = mx::split((*gate_up_proj)(x), 2, -1);
    return swiglu(gate_up[0], gate_up[1]);
  }
  // gate before up, as mlx-lm calls them: a training adapter's dropout draws in call order.
  mx::array gate = (*gate_proj)(x);
  return swiglu(gate, (*up_proj)(x));
}

mx::array SwiGLUMLP::operator()(const mx::array& x) const { return down_proj(gated(x)); }

mx::array SwiGLUMLP::add_to(const mx::array& residual, const mx::array& x,
                            const RMSNorm* pre_norm) const {
  mx::array h = gated(x, pre_norm);
  if (auto y = cuda_fused_add(h, down_proj, residual)) return *y;
  return mx::add(residual, down_proj(h));
}

Attention::Attention(const AttentionOptions& o, WeightStore& w, const std::string& p)
    : opt(o), scale(o.scale ? *o.scale : static_cast<float>(std::pow(o.head_dim, -0.5))) {
  const int q_size = o.n_heads * o.head_dim, kv_size = o.n_kv_heads * o.head_dim;
  // In module order (q, k, v, o): the first bad tensor is the one an error names.
  if (o.fused_qkv) {
    qkv_proj = Linear::load(w, p + ".qkv_proj", o.hidden_size, q_size + 2 * kv_size, o.qkv_bias);
  } else {
    q_proj = Linear::load(w, p + ".q_proj", o.hidden_size, q_size, o.qkv_bias);
    k_proj = Linear::load(w, p + ".k_proj", o.hidden_size, kv_size, o.qkv_bias);
    v_proj = Linear::load(w, p + ".v_proj", o.hidden_size, kv_size, o.qkv_bias);
  }
  o_proj = Linear::load(w, p + ".o_proj", q_size, o.hidden_size, o.o_bias);
  if (o.qk_norm_eps) {
    q_norm = RMSNorm::load(w, p + ".q_norm", o.qk_norm_over_projection ? q_size : o.head_dim,
                           *o.qk_norm_eps);
    k_norm = RMSNorm::load(w, p + ".k_norm", o.qk_norm_over_projection ? kv_size : o.head_dim,
                           *o.qk_norm_eps);
  }
}

mx::array Attention::attend(const mx::array& x_in, const Mask& mask, KVCacheBase& cache,
                            const RMSNorm* pre_norm) const {
  const int B = x_in.shape(0), L = x_in.shape(1);
  auto normed = [&] { return pre_norm ? (*pre_norm)(x_in) : x_in; };
  std::vector<mx::array> qkv;
  bool on_cuda_kernels = false;  // tier L3 on CUDA took the projections
  if (qkv_proj) {
    const int q_end = opt.n_heads * opt.head_dim;
    qkv = mx::split((*qkv_proj)(normed()), {q_end, q_end + opt.n_kv_heads * opt.head_dim}, -1);
  } else if (auto f = cuda_fused_matmuls(x_in, {&*q_proj, &*k_proj, &*v_proj}, pre_norm)) {
    qkv = std::move(*f);
    on_cuda_kernels = true;
  } else {
    const mx::array x = normed();
    qkv = {(*q_proj)(x), (*k_proj)(x), (*v_proj)(x)};
  }
  mx::array q = qkv[0], k = qkv[1], v = qkv[2];
  std::optional<std::pair<mx::array, mx::array>> qk;
  if (on_cuda_kernels && opt.use_rope && !(q_norm && opt.qk_norm_over_projection))
    qk = cuda_qk_norm_rope(q, k, q_norm ? &*q_norm : nullptr, k_norm ? &*k_norm : nullptr, opt.rope,
                           cache, opt.n_heads, opt.n_kv_heads, opt.head_dim);
  if (qk) {
    q = qk->first;
    k = qk->second;
  } else if (q_norm && opt.qk_norm_over_projection) {
    // olmo2 normalizes the whole projection, all heads at once.
    q = split_heads((*q_norm)(q), opt.n_heads);
    k = split_heads((*k_norm)(k), opt.n_kv_heads);
  } else if (q_norm) {
    // qwen3 normalizes each head over head_dim before moving heads forward.
    q = mx::transpose((*q_norm)(mx::reshape(q, {B, L, opt.n_heads, -1})), {0, 2, 1, 3});
    k = mx::transpose((*k_norm)(mx::reshape(k, {B, L, opt.n_kv_heads, -1})), {0, 2, 1, 3});
  } else {
    q = split_heads(q, opt.n_heads);     // (B, n_heads, L, head_dim)
    k = split_heads(k, opt.n_kv_heads);  // (B, n_kv_heads, L, head_dim)
  }
  v = split_heads(v, opt.n_kv_heads);
  if (opt.use_rope && !qk) {
    q = opt.rope(q, cache);
    k = opt.rope(k, cache);
  }
  return merge_heads(cached_attention(q, k, v, cache, scale, mask));
}

mx::array Attention::operator()(const mx::array& x, const Mask& mask, KVCacheBase& cache) const {
  return o_proj(attend(x, mask, cache));
}

mx::array Attention::add_to(const mx::array& residual, const mx::array& x, const Mask& mask,
                            KVCacheBase& cache, const RMSNorm* pre_norm) const {
  mx::array a = attend(x, mask, cache, pre_norm);
  if (auto y = cuda_fused_add(a, o_proj, residual)) return *y;
  return mx::add(residual, o_proj(a));
}

namespace {

AttentionOptions layer_attention(const DecoderOptions& o, int layer) {
  AttentionOptions a = o.attention;
  if (layer < static_cast<int>(o.no_rope.size()) && o.no_rope[layer]) a.use_rope = false;
  return a;
}

}  // namespace

DecoderBlock::DecoderBlock(const DecoderOptions& o, int layer, WeightStore& w, const std::string& p)
    : self_attn(layer_attention(o, layer), w, p + ".self_attn"),
      mlp(SwiGLUMLP::load(w, p + ".mlp", o.attention.hidden_size, o.intermediate_size, o.mlp_bias,
                          o.fused_gate_up)),
      norms(o.norms),
      residual_multiplier(o.residual_multiplier) {
  auto norm = [&](const char* name) {
    return RMSNorm::load(w, p + "." + name, o.attention.hidden_size, o.rms_norm_eps);
  };
  switch (norms) {
    case NormPlacement::pre:
      input_layernorm = norm("input_layernorm");
      post_attention_layernorm = norm("post_attention_layernorm");
      break;
    case NormPlacement::post:
      post_attention_layernorm = norm("post_attention_layernorm");
      post_feedforward_layernorm = norm("post_feedforward_layernorm");
      break;
    case NormPlacement::sandwich:
      input_layernorm = norm("input_layernorm");
      post_self_attn_layernorm = norm("post_self_attn_layernorm");
      post_attention_layernorm = norm("post_attention_layernorm");
      post_mlp_layernorm = norm("post_mlp_layernorm");
      break;
  }
}

NamedArrays DecoderBlock::parameters(const std::string& prefix) {
  NamedArrays out;
  auto linear = [&](Linear& l, const std::string& name) {
    out.emplace_back(prefix + name + ".weight", &l.weight);
    if (l.bias) out.emplace_back(prefix + name + ".bias", &*l.bias);
    if (l.scales) out.emplace_back(prefix + name + ".scales", &*l.scales);
    if (l.biases) out.emplace_back(prefix + name + ".biases", &*l.biases);
  };
  auto maybe_linear = [&](std::optional<Linear>& l, const std::string& name) {
    if (l) linear(*l, name);
  };
  auto norm = [&](std::optional<RMSNorm>& n, const std::string& name) {
    if (n) out.emplace_back(prefix + name + ".weight", &n->weight);
  };
  maybe_linear(self_attn.q_proj, "self_attn.q_proj");
  maybe_linear(self_attn.k_proj, "self_attn.k_proj");
  maybe_linear(self_attn.v_proj, "self_attn.v_proj");
  maybe_linear(self_attn.qkv_proj, "self_attn.qkv_proj");
  linear(self_attn.o_proj, "self_attn.o_proj");
  norm(self_attn.q_norm, "self_attn.q_norm");
  norm(self_attn.k_norm, "self_attn.k_norm");
  maybe_linear(mlp.gate_proj, "mlp.gate_proj");
  maybe_linear(mlp.up_proj, "mlp.up_proj");
  maybe_linear(mlp.gate_up_proj, "mlp.gate_up_proj");
  linear(mlp.down_proj, "mlp.down_proj");
  norm(input_layernorm, "input_layernorm");
  norm(post_attention_layernorm, "post_attention_layernorm");
  norm(post_feedforward_layernorm, "post_feedforward_layernorm");
  norm(post_self_attn_layernorm, "post_self_attn_layernorm");
  norm(post_mlp_layernorm, "post_mlp_layernorm");
  return out;
}

mx::array DecoderBlock::operator()(const mx::array& x, const Mask& mask, KVCacheBase& cache) const {
  if (auto y = fused(x, mask, cache)) return *y;
  // granite: h = x + r * residual_multiplier
  auto add = [&](const mx::array& h, const mx::array& r) {
    return mx::add(h,
                   residual_multiplier ? mx::multiply(r, weak_scalar(*residual_multiplier, r)) : r);
  };
  switch (norms) {
    case NormPlacement::pre: {
      if (!residual_multiplier) {
        // The residual adds go into the o and down projections' kernels where they can.
        // So do the norms, into the kernels of the projections that read them.
        mx::array h = self_attn.add_to(x, x, mask, cache, &*input_layernorm);
        return mlp.add_to(h, h, &*post_attention_layernorm);
      }
      mx::array h = add(x, self_attn((*input_layernorm)(x), mask, cache));
      return add(h, mlp((*post_attention_layernorm)(h)));
    }
    case NormPlacement::post: {
      mx::array h = add(x, (*post_attention_layernorm)(self_attn(x, mask, cache)));
      return add(h, (*post_feedforward_layernorm)(mlp(h)));
    }
    case NormPlacement::sandwich: {
      mx::array h =
          add(x, (*post_self_attn_layernorm)(self_attn((*input_layernorm)(x), mask, cache)));
      return add(h, (*post_mlp_layernorm)(mlp((*post_attention_layernorm)(h))));
    }
  }
  return x;  // unreachable
}

DenseDecoder::DenseDecoder(const DecoderOptions& o, WeightStore& w)
    : embedding_multiplier_(o.embedding_multiplier),
      logits_scaling_(o.logits_scaling),
      sliding_(o.sliding),
      sliding_window_(o.sliding_window),
      embed_tokens_(
          Embedding::load(w, "model.embed_tokens", o.vocab_size, o.attention.hidden_size)),
      norm_(RMSNorm::load(w, "model.norm", o.attention.hidden_size, o.rms_norm_eps)) {
  const ShardSpec* tp = o.shardable ? w.shard() : nullptr;
  if (tp) check_shardable(o, *tp, w.source());
  for (int i = 0; i < o.num_hidden_layers; ++i) {
    const std::string path = "model.layers." + std::to_string(i);
    layers_.emplace_back(o, i, w, path);
    if (tp) shard_block(layers_.back(), *tp, path);
  }
  if (!o.tie_word_embeddings)
    lm_head_ = Linear::load(w, "lm_head", o.attention.hidden_size, o.vocab_size, false);
}

mx::array DenseDecoder::embed(const mx::array& tokens) const {
  mx::array h = embed_tokens_(tokens);
  if (embedding_multiplier_) h = mx::multiply(h, weak_scalar(*embedding_multiplier_, h));
  return h;
}

mx::array DenseDecoder::head(const mx::array& h) const {
  mx::array logits = lm_head_ ? (*lm_head_)(h) : embed_tokens_.as_linear(h);
  if (logits_scaling_) logits = mx::divide(logits, weak_scalar(*logits_scaling_, logits));
  return logits;
}

NamedArrays DenseDecoder::layer_parameters(int layer) {
  return layers_.at(layer).parameters("model.layers." + std::to_string(layer) + ".");
}

mx::array DenseDecoder::hidden(const mx::array& tokens, Cache& cache) {
  mx::array h = embed(tokens);
  const int L = h.shape(1);
  // llama.py: the causal mask from the first full-attention layer's cache, the windowed one
  // from the first sliding layer's.
  size_t full = 0;
  while (is_sliding(full)) ++full;
  const Mask mask = cache[full]->make_mask(L);
  Mask sliding_mask;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (!is_sliding(i)) continue;
    sliding_mask = cache[i]->make_mask(L, sliding_window_);
    break;
  }
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (layer_hook_) {
      const Mask& m = is_sliding(i) ? sliding_mask : mask;
      h = layer_hook_(static_cast<int>(i), h, [this, i, m, c = cache[i].get()](const mx::array& x) {
        return layers_[i](x, m, *c);
      });
    } else {
      h = layers_[i](h, is_sliding(i) ? sliding_mask : mask, *cache[i]);
    }
    if (tap_) tap_->on_layer(static_cast<int>(i), h);
  }
  h = norm_(h);
  if (tap_) tap_->on_final(h);
  return h;
}

mx::array DenseDecoder::operator()(const mx::array& tokens, Cache& cache) {
  return head(hidden(tokens, cache));
}

Cache DenseDecoder::make_cache() const {
  Cache c;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (is_sliding(i)) {
      c.push_back(std::make_unique<RotatingKVCache>(*sliding_window_));
    } else {
      c.push_back(std::make_unique<KVCache>());
    }
  }
  return c;
}

mx::array split_heads(const mx::array& x, int n_heads) {
  const int B = x.shape(0), L = x.shape(1);
  return mx::transpose(mx::reshape(x, {B, L, n_heads, -1}), {0, 2, 1, 3});
}

mx::array merge_heads(const mx::array& x) {
  const int B = x.shape(0), L = x.shape(2);
  return mx::reshape(mx::transpose(x, {0, 2, 1, 3}), {B, L, -1});
}

DecoderOptions parse_decoder_keys(const JsonView& v, bool kv_heads_required) {
  DecoderOptions o;
  auto& a = o.attention;
  a.hidden_size = v.get<int>("hidden_size");
  o.num_hidden_layers = v.get<int>("num_hidden_layers");
  o.intermediate_size = v.get<int>("intermediate_size");
  a.n_heads = v.get<int>("num_attention_heads");
  o.rms_norm_eps = v.get<float>("rms_norm_eps");
  o.vocab_size = v.get<int>("vocab_size");
  check(a.n_heads > 0, v.source, "num_attention_heads must be > 0, got ", a.n_heads);
  a.n_kv_heads = kv_heads_required ? v.get<int>("num_key_value_heads")
                                   : v.get<int>("num_key_value_heads", a.n_heads);
  check(a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0, v.source, "num_attention_heads ",
        a.n_heads, " is not a multiple of num_key_value_heads ", a.n_kv_heads);
  return o;
}

mx::array weak_scalar(double value, const mx::array& x) {
  return mx::array(static_cast<float>(value), x.dtype());
}

void parse_layer_types(const JsonView& v, DecoderOptions& o) {
  if (!v.has("layer_types")) return;
  const json& types = v.j.at("layer_types");
  check(types.is_array() && static_cast<int>(types.size()) == o.num_hidden_layers, v.source,
        "layer_types must list num_hidden_layers (", o.num_hidden_layers, ") entries, got ",
        types.dump());
  bool any_full = false;
  for (const auto& t : types) {
    check(t == "full_attention" || t == "sliding_attention", v.source, "layer_types entry ",
          t.dump(), " is not supported, expected \"full_attention\" or \"sliding_attention\"");
    o.sliding.push_back(t == "sliding_attention");
    any_full = any_full || t == "full_attention";
  }
  check(any_full, v.source, "layer_types has no \"full_attention\" layer, expected at least one");
  if (std::find(o.sliding.begin(), o.sliding.end(), true) == o.sliding.end()) return;
  o.sliding_window = v.get<int>("sliding_window");
  check(*o.sliding_window > 0, v.source, "sliding_window must be > 0, got ", *o.sliding_window);
}

void sanitize_dense(Weights& w, bool tie_word_embeddings) {
  std::erase_if(w, [](const auto& kv) {
    return kv.first.find("self_attn.rotary_emb.inv_freq") != std::string::npos;
  });
  if (tie_word_embeddings) w.erase("lm_head.weight");
}

}  // namespace lmx::nn
