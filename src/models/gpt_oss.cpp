// gpt-oss (`gpt_oss`, openai/gpt-oss-20b and -120b): mlx_lm/models/gpt_oss.py. Every layer is
// attention with q/k/v/o biases and per-head attention sinks (sinks, an extra logit in each
// softmax row), layers alternating between a sliding window (layer_types "sliding_attention", a
// RotatingKVCache of sliding_window) and full attention, then a MoE MLP: a biased router picks
// num_experts_per_tok of num_local_experts experts (top-k on the logits, softmax over the k),
// each a SwitchGLU with biases and the clamped "OAI" SwiGLU
// (up, gate) -> (clip(up, -7, 7) + 1) * g * sigmoid(1.702 g), g = min(gate, 7).
// RoPE as config.json's rope_scaling says (yarn on the released models); the head is untied.
#include <algorithm>
#include <cmath>

#include "cache/rotating_kv_cache.h"
#include "nn/switch_layers.h"
#include "nn/transformer.h"

namespace lmx {
namespace {

constexpr const char* kSource = "config.json";

struct Args {
  int hidden_size = 0, num_hidden_layers = 0, intermediate_size = 0, vocab_size = 0;
  int num_attention_heads = 0, num_key_value_heads = 0, head_dim = 0;
  int num_local_experts = 0, num_experts_per_tok = 0, sliding_window = 0;
  float rms_norm_eps = 1e-5f;
  std::vector<bool> sliding;  // per layer
  nn::RoPE rope;
};

// gpt_oss.ModelArgs: every key but rope_scaling and layer_types is required (mlx-lm's defaults
// are the 120b model's sizes, which a small config missing a key would silently take).
// layer_types defaults to sliding/full pairs, as mlx-lm's does.
Args parse_args(const json& c) {
  JsonView v{c, kSource};
  Args a;
  a.hidden_size = v.get<int>("hidden_size");
  a.num_hidden_layers = v.get<int>("num_hidden_layers");
  a.intermediate_size = v.get<int>("intermediate_size");
  a.vocab_size = v.get<int>("vocab_size");
  a.num_attention_heads = v.get<int>("num_attention_heads");
  a.num_key_value_heads = v.get<int>("num_key_value_heads");
  a.head_dim = v.get<int>("head_dim");
  a.num_local_experts = v.get<int>("num_local_experts");
  a.num_experts_per_tok = v.get<int>("num_experts_per_tok");
  a.sliding_window = v.get<int>("sliding_window");
  a.rms_norm_eps = v.get<float>("rms_norm_eps");
  const float rope_theta = v.get<float>("rope_theta");
  check(a.num_hidden_layers > 0, kSource, "num_hidden_layers must be > 0, got ",
        a.num_hidden_layers);
  check(a.num_attention_heads > 0 && a.num_key_value_heads > 0 &&
            a.num_attention_heads % a.num_key_value_heads == 0,
        kSource, "num_attention_heads ", a.num_attention_heads,
        " is not a multiple of num_key_value_heads ", a.num_key_value_heads);
  check(a.head_dim > 0, kSource, "head_dim must be > 0, got ", a.head_dim);
  check(a.num_local_experts > 0 && a.num_experts_per_tok > 0 &&
            a.num_experts_per_tok <= a.num_local_experts,
        kSource, "num_experts_per_tok must be in [1, num_local_experts = ", a.num_local_experts,
        "], got ", a.num_experts_per_tok);
  check(a.sliding_window > 0, kSource, "sliding_window must be > 0, got ", a.sliding_window);
  if (v.has("layer_types")) {
    const json& types = c.at("layer_types");
    check(types.is_array() && static_cast<int>(types.size()) == a.num_hidden_layers, kSource,
          "layer_types must list num_hidden_layers (", a.num_hidden_layers, ") entries, got ",
          types.dump());
    for (size_t i = 0; i < types.size(); ++i) {
      const json& t = types[i];
      check(t == "full_attention" || t == "sliding_attention", kSource, "layer_types[", i, "] is ",
            t.dump(), ", expected \"full_attention\" or \"sliding_attention\"");
      a.sliding.push_back(t == "sliding_attention");
    }
  } else {
    check(a.num_hidden_layers % 2 == 0, kSource,
          "missing key 'layer_types' needs an even num_hidden_layers (sliding/full pairs), got ",
          a.num_hidden_layers);
    for (int i = 0; i < a.num_hidden_layers; ++i) a.sliding.push_back(i % 2 == 0);
  }
  // mlx-lm takes the first layer of each kind for its masks.
  const bool any_sliding = std::count(a.sliding.begin(), a.sliding.end(), true) > 0;
  const bool any_full = std::count(a.sliding.begin(), a.sliding.end(), false) > 0;
  check(any_sliding && any_full, kSource,
        "layer_types must have both a \"sliding_attention\" and a \"full_attention\" layer, got ",
        c.contains("layer_types") ? c.at("layer_types").dump() : std::string("the default"));
  a.rope = nn::make_rope(a.head_dim, rope_theta, false,
                         c.contains("rope_scaling") ? c.at("rope_scaling") : json(), std::nullopt,
                         kSource);
  return a;
}

// AttentionBlock: q/k/v/o with biases, RoPE at the cache offset, mx.fast attention with sinks.
struct AttentionBlock {
  int n_heads, n_kv_heads;
  float scale;
  nn::RoPE rope;
  nn::Linear q_proj, k_proj, v_proj, o_proj;
  mx::array sinks;

