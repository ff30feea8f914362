// Starcoder2: mlx_lm/models/starcoder2.py. LayerNorms with bias, biases on q/k/v/o and on the
// MLP (c_fc, c_proj), exact-erf GELU (nn.gelu, whatever hidden_act says), head_dim = hidden /
// heads, plain RoPE (rope_scaling ignored), full attention everywhere (sliding_window ignored).
#include "nn/transformer.h"

namespace lmx {
namespace {

constexpr const char* kSource = "config.json";

struct Args {
  nn::AttentionOptions attention;
  int num_hidden_layers = 0, intermediate_size = 0, vocab_size = 49152;
  float norm_epsilon = 1e-5f;
  bool tie_word_embeddings = true;
};

// starcoder2.ModelArgs, with its defaults.
Args parse_args(const json& c) {
  JsonView v{c, kSource};
  Args a;
  auto& at = a.attention;
  at.hidden_size = v.get<int>("hidden_size");
  a.num_hidden_layers = v.get<int>("num_hidden_layers");
  a.intermediate_size = v.get<int>("intermediate_size");
  at.n_heads = v.get<int>("num_attention_heads");
  at.n_kv_heads = v.get<int>("num_key_value_heads");
  a.norm_epsilon = v.get<float>("norm_epsilon", 1e-5f);
  a.vocab_size = v.get<int>("vocab_size", 49152);
  a.tie_word_embeddings = v.get<bool>("tie_word_embeddings", true);
  check(at.n_heads > 0 && at.n_kv_heads > 0 && at.n_heads % at.n_kv_heads == 0, kSource,
        "num_attention_heads ", at.n_heads, " is not a multiple of num_key_value_heads ",
        at.n_kv_heads);
  at.head_dim = at.hidden_size / at.n_heads;
  at.qkv_bias = at.o_bias = true;
  at.rope = nn::make_rope(at.head_dim, v.get<float>("rope_theta", 100000.0f), false, json(),
                          std::nullopt, kSource);
  return a;
}

struct MLP {
  nn::Linear c_fc, c_proj;
  mx::array operator()(const mx::array& x) const { return c_proj(nn::gelu(c_fc(x))); }
};

struct TransformerBlock {
  nn::Attention self_attn;
  MLP mlp;
  nn::LayerNorm input_layernorm, post_attention_layernorm;

  TransformerBlock(const Args& a, WeightStore& w, const std::string& p)
      : self_attn(a.attention, w, p + ".self_attn"),
        mlp{nn::Linear::load(w, p + ".mlp.c_fc", a.attention.hidden_size, a.intermediate_size,
                             true),
            nn::Linear::load(w, p + ".mlp.c_proj", a.intermediate_size, a.attention.hidden_size,
                             true)},
        input_layernorm(nn::LayerNorm::load(w, p + ".input_layernorm", a.attention.hidden_size,
                                            a.norm_epsilon)),
        post_attention_layernorm(nn::LayerNorm::load(w, p + ".post_attention_layernorm",
                                                     a.attention.hidden_size, a.norm_epsilon)) {}

  mx::array operator()(const mx::array& x, const Mask& mask, KVCacheBase& cache) const {
    mx::array h = mx::add(x, self_attn(input_layernorm(x), mask, cache));
    return mx::add(h, mlp(post_attention_layernorm(h)));
  }
};

class Starcoder2 : public Model {
 public:
  Starcoder2(const Args& a, WeightStore& w)
      : embed_tokens_(
            nn::Embedding::load(w, "model.embed_tokens", a.vocab_size, a.attention.hidden_size)),
        norm_(nn::LayerNorm::load(w, "model.norm", a.attention.hidden_size, a.norm_epsilon)) {
    for (int i = 0; i < a.num_hidden_layers; ++i)
      layers_.emplace_back(a, w, "model.layers." + std::to_string(i));
    if (!a.tie_word_embeddings)
      lm_head_ = nn::Linear::load(w, "lm_head", a.attention.hidden_size, a.vocab_size, false);
  }

  mx::array hidden(const mx::array& tokens, Cache& cache) override {
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

  mx::array operator()(const mx::array& tokens, Cache& cache) override {
    mx::array h = hidden(tokens, cache);
    return lm_head_ ? (*lm_head_)(h) : embed_tokens_.as_linear(h);
  }

  int num_layers() const override { return static_cast<int>(layers_.size()); }

 private:
  nn::Embedding embed_tokens_;
  std::vector<TransformerBlock> layers_;
  nn::LayerNorm norm_;
  std::optional<nn::Linear> lm_head_;
};

std::unique_ptr<Model> build(const json& c, WeightStore& w) {
  return std::make_unique<Starcoder2>(parse_args(c), w);
}

// No sanitize, as in mlx-lm: a tied config with an lm_head.weight tensor is an error.
const ArchitectureRegistrar kStarcoder2("starcoder2", {nullptr, build});

}  // namespace
}  // namespace lmx
