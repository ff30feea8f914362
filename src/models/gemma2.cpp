// Gemma 2 (`gemma2`): mlx_lm/models/gemma2.py. (1 + w) RMSNorms before and after both sublayers,
// embeddings times sqrt(hidden_size), attention scaled by query_pre_attn_scalar^-0.5 with its
// scores soft-capped (tanh(s / cap) * cap) before an explicit masked softmax, gelu_approx MLP,
// a tied head soft-capped at final_logit_softcapping. mlx-lm's gemma2 has no sliding-window
// layers: every layer attends to the whole context (KVCache), and its attention has no
// quantized-cache path, so neither has lmx's.
#include <cmath>

#include "nn/transformer.h"

namespace lmx {
namespace {

constexpr const char* kSource = "config.json";

struct Args {
  int hidden_size, num_hidden_layers, intermediate_size, num_attention_heads, head_dim;
  float rms_norm_eps;
  int vocab_size, num_key_value_heads;
  float rope_theta;
  bool rope_traditional;
  double attn_logit_softcapping, final_logit_softcapping, query_pre_attn_scalar;
};

// gemma2.ModelArgs, with its defaults.
Args parse_args(const json& c) {
  JsonView v{c, kSource};
  Args a;
  a.hidden_size = v.get<int>("hidden_size");
  a.num_hidden_layers = v.get<int>("num_hidden_layers");
  a.intermediate_size = v.get<int>("intermediate_size");
  a.num_attention_heads = v.get<int>("num_attention_heads");
  a.head_dim = v.get<int>("head_dim");
  a.rms_norm_eps = v.get<float>("rms_norm_eps");
  a.vocab_size = v.get<int>("vocab_size");
  a.num_key_value_heads = v.get<int>("num_key_value_heads");
  a.rope_theta = v.get<float>("rope_theta", 10000.0f);
  a.rope_traditional = v.get<bool>("rope_traditional", false);
  a.attn_logit_softcapping = v.get<double>("attn_logit_softcapping", 50.0);
  a.final_logit_softcapping = v.get<double>("final_logit_softcapping", 30.0);
  a.query_pre_attn_scalar = v.get<double>("query_pre_attn_scalar", 144.0);
  check(a.num_attention_heads > 0 && a.num_key_value_heads > 0 &&
            a.num_attention_heads % a.num_key_value_heads == 0,
        kSource, "num_attention_heads ", a.num_attention_heads,
        " is not a multiple of num_key_value_heads ", a.num_key_value_heads);
  return a;
}

// Gemma's RMSNorm: rms_norm(x, 1.0 + w), 1 + w in the weight's dtype (computed once, same bits).
struct RMSNorm {
  mx::array weight;
  float eps;

  static RMSNorm load(WeightStore& w, const std::string& path, int dims, float eps) {
    mx::array weight = w.take(path + ".weight", {dims});
    return {mx::add(mx::array(1.0f, weight.dtype()), weight), eps};
  }
  mx::array operator()(const mx::array& x) const { return mx::fast::rms_norm(x, weight, eps); }
};

// tanh(x / cap) * cap, the caps weak scalars.
mx::array softcap(const mx::array& x, double cap) {
  return mx::multiply(mx::tanh(mx::divide(x, nn::weak_scalar(cap, x))), nn::weak_scalar(cap, x));
}

struct Attention {
  int n_heads, n_kv_heads, repeats, head_dim;
  double scale, attn_logit_softcapping;
  nn::Linear q_proj, k_proj, v_proj, o_proj;
  nn::RoPE rope;

  Attention(const Args& a, WeightStore& w, const std::string& p)
      : n_heads(a.num_attention_heads),
        n_kv_heads(a.num_key_value_heads),
        repeats(n_heads / n_kv_heads),
        head_dim(a.head_dim),
        scale(1.0 / std::pow(a.query_pre_attn_scalar, 0.5)),
        attn_logit_softcapping(a.attn_logit_softcapping),
        q_proj(nn::Linear::load(w, p + ".q_proj", a.hidden_size, n_heads * head_dim, false)),
        k_proj(nn::Linear::load(w, p + ".k_proj", a.hidden_size, n_kv_heads * head_dim, false)),
        v_proj(nn::Linear::load(w, p + ".v_proj", a.hidden_size, n_kv_heads * head_dim, false)),
        o_proj(nn::Linear::load(w, p + ".o_proj", n_heads * head_dim, a.hidden_size, false)),
        rope(nn::make_rope(head_dim, a.rope_theta, a.rope_traditional, json(), std::nullopt,
                           kSource)) {}

