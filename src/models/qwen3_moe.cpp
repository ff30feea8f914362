// Qwen3-MoE (`qwen3_moe`, e.g. Qwen3-30B-A3B): mlx_lm/models/qwen3_moe.py. Qwen3's attention
// (per-head q/k norms, plain RoPE: rope_scaling is ignored, as in mlx-lm) with a sparse MoE MLP on
// layer i unless i is in mlp_only_layers or (i + 1) % decoder_sparse_step != 0: a softmax router
// (gate) picks num_experts_per_tok of num_experts SwiGLU experts (switch_mlp, nn::SwitchGLU),
// their outputs summed with the router's probabilities (renormalized when norm_topk_prob).
#include <algorithm>

#include "nn/switch_layers.h"
#include "nn/transformer.h"

namespace lmx {
namespace {

constexpr const char* kSource = "config.json";

struct Args {
  nn::AttentionOptions attention;
  int num_hidden_layers = 0, intermediate_size = 0, vocab_size = 0;
  int num_experts = 0, num_experts_per_tok = 0, decoder_sparse_step = 1, moe_intermediate_size = 0;
  std::vector<int> mlp_only_layers;
  float rms_norm_eps = 1e-6f;
  bool tie_word_embeddings = false, norm_topk_prob = false;

  bool is_moe(int layer) const {
    return std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) ==
               mlp_only_layers.end() &&
           num_experts > 0 && (layer + 1) % decoder_sparse_step == 0;
  }
};

// qwen3_moe.ModelArgs: every key but rope_scaling is required.
Args parse_args(const json& c) {
  JsonView v{c, kSource};
  nn::DecoderOptions d = nn::parse_decoder_keys(v, /*kv_heads_required=*/true);
  Args a;
  a.attention = d.attention;
  a.num_hidden_layers = d.num_hidden_layers;
  a.intermediate_size = d.intermediate_size;
  a.vocab_size = d.vocab_size;
  a.rms_norm_eps = d.rms_norm_eps;
  a.num_experts = v.get<int>("num_experts");
  a.num_experts_per_tok = v.get<int>("num_experts_per_tok");
  a.decoder_sparse_step = v.get<int>("decoder_sparse_step");
  a.mlp_only_layers = v.get<std::vector<int>>("mlp_only_layers");
  a.moe_intermediate_size = v.get<int>("moe_intermediate_size");
  a.tie_word_embeddings = v.get<bool>("tie_word_embeddings");
  a.norm_topk_prob = v.get<bool>("norm_topk_prob");
  (void)v.get<int>("max_position_embeddings");
  check(a.decoder_sparse_step > 0, kSource, "decoder_sparse_step must be > 0, got ",
        a.decoder_sparse_step);
  check(a.num_experts == 0 || (a.num_experts_per_tok > 0 && a.num_experts_per_tok <= a.num_experts),
        kSource, "num_experts_per_tok must be in [1, num_experts = ", a.num_experts, "], got ",
        a.num_experts_per_tok);
  auto& at = a.attention;
  at.head_dim = v.get<int>("head_dim");
  at.qk_norm_eps = a.rms_norm_eps;
  at.rope =
      nn::make_rope(at.head_dim, v.get<float>("rope_theta"), false, json(), std::nullopt, kSource);
  return a;
}

struct SparseMoeBlock {
  int top_k;
  bool norm_topk_prob;
  nn::Linear gate;
  nn::SwitchGLU switch_mlp;

  mx::array operator()(const mx::array& x) const {
    mx::array gates = mx::softmax(gate(x), -1, /*precise=*/true);
    mx::array inds = nn::top_k_experts(gates, top_k);
    mx::array scores = mx::take_along_axis(gates, inds, -1);
    if (norm_topk_prob) scores = mx::divide(scores, mx::sum(scores, -1, /*keepdims=*/true));
    mx::array y = switch_mlp(x, inds);
    return mx::astype(mx::sum(mx::multiply(y, mx::expand_dims(scores, -1)), -2), y.dtype());
  }
};

struct DecoderLayer {
  nn::Attention self_attn;
  nn::RMSNorm input_layernorm, post_attention_layernorm;
  std::optional<SparseMoeBlock> moe;  // mlp.gate + mlp.switch_mlp
  std::optional<nn::SwiGLUMLP> mlp;   // the dense layers' mlp