  AttentionBlock(const Args& a, WeightStore& w, const std::string& p)
      : n_heads(a.num_attention_heads),
        n_kv_heads(a.num_key_value_heads),
        scale(static_cast<float>(1.0 / std::sqrt(static_cast<double>(a.head_dim)))),
        rope(a.rope),
        q_proj(nn::Linear::load(w, p + ".q_proj", a.hidden_size, n_heads * a.head_dim, true)),
        k_proj(nn::Linear::load(w, p + ".k_proj", a.hidden_size, n_kv_heads * a.head_dim, true)),
        v_proj(nn::Linear::load(w, p + ".v_proj", a.hidden_size, n_kv_heads * a.head_dim, true)),
        o_proj(nn::Linear::load(w, p + ".o_proj", n_heads * a.head_dim, a.hidden_size, true)),
        sinks(w.take(p + ".sinks", {n_heads})) {}

  mx::array operator()(const mx::array& x, const Mask& mask, KVCacheBase& cache) const {
    mx::array q = rope(nn::split_heads(q_proj(x), n_heads), cache);
    mx::array k = rope(nn::split_heads(k_proj(x), n_kv_heads), cache);
    mx::array v = nn::split_heads(v_proj(x), n_kv_heads);
    return o_proj(nn::merge_heads(nn::cached_attention(q, k, v, cache, scale, mask, sinks)));
  }
};

// activations.swiglu_oai (alpha 1.702, limit 7), compiled shapeless as mlx-lm compiles it; the
// constants are weak scalars (rounded to the activations' dtype).
mx::array swiglu_oai(const mx::array& gate, const mx::array& x) {
  static auto fn = mx::compile(
      [](const std::vector<mx::array>& in) {
        const mx::array &g_in = in[0], &x_in = in[1];
        auto c = [](double v, const mx::array& like) {
          return mx::array(static_cast<float>(v), like.dtype());
        };
        mx::array g = mx::minimum(g_in, c(7.0, g_in));
        mx::array u = mx::clip(x_in, c(-7.0, x_in), c(7.0, x_in));
        mx::array glu = mx::multiply(g, mx::sigmoid(mx::multiply(c(1.702, g), g)));
        return std::vector<mx::array>{mx::multiply(mx::add(u, c(1.0, u)), glu)};
      },
      /*shapeless=*/true);
  return fn({gate, x})[0];
}

// MLPBlock: router logits -> top-k (argpartition(g, kth=-k)[..., -k:]) -> softmax over the k
// (precise) -> experts weighted and summed.
struct MLPBlock {
  int top_k;
  nn::Linear router;
  nn::SwitchGLU experts;

