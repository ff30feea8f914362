#include "nn/transformer.h"

#include <cmath>

#include "nn/shard.h"

namespace lmx::nn {

SwiGLUMLP SwiGLUMLP::load(WeightStore& w, const std::string& path, int dims, int hidden,
                          bool bias) {
  return {Linear::load(w, path + ".gate_proj", dims, hidden, bias),
          Linear::load(w, path + ".up_proj", dims, hidden, bias),
          Linear::load(w, path + ".down_proj", hidden, dims, bias)};
}

mx::array SwiGLUMLP::operator()(const mx::array& x) const {
  return down_proj(swiglu(gate_proj(x), up_proj(x)));
}

Attention::Attention(const AttentionOptions& o, WeightStore& w, const std::string& p)
    : opt(o),
      scale(static_cast<float>(std::pow(o.head_dim, -0.5))),
      q_proj(Linear::load(w, p + ".q_proj", o.hidden_size, o.n_heads * o.head_dim, o.qkv_bias)),
      k_proj(Linear::load(w, p + ".k_proj", o.hidden_size, o.n_kv_heads * o.head_dim, o.qkv_bias)),
      v_proj(Linear::load(w, p + ".v_proj", o.hidden_size, o.n_kv_heads * o.head_dim, o.qkv_bias)),
      o_proj(Linear::load(w, p + ".o_proj", o.n_heads * o.head_dim, o.hidden_size, o.o_bias)) {
  if (o.qk_norm_eps) {
    q_norm = RMSNorm::load(w, p + ".q_norm", o.head_dim, *o.qk_norm_eps);
    k_norm = RMSNorm::load(w, p + ".k_norm", o.head_dim, *o.qk_norm_eps);
  }
}

mx::array Attention::operator()(const mx::array& x, const Mask& mask, KVCacheBase& cache) const {
  const int B = x.shape(0), L = x.shape(1);
  mx::array q = q_proj(x), k = k_proj(x), v = v_proj(x);
  if (q_norm) {
    // qwen3 normalizes each head over head_dim before moving heads forward.
    q = mx::transpose((*q_norm)(mx::reshape(q, {B, L, opt.n_heads, -1})), {0, 2, 1, 3});
    k = mx::transpose((*k_norm)(mx::reshape(k, {B, L, opt.n_kv_heads, -1})), {0, 2, 1, 3});
  } else {
    q = split_heads(q, opt.n_heads);     // (B, n_heads, L, head_dim)
    k = split_heads(k, opt.n_kv_heads);  // (B, n_kv_heads, L, head_dim)
  }
  v = split_heads(v, opt.n_kv_heads);
  q = opt.rope(q, cache);
  k = opt.rope(k, cache);
  return o_proj(merge_heads(cached_attention(q, k, v, cache, scale, mask)));
}

DecoderBlock::DecoderBlock(const DecoderOptions& o, WeightStore& w, const std::string& p)
    : self_attn(o.attention, w, p + ".self_attn"),
      mlp(SwiGLUMLP::load(w, p + ".mlp", o.attention.hidden_size, o.intermediate_size, o.mlp_bias)),
      input_layernorm(
          RMSNorm::load(w, p + ".input_layernorm", o.attention.hidden_size, o.rms_norm_eps)),
      post_attention_layernorm(RMSNorm::load(w, p + ".post_attention_layernorm",
                                             o.attention.hidden_size, o.rms_norm_eps)) {}

mx::array DecoderBlock::operator()(const mx::array& x, const Mask& mask, KVCacheBase& cache) const {
  if (auto y = fused(x, mask, cache)) return *y;
  mx::array h = mx::add(x, self_attn(input_layernorm(x), mask, cache));
  return mx::add(h, mlp(post_attention_layernorm(h)));
}

DenseDecoder::DenseDecoder(const DecoderOptions& o, WeightStore& w)
    : embed_tokens_(
          Embedding::load(w, "model.embed_tokens", o.vocab_size, o.attention.hidden_size)),
      norm_(RMSNorm::load(w, "model.norm", o.attention.hidden_size, o.rms_norm_eps)) {
  const ShardSpec* tp = w.shard();
  if (tp) check_shardable(o, *tp, w.source());
  for (int i = 0; i < o.num_hidden_layers; ++i) {
    const std::string path = "model.layers." + std::to_string(i);
    layers_.emplace_back(o, w, path);
    if (tp) shard_block(layers_.back(), *tp, path);
  }
  if (!o.tie_word_embeddings)
    lm_head_ = Linear::load(w, "lm_head", o.attention.hidden_size, o.vocab_size, false);
}

mx::array DenseDecoder::hidden(const mx::array& tokens, Cache& cache) {
  mx::array h = embed_tokens_(tokens);
  const Mask mask = cache[0]->make_mask(h.shape(1));
  for (size_t i = 0; i < layers_.size(); ++i) {
    h = layers_[i](h, mask, *cache[i]);
    if (tap_) tap_->on_layer(static_cast<int>(i), h);
  }
  h = norm_(h);
  if (tap_) tap_->on_final(h);
  return h;
}

mx::array DenseDecoder::operator()(const mx::array& tokens, Cache& cache) {
  mx::array h = hidden(tokens, cache);
  return lm_head_ ? (*lm_head_)(h) : embed_tokens_.as_linear(h);
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

void sanitize_dense(Weights& w, bool tie_word_embeddings) {
  std::erase_if(w, [](const auto& kv) {
    return kv.first.find("self_attn.rotary_emb.inv_freq") != std::string::npos;
  });
  if (tie_word_embeddings) w.erase("lm_head.weight");
}

}  // namespace lmx::nn