  DecoderLayer(const Args& a, int layer, WeightStore& w, const std::string& p)
      : self_attn(a.attention, w, p + ".self_attn"),
        input_layernorm(
            nn::RMSNorm::load(w, p + ".input_layernorm", a.attention.hidden_size, a.rms_norm_eps)),
        post_attention_layernorm(nn::RMSNorm::load(w, p + ".post_attention_layernorm",
                                                   a.attention.hidden_size, a.rms_norm_eps)) {
    const int H = a.attention.hidden_size;
    if (a.is_moe(layer)) {
      moe = SparseMoeBlock{a.num_experts_per_tok, a.norm_topk_prob,
                           nn::Linear::load(w, p + ".mlp.gate", H, a.num_experts, false),
                           nn::SwitchGLU::load(w, p + ".mlp.switch_mlp", H, a.moe_intermediate_size,
                                               a.num_experts, false)};
    } else {
      mlp = nn::SwiGLUMLP::load(w, p + ".mlp", H, a.intermediate_size, false);
    }
  }

  mx::array operator()(const mx::array& x, const Mask& mask, KVCacheBase& cache) const {
    mx::array h = mx::add(x, self_attn(input_layernorm(x), mask, cache));
    mx::array n = post_attention_layernorm(h);
    return mx::add(h, moe ? (*moe)(n) : (*mlp)(n));
  }
};

class Qwen3Moe : public Model {
 public:
  Qwen3Moe(const Args& a, WeightStore& w)
      : embed_tokens_(
            nn::Embedding::load(w, "model.embed_tokens", a.vocab_size, a.attention.hidden_size)),
        norm_(nn::RMSNorm::load(w, "model.norm", a.attention.hidden_size, a.rms_norm_eps)) {
    for (int i = 0; i < a.num_hidden_layers; ++i)
      layers_.emplace_back(a, i, w, "model.layers." + std::to_string(i));
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
  std::vector<DecoderLayer> layers_;
  nn::RMSNorm norm_;
  std::optional<nn::Linear> lm_head_;
};

// qwen3_moe.sanitize: a tied head drops lm_head.weight; Hugging Face's per-expert
// mlp.experts.<e>.<proj>.weight (out, in) are stacked into mlp.switch_mlp.<proj>.weight
// (experts, out, in).
void sanitize(const json& c, Weights& w) {
  JsonView v{c, kSource};
  if (v.get<bool>("tie_word_embeddings")) w.erase("lm_head.weight");
  const std::string suffix = ".mlp.experts.0.up_proj.weight";
  std::vector<std::string> prefixes;
  for (const auto& [k, t] : w) {
    if (k.rfind("model.layers.", 0) == 0 && k.size() > suffix.size() &&
        k.compare(k.size() - suffix.size(), suffix.size(), suffix) == 0)
      prefixes.push_back(k.substr(0, k.size() - suffix.size()));
  }
  if (prefixes.empty()) return;
  const int experts = v.get<int>("num_experts");
  for (const auto& prefix : prefixes) {
    for (const char* proj : {"up_proj", "down_proj", "gate_proj"}) {
      std::vector<mx::array> parts;
      for (int e = 0; e < experts; ++e) {
        const std::string key =
            prefix + ".mlp.experts." + std::to_string(e) + "." + proj + ".weight";
        auto it = w.find(key);
        check(it != w.end(), kSource, "missing tensor '", key, "' of a MoE layer with ", experts,
              " experts");
        parts.push_back(it->second);
        w.erase(it);
      }
      w.insert_or_assign(prefix + ".mlp.switch_mlp." + proj + ".weight", mx::stack(parts));
    }
  }
}

std::unique_ptr<Model> build(const json& c, WeightStore& w) {
  return std::make_unique<Qwen3Moe>(parse_args(c), w);
}

const ArchitectureRegistrar kQwen3Moe("qwen3_moe", {sanitize, build});

}  // namespace
}  // namespace lmx
