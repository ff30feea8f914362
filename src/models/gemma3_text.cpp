// Gemma 3 text: mlx_lm/models/gemma3_text.py. Layer i is global (full attention, KVCache, RoPE
// base rope_theta with rope_scaling) iff i % sliding_window_pattern == pattern - 1; the others are
// sliding-window layers (RotatingKVCache of sliding_window, RoPE base rope_local_base_freq).
// (1 + w) RMSNorms around both sublayers and on q/k, attention scale query_pre_attn_scalar^-0.5,
// embeddings times bf16(sqrt(hidden_size)), gelu_approx MLP, f16 residuals added in f32 and
// clipped. Tied iff the checkpoint has no lm_head.weight. Under tier L3 a layer whose
// projections are all on the CPU kernels runs as one fused primitive (kernels/cpu/fused.h) over
// its KVCache or RotatingKVCache (docs/cpu.md).
#include "models/gemma3_text.h"

#include <cmath>

#include "cache/rotating_kv_cache.h"
#include "cache/rows_cache.h"
#include "kernels/cpu/fused.h"
#include "nn/transformer.h"

namespace lmx {
namespace {

struct Args {
  int hidden_size, num_hidden_layers, intermediate_size, num_attention_heads, head_dim;
  float rms_norm_eps;
  int vocab_size, num_key_value_heads;
  float rope_theta, rope_local_base_freq;
  double query_pre_attn_scalar;
  int sliding_window, sliding_window_pattern, max_position_embeddings;
  json rope_scaling;
};

// gemma3_text.ModelArgs with its defaults.
Args parse_args(const json& c, const std::string& source) {
  JsonView v{c, source};
  Args a;
  a.hidden_size = v.get<int>("hidden_size", 1152);
  a.num_hidden_layers = v.get<int>("num_hidden_layers", 26);
  a.intermediate_size = v.get<int>("intermediate_size", 6912);
  a.num_attention_heads = v.get<int>("num_attention_heads", 4);
  a.head_dim = v.get<int>("head_dim", 256);
  a.rms_norm_eps = v.get<float>("rms_norm_eps", 1e-6f);
  a.vocab_size = v.get<int>("vocab_size", 262144);
  a.num_key_value_heads = v.get<int>("num_key_value_heads", 1);
  a.rope_theta = v.get<float>("rope_theta", 1e6f);
  a.rope_local_base_freq = v.get<float>("rope_local_base_freq", 1e4f);
  a.query_pre_attn_scalar = v.get<double>("query_pre_attn_scalar", 256);
  a.sliding_window = v.get<int>("sliding_window", 512);
  a.sliding_window_pattern = v.get<int>("sliding_window_pattern", 6);
  a.max_position_embeddings = v.get<int>("max_position_embeddings", 32768);
  a.rope_scaling = v.has("rope_scaling") ? c["rope_scaling"] : json();
  check(a.num_key_value_heads > 0 && a.num_attention_heads % a.num_key_value_heads == 0, source,
        "num_attention_heads ", a.num_attention_heads, " is not a multiple of num_key_value_heads ",
        a.num_key_value_heads);
  check(a.sliding_window_pattern > 0, source, "sliding_window_pattern must be > 0, got ",
        a.sliding_window_pattern);
  check(a.sliding_window > 0, source, "sliding_window must be > 0, got ", a.sliding_window);
  return a;
}

bool is_global(const Args& a, int i) {
  return i % a.sliding_window_pattern == a.sliding_window_pattern - 1;
}

// Gemma's RMSNorm: rms_norm(x, 1 + w), 1 + w in the weight's dtype (computed once, same bits).
struct RMSNorm {
  mx::array weight;
  float eps;