  mx::array operator()(const mx::array& x) const {
    mx::array g = router(x);
    mx::array inds = nn::top_k_experts(g, top_k);
    mx::array weights = mx::softmax(mx::take_along_axis(g, inds, -1), -1, /*precise=*/true);
    mx::array y = experts(x, inds);
    return mx::sum(mx::multiply(y, mx::expand_dims(weights, -1)), -2);
  }
};

struct TransformerBlock {
  AttentionBlock self_attn;
  MLPBlock mlp;
  nn::RMSNorm input_layernorm, post_attention_layernorm;

  TransformerBlock(const Args& a, WeightStore& w, const std::string& p)
      : self_attn(a, w, p + ".self_attn"),
        mlp{a.num_experts_per_tok,
            nn::Linear::load(w, p + ".mlp.router", a.hidden_size, a.num_local_experts, true),
            nn::SwitchGLU::load(w, p + ".mlp.experts", a.hidden_size, a.intermediate_size,
                                a.num_local_experts, true)},
        input_layernorm(
            nn::RMSNorm::load(w, p + ".input_layernorm", a.hidden_size, a.rms_norm_eps)),
        post_attention_layernorm(
            nn::RMSNorm::load(w, p + ".post_attention_layernorm", a.hidden_size, a.rms_norm_eps)) {
    mlp.experts.activation = [](const mx::array& x_up, const mx::array& x_gate) {
      return swiglu_oai(x_gate, x_up);
    };
  }

  mx::array operator()(const mx::array& x, const Mask& mask, KVCacheBase& cache) const {
    mx::array h = mx::add(x, self_attn(input_layernorm(x), mask, cache));
    return mx::add(h, mlp(post_attention_layernorm(h)));
  }
};

class GptOss : public Model {
 public:
  GptOss(const Args& a, WeightStore& w)
      : sliding_(a.sliding),
        window_(a.sliding_window),
        embed_tokens_(nn::Embedding::load(w, "model.embed_tokens", a.vocab_size, a.hidden_size)),
        norm_(nn::RMSNorm::load(w, "model.norm", a.hidden_size, a.rms_norm_eps)) {
    for (int i = 0; i < a.num_hidden_layers; ++i)
      layers_.emplace_back(a, w, "model.layers." + std::to_string(i));
    lm_head_ = nn::Linear::load(w, "lm_head", a.hidden_size, a.vocab_size, false);
  }

  mx::array embed(const mx::array& tokens) const override { return embed_tokens_(tokens); }
  mx::array head(const mx::array& h) const override { return (*lm_head_)(h); }

  mx::array hidden(const mx::array& tokens, Cache& cache) override {
    mx::array h = embed_tokens_(tokens);
    const int L = h.shape(1);
    // The causal mask from the first full layer's cache, the windowed one from the first
    // sliding layer's.
    const size_t full = std::find(sliding_.begin(), sliding_.end(), false) - sliding_.begin();
    const size_t swa = std::find(sliding_.begin(), sliding_.end(), true) - sliding_.begin();
    const Mask full_mask = cache[full]->make_mask(L);
    const Mask swa_mask = cache[swa]->make_mask(L, window_);
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Mask& m = sliding_[i] ? swa_mask : full_mask;
      if (layer_hook_) {
        h = layer_hook_(
            static_cast<int>(i), h,
            [this, i, m, c = cache[i].get()](const mx::array& x) { return layers_[i](x, m, *c); });
      } else {
        h = layers_[i](h, m, *cache[i]);
      }
      if (tap_) tap_->on_layer(static_cast<int>(i), h);
    }
    h = norm_(h);
    if (tap_) tap_->on_final(h);
    return h;
  }

