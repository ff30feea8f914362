// Legacy MiniCPM (`minicpm`): mlx_lm/models/minicpm.py. A llama-shaped decoder with muP-style
// scalings: embeddings times scale_emb, each residual branch times scale_depth / sqrt(layers),
// and the untied head applied to h / (hidden_size / dim_model_base). head_dim = hidden / heads.
// (MiniCPM5 checkpoints are `llama` and load through llama.cpp, without any of these.)
#include <cmath>

#include "nn/transformer.h"

namespace lmx {
namespace {

constexpr const char* kSource = "config.json";

struct Args {
  nn::AttentionOptions attention;
  int num_hidden_layers = 0, intermediate_size = 0, vocab_size = 0;
  float rms_norm_eps = 1e-5f;
  double dim_model_base = 1, scale_depth = 1, scale_emb = 1;
  bool tie_word_embeddings = false;
};

// minicpm.ModelArgs, with its defaults.
Args parse_args(const json& c) {
  JsonView v{c, kSource};
  Args a;
  auto& at = a.attention;
  at.hidden_size = v.get<int>("hidden_size");
  a.dim_model_base = v.get<double>("dim_model_base");
  a.num_hidden_layers = v.get<int>("num_hidden_layers");
  a.intermediate_size = v.get<int>("intermediate_size");
  at.n_heads = v.get<int>("num_attention_heads");
  a.rms_norm_eps = v.get<float>("rms_norm_eps");
  a.vocab_size = v.get<int>("vocab_size");
  at.n_kv_heads = v.get<int>("num_key_value_heads");
  a.scale_depth = v.get<double>("scale_depth");
  a.scale_emb = v.get<double>("scale_emb");
  a.tie_word_embeddings = v.get<bool>("tie_word_embeddings", false);
  check(at.n_heads > 0 && at.n_kv_heads > 0 && at.n_heads % at.n_kv_heads == 0, kSource,
        "num_attention_heads ", at.n_heads, " is not a multiple of num_key_value_heads ",
        at.n_kv_heads);
  at.head_dim = at.hidden_size / at.n_heads;  // a head_dim key is ignored, as in mlx-lm
  at.rope = nn::make_rope(at.head_dim, v.get<float>("rope_theta", 1e6f),
                          v.get<bool>("rope_traditional", false),
                          v.has("rope_scaling") ? c["rope_scaling"] : json(),
                          v.get_opt<int>("max_position_embeddings"), kSource);
  return a;
}

// A Python float meeting an array of x's dtype (weak scalar).
mx::array weak(double value, const mx::array& x) {
  return mx::array(static_cast<float>(value), x.dtype());
}

struct DecoderLayer {
  nn::Attention self_attn;
  nn::SwiGLUMLP mlp;
  nn::RMSNorm input_layernorm, post_attention_layernorm;
  double residual_scale;  // scale_depth / num_hidden_layers**0.5

  DecoderLayer(const Args& a, WeightStore& w, const std::string& p)
      : self_attn(a.attention, w, p + ".self_attn"),
        mlp(nn::SwiGLUMLP::load(w, p + ".mlp", a.attention.hidden_size, a.intermediate_size,
                                false)),
        input_layernorm(
            nn::RMSNorm::load(w, p + ".input_layernorm", a.attention.hidden_size, a.rms_norm_eps)),
        post_attention_layernorm(nn::RMSNorm::load(w, p + ".post_attention_layernorm",
                                                   a.attention.hidden_size, a.rms_norm_eps)),
        residual_scale(a.scale_depth / std::pow(a.num_hidden_layers, 0.5)) {}

  mx::array operator()(const mx::array& x, const Mask& mask, KVCacheBase& cache) const {
    mx::array r = self_attn(input_layernorm(x), mask, cache);
    mx::array h = mx::add(x, mx::multiply(r, weak(residual_scale, r)));
    r = mlp(post_attention_layernorm(h));
    return mx::add(h, mx::multiply(r, weak(residual_scale, r)));
  }
};

class MiniCPM : public Model {
 public:
  MiniCPM(Args a, WeightStore& w)
      : args_(std::move(a)),
        embed_tokens_(nn::Embedding::load(w, "model.embed_tokens", args_.vocab_size,
                                          args_.attention.hidden_size)),
        norm_(nn::RMSNorm::load(w, "model.norm", args_.attention.hidden_size, args_.rms_norm_eps)) {
    for (int i = 0; i < args_.num_hidden_layers; ++i)
      layers_.emplace_back(args_, w, "model.layers." + std::to_string(i));
    if (!args_.tie_word_embeddings)
      lm_head_ =
          nn::Linear::load(w, "lm_head", args_.attention.hidden_size, args_.vocab_size, false);
  }

  mx::array hidden(const mx::array& tokens, Cache& cache) override {
    mx::array h = embed_tokens_(tokens);
    h = mx::multiply(h, weak(args_.scale_emb, h));
    const Mask mask = cache[0]->make_mask(h.shape(1));
    for (size_t i = 0; i < layers_.size(); ++i) {
      h = layers_[i](h, mask, *cache[i]);
      if (tap_) tap_->on_layer(static_cast<int>(i), h);
    }
    h = norm_(h);
    if (tap_) tap_->on_final(h);
    return h;
  }

  mx::array operator()(const mx::array& tokens, Cache& cache) override {
    mx::array h = hidden(tokens, cache);
    if (lm_head_) {
      const double width = args_.attention.hidden_size / args_.dim_model_base;
      return (*lm_head_)(mx::divide(h, weak(width, h)));
    }
    // mlx-lm's tied path: h @ embed_tokens.weight.T, without the dim_model_base division.
    return embed_tokens_.as_linear(h);
  }

  int num_layers() const override { return static_cast<int>(layers_.size()); }

 private:
  Args args_;
  nn::Embedding embed_tokens_;
  std::vector<DecoderLayer> layers_;
  nn::RMSNorm norm_;
  std::optional<nn::Linear> lm_head_;
};

// minicpm.sanitize: an untied checkpoint without lm_head.weight reuses the embedding. (mlx-lm also
// adds it for tied configs, whose model has no lm_head, so its strict load fails there; lmx loads
// them.)
void sanitize(const json& c, Weights& w) {
  if (JsonView{c, kSource}.get<bool>("tie_word_embeddings", false)) return;
  auto embed = w.find("model.embed_tokens.weight");
  if (!w.count("lm_head.weight") && embed != w.end())
    w.insert_or_assign("lm_head.weight", embed->second);
}

std::unique_ptr<Model> build(const json& c, WeightStore& w) {
  return std::make_unique<MiniCPM>(parse_args(c), w);
}

const ArchitectureRegistrar kMiniCPM("minicpm", {sanitize, build});

}  // namespace
}  // namespace lmx