  static RMSNorm load(WeightStore& w, const std::string& path, int dims, float eps) {
    mx::array weight = w.take(path + ".weight", {dims});
    return {mx::add(mx::array(1.0f, weight.dtype()), weight), eps};
  }
  mx::array operator()(const mx::array& x) const { return mx::fast::rms_norm(x, weight, eps); }
};

// clip_residual (compiled, shapeless): x + y, or for f16 the sum in f32 clipped to f16's range.
mx::array clip_residual(const mx::array& x, const mx::array& y) {
  static auto fn = mx::compile(
      [](const std::vector<mx::array>& in) {
        const mx::array &x = in[0], &y = in[1];
        if (x.dtype() != mx::float16) return std::vector<mx::array>{mx::add(x, y)};
        const float bound = 65504.0f;  // finfo(float16).max
        mx::array sum = mx::add(mx::astype(x, mx::float32), mx::astype(y, mx::float32));
        return std::vector<mx::array>{
            mx::astype(mx::clip(sum, mx::array(-bound, mx::float32), mx::array(bound, mx::float32)),
                       mx::float16)};
      },
      /*shapeless=*/true);
  return fn({x, y})[0];
}

struct Attention {
  int n_heads, n_kv_heads, head_dim;
  float scale;
  nn::Linear q_proj, k_proj, v_proj, o_proj;
  RMSNorm q_norm, k_norm;
  nn::RoPE rope;

  Attention(const Args& a, int layer, WeightStore& w, const std::string& p,
            const std::string& source)
      : n_heads(a.num_attention_heads),
        n_kv_heads(a.num_key_value_heads),
        head_dim(a.head_dim),
        scale(static_cast<float>(std::pow(a.query_pre_attn_scalar, -0.5))),
        q_proj(nn::Linear::load(w, p + ".q_proj", a.hidden_size, n_heads * a.head_dim, false)),
        k_proj(nn::Linear::load(w, p + ".k_proj", a.hidden_size, n_kv_heads * a.head_dim, false)),
        v_proj(nn::Linear::load(w, p + ".v_proj", a.hidden_size, n_kv_heads * a.head_dim, false)),
        o_proj(nn::Linear::load(w, p + ".o_proj", n_heads * a.head_dim, a.hidden_size, false)),
        q_norm(RMSNorm::load(w, p + ".q_norm", a.head_dim, a.rms_norm_eps)),
        k_norm(RMSNorm::load(w, p + ".k_norm", a.head_dim, a.rms_norm_eps)),
        rope(is_global(a, layer) ? nn::make_rope(a.head_dim, a.rope_theta, false, a.rope_scaling,
                                                 a.max_position_embeddings, source)
                                 : nn::make_rope(a.head_dim, a.rope_local_base_freq, false, json(),
                                                 std::nullopt, source)) {}

  mx::array operator()(const mx::array& x, const Mask& mask, KVCacheBase& cache) const {
    // (B, heads, L, head_dim); the q/k norms run over head_dim after the transpose.
    mx::array q = q_norm(nn::split_heads(q_proj(x), n_heads));
    mx::array k = k_norm(nn::split_heads(k_proj(x), n_kv_heads));
    mx::array v = nn::split_heads(v_proj(x), n_kv_heads);
    q = rope(q, cache);
    k = rope(k, cache);
    return o_proj(nn::merge_heads(nn::cached_attention(q, k, v, cache, scale, mask)));
  }
};

struct MLP {
  nn::Linear gate_proj, up_proj, down_proj;
  mx::array operator()(const mx::array& x) const {
    return down_proj(mx::multiply(nn::gelu_approx(gate_proj(x)), up_proj(x)));
  }
};

struct TransformerBlock {
  Attention self_attn;
  MLP mlp;
  RMSNorm input_layernorm, post_attention_layernorm, pre_feedforward_layernorm,
      post_feedforward_layernorm;

  TransformerBlock(const Args& a, int layer, WeightStore& w, const std::string& p,
                   const std::string& source)
      : self_attn(a, layer, w, p + ".self_attn", source),
        mlp{nn::Linear::load(w, p + ".mlp.gate_proj", a.hidden_size, a.intermediate_size, false),
            nn::Linear::load(w, p + ".mlp.up_proj", a.hidden_size, a.intermediate_size, false),
            nn::Linear::load(w, p + ".mlp.down_proj", a.intermediate_size, a.hidden_size, false)},
        input_layernorm(RMSNorm::load(w, p + ".input_layernorm", a.hidden_size, a.rms_norm_eps)),
        post_attention_layernorm(
            RMSNorm::load(w, p + ".post_attention_layernorm", a.hidden_size, a.rms_norm_eps)),
        pre_feedforward_layernorm(
            RMSNorm::load(w, p + ".pre_feedforward_layernorm", a.hidden_size, a.rms_norm_eps)),
        post_feedforward_layernorm(
            RMSNorm::load(w, p + ".post_feedforward_layernorm", a.hidden_size, a.rms_norm_eps)) {}