  mx::array operator()(const mx::array& tokens, Cache& cache) override {
    return head(hidden(tokens, cache));
  }

  Cache make_cache() const override {
    Cache c;
    for (bool s : sliding_) {
      if (s) {
        c.push_back(std::make_unique<RotatingKVCache>(window_));
      } else {
        c.push_back(std::make_unique<KVCache>());
      }
    }
    return c;
  }

  int num_layers() const override { return static_cast<int>(layers_.size()); }
  bool supports_layer_hook() const override { return true; }

 private:
  std::vector<bool> sliding_;
  int window_;
  nn::Embedding embed_tokens_;
  std::vector<TransformerBlock> layers_;
  nn::RMSNorm norm_;
  std::optional<nn::Linear> lm_head_;
};

// v[..., start::2, :] over the second-to-last axis (the last one when `last_axis`), contiguous.
mx::array every_other(const mx::array& v, int start, bool last_axis) {
  const int axis = last_axis ? v.ndim() - 1 : v.ndim() - 2;
  mx::Shape lo(v.ndim(), 0), hi = v.shape(), strides(v.ndim(), 1);
  lo[axis] = start;
  strides[axis] = 2;
  return mx::contiguous(mx::slice(v, lo, hi, strides));
}

// gpt_oss.sanitize: a checkpoint in OpenAI's layout (mlp.experts.gate_up_proj with gate and up
// interleaved along the output rows, MXFP4 experts as uint8 `_blocks` (experts, out, in / 32, 16)
// and `_scales`, biases as `_bias`) becomes gate_proj / up_proj / down_proj SwitchLinear tensors
// (blocks viewed as uint32 and flattened: (experts, out, in / 8)). MLX checkpoints (any
// gate_proj.weight) pass through.
void sanitize(const json&, Weights& w) {
  for (const auto& [k, v] : w)
    if (k.find("gate_proj.weight") != std::string::npos) return;
  Weights out;
  auto packed = [](std::string k, mx::array v) {
    if (k.find("_blocks") != std::string::npos) {
      v = mx::flatten(mx::view(v, mx::uint32), -2, -1);
      k.replace(k.find("_blocks"), 7, ".weight");
    }
    if (k.find("_scales") != std::string::npos) k.replace(k.find("_scales"), 7, ".scales");
    return std::pair{k, v};
  };
  auto rename = [](std::string k, const std::string& from, const std::string& to) {
    return k.replace(k.find(from), from.size(), to);
  };
  for (const auto& [key, value] : w) {
    const bool is_bias = key.find("bias") != std::string::npos;
    if (key.find("gate_up_proj") != std::string::npos && !is_bias) {
      auto [k, v] = packed(key, value);
      out.insert_or_assign(rename(k, "gate_up_proj", "gate_proj"), every_other(v, 0, false));
      out.insert_or_assign(rename(k, "gate_up_proj", "up_proj"), every_other(v, 1, false));
    } else if (key.find("down_proj") != std::string::npos && !is_bias) {
      auto [k, v] = packed(key, value);
      out.insert_or_assign(k, v);
    } else if (key.find("gate_up_proj_bias") != std::string::npos) {
      out.insert_or_assign(rename(key, "gate_up_proj_bias", "gate_proj.bias"),
                           every_other(value, 0, true));
      out.insert_or_assign(rename(key, "gate_up_proj_bias", "up_proj.bias"),
                           every_other(value, 1, true));
    } else if (key.find("down_proj_bias") != std::string::npos) {
      out.insert_or_assign(rename(key, "down_proj_bias", "down_proj.bias"), value);
    } else {
      out.insert_or_assign(key, value);
    }
  }
  w = std::move(out);
}

std::unique_ptr<Model> build(const json& c, WeightStore& w) {
  return std::make_unique<GptOss>(parse_args(c), w);
}

const ArchitectureRegistrar kGptOss("gpt_oss", {sanitize, build});

}  // namespace
}  // namespace lmx