  mx::array operator()(const mx::array& x, const Mask& mask, KVCacheBase& cache) const {
    check(!cache.quantization(), "gemma2",
          "quantized KV caches are not supported (mlx-lm's gemma2 attention has none), "
          "expected no --kv-bits / kv_config.json");
    const int B = x.shape(0), L = x.shape(1);
    mx::array queries = nn::split_heads(q_proj(x), n_heads);
    mx::array keys = nn::split_heads(k_proj(x), n_kv_heads);
    mx::array values = nn::split_heads(v_proj(x), n_kv_heads);
    queries = rope(queries, cache.offset());
    keys = rope(keys, cache.offset());
    std::tie(keys, values) = cache.update_and_fetch(keys, values);
    queries = mx::multiply(queries, nn::weak_scalar(scale, queries));
    if (repeats > 1) {
      queries = mx::reshape(queries, {B, n_kv_heads, repeats, L, head_dim});
      keys = mx::expand_dims(keys, 2);
      values = mx::expand_dims(values, 2);
    }
    mx::array scores =
        softcap(mx::matmul(queries, mx::swapaxes(keys, -1, -2)), attn_logit_softcapping);
    if (mask.array) {
      if (mask.array->dtype() == mx::bool_) {
        const double lowest = mx::finfo(scores.dtype()).min;
        scores =
            mx::where(*mask.array, scores, mx::array(static_cast<float>(lowest), scores.dtype()));
      } else {
        scores = mx::add(scores, *mask.array);
      }
    }
    scores = mx::softmax(scores, -1, /*precise=*/true);
    mx::array output = mx::matmul(scores, values);
    if (repeats > 1) output = mx::reshape(output, {B, n_heads, L, head_dim});
    return o_proj(nn::merge_heads(output));
  }
};

struct MLP {
  nn::Linear gate_proj, down_proj, up_proj;
  mx::array operator()(const mx::array& x) const {
    return down_proj(mx::multiply(nn::gelu_approx(gate_proj(x)), up_proj(x)));
  }
};

struct TransformerBlock {
  Attention self_attn;
  MLP mlp;
  RMSNorm input_layernorm, pre_feedforward_layernorm, post_feedforward_layernorm,
      post_attention_layernorm;

  TransformerBlock(const Args& a, WeightStore& w, const std::string& p)
      : self_attn(a, w, p + ".self_attn"),
        mlp{nn::Linear::load(w, p + ".mlp.gate_proj", a.hidden_size, a.intermediate_size, false),
            nn::Linear::load(w, p + ".mlp.down_proj", a.intermediate_size, a.hidden_size, false),
            nn::Linear::load(w, p + ".mlp.up_proj", a.hidden_size, a.intermediate_size, false)},
        input_layernorm(RMSNorm::load(w, p + ".input_layernorm", a.hidden_size, a.rms_norm_eps)),
        pre_feedforward_layernorm(
            RMSNorm::load(w, p + ".pre_feedforward_layernorm", a.hidden_size, a.rms_norm_eps)),
        post_feedforward_layernorm(
            RMSNorm::load(w, p + ".post_feedforward_layernorm", a.hidden_size, a.rms_norm_eps)),
        post_attention_layernorm(
            RMSNorm::load(w, p + ".post_attention_layernorm", a.hidden_size, a.rms_norm_eps)) {}

  mx::array operator()(const mx::array& x, const Mask& mask, KVCacheBase& cache) const {
    mx::array r = self_attn(input_layernorm(x), mask, cache);
    mx::array h = mx::add(x, post_attention_layernorm(r));
    r = mlp(pre_feedforward_layernorm(h));
    return mx::add(h, post_feedforward_layernorm(r));
  }
};

class Gemma2 : public Model {
 public:
  Gemma2(const Args& a, WeightStore& w)
      : args_(a),
        embed_tokens_(
            nn::Embedding::load(w, "model.embed_tokens", args_.vocab_size, args_.hidden_size)),
        norm_(RMSNorm::load(w, "model.norm", args_.hidden_size, args_.rms_norm_eps)) {
    for (int i = 0; i < args_.num_hidden_layers; ++i)
      layers_.emplace_back(args_, w, "model.layers." + std::to_string(i));
  }

  mx::array hidden(const mx::array& tokens, Cache& cache) override {
    mx::array h = embed_tokens_(tokens);
    h = mx::multiply(h, nn::weak_scalar(std::pow(args_.hidden_size, 0.5), h));
    // The explicit softmax needs the mask as an array (none for a single token).
    const Mask mask = cache[0]->make_mask(h.shape(1), std::nullopt, /*return_array=*/true);
    for (size_t i = 0; i < layers_.size(); ++i) {
      h = layers_[i](h, mask, *cache[i]);
      if (tap_) tap_->on_layer(static_cast<int>(i), h);
    }
    h = norm_(h);
    if (tap_) tap_->on_final(h);
    return h;
  }

  mx::array operator()(const mx::array& tokens, Cache& cache) override {
    return softcap(embed_tokens_.as_linear(hidden(tokens, cache)), args_.final_logit_softcapping);
  }

  int num_layers() const override { return static_cast<int>(layers_.size()); }
  // Its attention reads the raw cached keys (soft-capped scores): rows step one at a time.
  bool batches_rows() const override { return false; }

 private:
  Args args_;
  nn::Embedding embed_tokens_;
  std::vector<TransformerBlock> layers_;
  RMSNorm norm_;
};

std::unique_ptr<Model> build(const json& c, WeightStore& w) {
  return std::make_unique<Gemma2>(parse_args(c), w);
}

// No sanitize, as in mlx-lm: the head is always the embedding.
const ArchitectureRegistrar kGemma2("gemma2", {nullptr, build});

}  // namespace
}  // namespace lmx