  // window: the layer's sliding window, 0 for a global layer.
  mx::array operator()(const mx::array& x, const Mask& mask, KVCacheBase& cache, int window) const {
    if (auto y = fused(x, mask, cache, window)) return *y;
    mx::array r = self_attn(input_layernorm(x), mask, cache);
    mx::array h = clip_residual(x, post_attention_layernorm(r));
    r = mlp(pre_feedforward_layernorm(h));
    return clip_residual(h, post_feedforward_layernorm(r));
  }

 private:
  // Tier L3: the layer as one CPU primitive over a plain KVCache (a causal or no mask, or the
  // window's) or a RotatingKVCache of the window (keep 0), as two around MLX's attention over
  // other caches (quantized) and batched rows; nullopt when a part has no fused form (LoRA
  // adapters, a RoPE frequency table).
  std::optional<mx::array> fused(const mx::array& x, const Mask& mask, KVCacheBase& cache,
                                 int window) const {
    namespace cpu = kernels::cpu;
    const Attention& a = self_attn;
    const nn::RoPE& r = a.rope;
    for (const nn::Linear* l :
         {&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj, &mlp.gate_proj, &mlp.up_proj, &mlp.down_proj})
      if (!l->cpu_kernel || !l->adapters.empty() || l->routed.active() || l->bias || l->all_reduce)
        return std::nullopt;
    if (!r.base || r.freqs || r.dynamic || r.mscale != 1.0f || x.ndim() != 3) return std::nullopt;
    auto q = [](const nn::Linear& l) {
      return cpu::QLinear{l.weight,      *l.scales,   *l.biases, l.quant->group_size,
                          l.quant->bits, std::nullopt};
    };
    const cpu::DecoderLayerWeights w{
        input_layernorm.weight,
        q(a.q_proj),
        q(a.k_proj),
        q(a.v_proj),
        cpu::QkNorm{a.q_norm.weight, a.k_norm.weight},
        q(a.o_proj),
        pre_feedforward_layernorm.weight,
        q(mlp.gate_proj),
        q(mlp.up_proj),
        q(mlp.down_proj),
        cpu::SandwichNorms{post_attention_layernorm.weight, post_feedforward_layernorm.weight}};
    const cpu::DecoderLayerSpec spec{{a.n_heads,
                                      a.n_kv_heads,
                                      a.head_dim,
                                      input_layernorm.eps,
                                      {r.dims, r.traditional, *r.base, r.scale},
                                      a.q_norm.eps},
                                     a.scale,
                                     pre_feedforward_layernorm.eps,
                                     cpu::Activation::gelu_approx};
    const int B = x.shape(0), L = x.shape(1), H = a.n_kv_heads, hd = a.head_dim;
    // float32 activations keep K and V as float16, as the llama family's fused layer does.
    const mx::Dtype kv_dtype = x.dtype() == mx::float32 ? mx::float16 : x.dtype();
    auto* kv = dynamic_cast<KVCache*>(&cache);
    // A global layer's mask is causal or none; a sliding layer's is the window's.
    if (kv && (window || mask.none() || (!mask.array && mask.mode == "causal"))) {
      const int offset = kv->offset();
      auto buf = kv->reserve(B, H, hd, hd, kv_dtype, L);
      cpu::KvSlots slots;
      if (window) slots = {offset, offset + L, window};
      auto out = cpu::decoder_layer(x, buf.keys, buf.values, offset, w, spec, buf.in_place, slots);
      kv->commit(out[1], out[2], L);
      return out[0];
    }
    auto* ring = dynamic_cast<RotatingKVCache*>(&cache);
    if (ring && window && ring->max_size() == window && ring->keep() == 0) {
      const int offset = ring->offset();
      auto s = ring->ring_reserve(B, H, L, {{hd, kv_dtype}, {hd, kv_dtype}});
      auto out = cpu::decoder_layer(x, s.parts[0], s.parts[1], offset, w, spec, s.in_place,
                                    {s.pos, s.rows, window});
      ring->ring_commit({out[1], out[2]}, L);
      return out[0];
    }
    // Other caches (quantized, plain or rotating) and batched rows (each at its own position):
    // the two fused halves around the cache's own attention, with the mask as given.
    auto qkv = cpu::norm_qkv_rope(x, w.input_norm, w.q, w.k, w.v, spec.qkv, rope_offsets(cache),
                                  w.qk_norm);
    mx::array attn =
        nn::merge_heads(nn::cached_attention(qkv[0], qkv[1], qkv[2], cache, a.scale, mask));
    return cpu::out_proj_mlp(x, attn, w.o, w.post_norm, spec.mlp_norm_eps, w.gate, w.up, w.down,
                             spec.act, w.sandwich);
  }
};

class Gemma3Text : public Model {
 public:
  Gemma3Text(Args a, WeightStore& w, const std::string& prefix, const std::string& source)
      : args_(std::move(a)),
        embed_tokens_(nn::Embedding::load(w, prefix + "model.embed_tokens", args_.vocab_size,
                                          args_.hidden_size)),
        norm_(RMSNorm::load(w, prefix + "model.norm", args_.hidden_size, args_.rms_norm_eps)) {
    for (int i = 0; i < args_.num_hidden_layers; ++i)
      layers_.emplace_back(args_, i, w, prefix + "model.layers." + std::to_string(i), source);
    // gemma3_text.sanitize: no lm_head.weight means tied to the embedding.
    if (w.has(prefix + "lm_head.weight"))
      lm_head_ =
          nn::Linear::load(w, prefix + "lm_head", args_.hidden_size, args_.vocab_size, false);
  }

  mx::array hidden(const mx::array& tokens, Cache& cache) override {
    mx::array h = embed_tokens_(tokens);
    // The scale is rounded to bf16 first, whatever the activation dtype.
    const float embed_scale = static_cast<float>(std::sqrt(static_cast<double>(args_.hidden_size)));
    h = mx::multiply(h, mx::astype(mx::array(embed_scale, mx::bfloat16), h.dtype()));
    const int L = h.shape(1);
    const int pattern = args_.sliding_window_pattern;
    // One mask per layer type, from the first cache of that type (mlx-lm: cache[pattern - 1]
    // for global layers, cache[0] with the window for sliding ones).
    Mask global_mask, sliding_mask;
    if (pattern - 1 < static_cast<int>(cache.size()))
      global_mask = cache[pattern - 1]->make_mask(L);
    if (pattern > 1) sliding_mask = cache[0]->make_mask(L, args_.sliding_window);
    for (size_t i = 0; i < layers_.size(); ++i) {
      const bool global = is_global(args_, static_cast<int>(i));
      h = layers_[i](h, global ? global_mask : sliding_mask, *cache[i],
                     global ? 0 : args_.sliding_window);
      if (tap_) tap_->on_layer(static_cast<int>(i), h);
    }
    h = norm_(h);
    if (tap_) tap_->on_final(h);
    return h;
  }

  mx::array operator()(const mx::array& tokens, Cache& cache) override {
    mx::array h = hidden(tokens, cache);
    return lm_head_ ? (*lm_head_)(h) : embed_tokens_.as_linear(h);
  }

  Cache make_cache() const override {
    Cache c;
    for (int i = 0; i < args_.num_hidden_layers; ++i) {
      if (is_global(args_, i)) {
        c.push_back(std::make_unique<KVCache>());
      } else {
        c.push_back(std::make_unique<RotatingKVCache>(args_.sliding_window));
      }
    }
    return c;
  }

  int num_layers() const override { return static_cast<int>(layers_.size()); }

 private:
  Args args_;
  nn::Embedding embed_tokens_;
  std::vector<TransformerBlock> layers_;
  RMSNorm norm_;
  std::optional<nn::Linear> lm_head_;
};

std::unique_ptr<Model> build(const json& c, WeightStore& w) {
  return build_gemma3_text(c, w, "", "config.json");
}

// Nothing to sanitize: the presence of lm_head.weight decides tying at build time.
const ArchitectureRegistrar kGemma3Text("gemma3_text", {nullptr, build});

}  // namespace

std::unique_ptr<Model> build_gemma3_text(const json& text_config, WeightStore& weights,
                                         const std::string& prefix, const std::string& source) {
  return std::make_unique<Gemma3Text>(parse_args(text_config, source), weights, prefix, source);
}

}  // namespace lmx
