// Qwen3-Next (`qwen3_next`): mlx_lm/models/qwen3_next.py, and the hybrid decoder qwen3_5 shares
// (models/qwen3_next.h).
#include "models/qwen3_next.h"

#include <algorithm>
#include <cmath>

#include "cache/arrays_cache.h"
#include "core/error.h"
#include "nn/gated_delta.h"
#include "nn/switch_layers.h"
#include "nn/transformer.h"

namespace lmx::hybrid {

bool Args::is_moe(int layer) const {
  if (qwen3_5) return num_experts > 0;
  return std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) ==
             mlp_only_layers.end() &&
         num_experts > 0 && (layer + 1) % decoder_sparse_step == 0;
}

void validate(const Args& a, const JsonView& v) {
  const std::string& src = v.source;
  check(a.full_attention_interval > 0, src, "full_attention_interval must be > 0, got ",
        a.full_attention_interval);
  check(a.num_attention_heads > 0 && a.num_key_value_heads > 0 &&
            a.num_attention_heads % a.num_key_value_heads == 0,
        src, "num_attention_heads (", a.num_attention_heads,
        ") must be a multiple of num_key_value_heads (", a.num_key_value_heads, ")");
  check(a.linear_num_key_heads > 0 && a.linear_num_value_heads % a.linear_num_key_heads == 0, src,
        "linear_num_value_heads (", a.linear_num_value_heads,
        ") must be divisible by linear_num_key_heads (", a.linear_num_key_heads, ")");
  check(a.linear_conv_kernel_dim > 1, src, "linear_conv_kernel_dim must be > 1, got ",
        a.linear_conv_kernel_dim);
  check(a.decoder_sparse_step > 0, src, "decoder_sparse_step must be > 0, got ",
        a.decoder_sparse_step);
  check(a.num_experts == 0 || (a.num_experts_per_tok > 0 && a.num_experts_per_tok <= a.num_experts),
        src, "num_experts_per_tok must be in [1, num_experts = ", a.num_experts, "], got ",
        a.num_experts_per_tok);
  // mlx-lm places the layers by full_attention_interval alone; Hugging Face configs also list
  // them, which must then agree.
  if (!v.has("layer_types")) return;
  const json& types = v.j.at("layer_types");
  check(types.is_array() && static_cast<int>(types.size()) == a.num_hidden_layers, src,
        "layer_types must list num_hidden_layers (", a.num_hidden_layers, ") entries, got ",
        types.dump());
  for (int i = 0; i < a.num_hidden_layers; ++i) {
    const json& t = types[i];
    check(t == "linear_attention" || t == "full_attention", src, "layer_types entry ", i, " ",
          t.dump(), " is not supported, expected \"linear_attention\" or \"full_attention\"");
    const char* want = a.is_linear(i) ? "linear_attention" : "full_attention";
    check(t == want, src, "layer_types entry ", i, " is ", t.dump(), ", expected \"", want,
          "\" (full_attention_interval ", a.full_attention_interval, ")");
  }
}

namespace {

struct RMSNormGated {
  mx::array weight{0.0f};
  float eps;

  mx::array operator()(const mx::array& h, const mx::array& gate) const {
    mx::array x = mx::fast::rms_norm(h, weight, eps);
    return nn::precise_swiglu(h, gate, x);
  }
};

// Qwen3NextGatedDeltaNet / qwen3_5.GatedDeltaNet.
struct GatedDeltaNet {
  int nv, nk, dk, dv, key_dim, value_dim, conv_dim, kernel;
  bool split_proj;
  std::optional<nn::Linear> in_proj_qkvz, in_proj_ba;                      // qwen3_next
  std::optional<nn::Linear> in_proj_qkv, in_proj_z, in_proj_b, in_proj_a;  // qwen3_5
  mx::array conv_weight{0.0f};                                             // (conv_dim, kernel, 1)
  mx::array dt_bias{0.0f}, A_log{0.0f};
  RMSNormGated norm;
  nn::Linear out_proj;

  GatedDeltaNet(const Args& a, WeightStore& w, const std::string& p)
      : nv(a.linear_num_value_heads),
        nk(a.linear_num_key_heads),
        dk(a.linear_key_head_dim),
        dv(a.linear_value_head_dim),
        key_dim(dk * nk),
        value_dim(dv * nv),
        conv_dim(key_dim * 2 + value_dim),
        kernel(a.linear_conv_kernel_dim),
        split_proj(a.qwen3_5),
        out_proj(nn::Linear::load(w, p + ".out_proj", value_dim, a.hidden_size, false)) {
    const int H = a.hidden_size;
    if (split_proj) {
      in_proj_qkv = nn::Linear::load(w, p + ".in_proj_qkv", H, key_dim * 2 + value_dim, false);
      in_proj_z = nn::Linear::load(w, p + ".in_proj_z", H, value_dim, false);
      in_proj_b = nn::Linear::load(w, p + ".in_proj_b", H, nv, false);
      in_proj_a = nn::Linear::load(w, p + ".in_proj_a", H, nv, false);
    } else {
      in_proj_qkvz =
          nn::Linear::load(w, p + ".in_proj_qkvz", H, key_dim * 2 + value_dim * 2, false);
      in_proj_ba = nn::Linear::load(w, p + ".in_proj_ba", H, nv * 2, false);
    }
    conv_weight = w.take(p + ".conv1d.weight", {conv_dim, kernel, 1});
    dt_bias = w.take(p + ".dt_bias", {nv});
    A_log = w.take(p + ".A_log", {nv});
    norm = {w.take(p + ".norm.weight", {dv}), a.rms_norm_eps};
  }

  mx::array operator()(const mx::array& x, const Mask& mask, KVCacheBase& base) const {
    auto* cache = dynamic_cast<ArraysCache*>(&base);
    check(cache != nullptr, "linear attention",
          "a linear-attention layer needs an ArraysCache, got another cache type (batched rows "
          "of this model are stepped one at a time)");
    check(mask.none(), "linear attention",
          "padding masks are not supported on linear-attention layers");
    const int B = x.shape(0), S = x.shape(1);
    mx::array mixed{0.0f}, z{0.0f}, b{0.0f}, a{0.0f};
    if (split_proj) {
      mixed = (*in_proj_qkv)(x);
      z = mx::reshape((*in_proj_z)(x), {B, S, nv, dv});
      b = (*in_proj_b)(x);
      a = (*in_proj_a)(x);
    } else {
      // fix_query_key_value_ordering: per key head [q | k | v | z] and [b | a].
      mx::array qkvz = mx::reshape((*in_proj_qkvz)(x), {B, S, nk, -1});
      mx::array ba = mx::reshape((*in_proj_ba)(x), {B, S, nk, -1});
      auto parts = mx::split(qkvz, {dk, 2 * dk, 2 * dk + nv / nk * dv}, -1);
      auto gates = mx::split(ba, {nv / nk}, -1);
      z = mx::reshape(parts[3], {B, S, -1, dv});
      b = mx::reshape(gates[0], {B, S, nv});
      a = mx::reshape(gates[1], {B, S, nv});
      mixed = mx::concatenate({mx::reshape(parts[0], {B, S, -1}), mx::reshape(parts[1], {B, S, -1}),
                               mx::reshape(parts[2], {B, S, -1})},
                              -1);
    }
    const auto& conv_cached = (*cache)[0];
    mx::array conv_state =
        conv_cached ? *conv_cached : mx::zeros({B, kernel - 1, conv_dim}, x.dtype());
    mx::array conv_input = mx::concatenate({conv_state, mixed}, 1);
    const int total = conv_input.shape(1);
    cache->set(0, mx::contiguous(
                      mx::slice(conv_input, {0, total - (kernel - 1), 0}, {B, total, conv_dim})));
    mx::array conv_out = nn::silu(mx::conv1d(conv_input, conv_weight, 1, 0, 1, conv_dim));

    auto qkv = mx::split(conv_out, {key_dim, 2 * key_dim}, -1);
    mx::array q = mx::reshape(qkv[0], {B, S, nk, dk});
    mx::array k = mx::reshape(qkv[1], {B, S, nk, dk});
    mx::array v = mx::reshape(qkv[2], {B, S, nv, dv});
    auto [qn, kn] = nn::normalize_qk(q, k, std::pow(static_cast<double>(dk), -0.5), 1e-6);
    auto [out, state] =
        nn::gated_delta_update(qn, kn, v, a, b, A_log, dt_bias, (*cache)[1], std::nullopt);
    cache->set(1, state);
    cache->advance(S);
    out = norm(out, z);
    return out_proj(mx::reshape(out, {B, S, -1}));
  }
};

// Qwen3NextAttention: queries and an output gate from one q_proj.
struct GatedAttention {
  int n_heads, n_kv_heads, head_dim;
  float scale;
  nn::Linear q_proj, k_proj, v_proj, o_proj;
  nn::RMSNorm q_norm, k_norm;
  nn::RoPE rope;

  GatedAttention(const Args& a, WeightStore& w, const std::string& p)
      : n_heads(a.num_attention_heads),
        n_kv_heads(a.num_key_value_heads),
        head_dim(a.head_dim),
        scale(static_cast<float>(std::pow(static_cast<double>(a.head_dim), -0.5))),
        q_proj(nn::Linear::load(w, p + ".q_proj", a.hidden_size, n_heads * head_dim * 2,
                                a.attention_bias)),
        k_proj(nn::Linear::load(w, p + ".k_proj", a.hidden_size, n_kv_heads * head_dim,
                                a.attention_bias)),
        v_proj(nn::Linear::load(w, p + ".v_proj", a.hidden_size, n_kv_heads * head_dim,
                                a.attention_bias)),
        o_proj(nn::Linear::load(w, p + ".o_proj", n_heads * head_dim, a.hidden_size,
                                a.attention_bias)),
        q_norm(nn::RMSNorm::load(w, p + ".q_norm", head_dim, a.rms_norm_eps)),
        k_norm(nn::RMSNorm::load(w, p + ".k_norm", head_dim, a.rms_norm_eps)),
        rope(a.rope) {}

  mx::array operator()(const mx::array& x, const Mask& mask, KVCacheBase& cache) const {
    const int B = x.shape(0), L = x.shape(1);
    auto qg = mx::split(mx::reshape(q_proj(x), {B, L, n_heads, -1}), 2, -1);
    mx::array gate = mx::reshape(qg[1], {B, L, -1});
    mx::array keys = k_proj(x), values = v_proj(x);
    mx::array q = mx::transpose(q_norm(qg[0]), {0, 2, 1, 3});
    mx::array k = mx::transpose(k_norm(mx::reshape(keys, {B, L, n_kv_heads, -1})), {0, 2, 1, 3});
    mx::array v = mx::transpose(mx::reshape(values, {B, L, n_kv_heads, -1}), {0, 2, 1, 3});
    q = rope(q, cache);
    k = rope(k, cache);
    mx::array out = nn::cached_attention(q, k, v, cache, scale, mask);
    out = mx::reshape(mx::transpose(out, {0, 2, 1, 3}), {B, L, -1});
    return o_proj(mx::multiply(out, mx::sigmoid(gate)));
  }
};

// Qwen3NextSparseMoeBlock: routed SwiGLU experts plus a sigmoid-gated shared expert.
struct SparseMoeBlock {
  int top_k;
  bool norm_topk_prob;
  nn::Linear gate;
  nn::SwitchGLU switch_mlp;
  nn::SwiGLUMLP shared_expert;
  nn::Linear shared_expert_gate;

  mx::array operator()(const mx::array& x) const {
    mx::array gates = mx::softmax(gate(x), -1, /*precise=*/true);
    mx::array inds = nn::top_k_experts(gates, top_k);
    mx::array scores = mx::take_along_axis(gates, inds, -1);
    if (norm_topk_prob) scores = mx::divide(scores, mx::sum(scores, -1, /*keepdims=*/true));
    mx::array y = switch_mlp(x, inds);
    y = mx::sum(mx::multiply(y, mx::expand_dims(scores, -1)), -2);
    mx::array shared_y = mx::multiply(mx::sigmoid(shared_expert_gate(x)), shared_expert(x));
    return mx::add(y, shared_y);
  }
};

struct DecoderLayer {
  std::optional<GatedDeltaNet> linear_attn;
  std::optional<GatedAttention> self_attn;
  nn::RMSNorm input_layernorm, post_attention_layernorm;
  std::optional<SparseMoeBlock> moe;
  std::optional<nn::SwiGLUMLP> mlp;

  DecoderLayer(const Args& a, int layer, WeightStore& w, const std::string& p)
      : input_layernorm(
            nn::RMSNorm::load(w, p + ".input_layernorm", a.hidden_size, a.rms_norm_eps)),
        post_attention_layernorm(
            nn::RMSNorm::load(w, p + ".post_attention_layernorm", a.hidden_size, a.rms_norm_eps)) {
    if (a.is_linear(layer)) {
      linear_attn.emplace(a, w, p + ".linear_attn");
    } else {
      self_attn.emplace(a, w, p + ".self_attn");
    }
    const int H = a.hidden_size;
    const std::string m = p + ".mlp";
    if (a.is_moe(layer)) {
      moe = SparseMoeBlock{
          a.num_experts_per_tok,
          a.norm_topk_prob,
          nn::Linear::load(w, m + ".gate", H, a.num_experts, false),
          nn::SwitchGLU::load(w, m + ".switch_mlp", H, a.moe_intermediate_size, a.num_experts,
                              false),
          nn::SwiGLUMLP::load(w, m + ".shared_expert", H, a.shared_expert_intermediate_size, false),
          nn::Linear::load(w, m + ".shared_expert_gate", H, 1, false)};
    } else {
      mlp = nn::SwiGLUMLP::load(w, m, H, a.intermediate_size, false);
    }
  }

  mx::array operator()(const mx::array& x, const Mask& mask, KVCacheBase& cache) const {
    mx::array n = input_layernorm(x);
    mx::array r = linear_attn ? (*linear_attn)(n, mask, cache) : (*self_attn)(n, mask, cache);
    mx::array h = mx::add(x, r);
    mx::array m = post_attention_layernorm(h);
    return mx::add(h, moe ? (*moe)(m) : (*mlp)(m));
  }
};

class HybridDecoder : public Model {
 public:
  HybridDecoder(const Args& a, WeightStore& w, const std::string& prefix)
      : embed_tokens_(
            nn::Embedding::load(w, prefix + "model.embed_tokens", a.vocab_size, a.hidden_size)),
        norm_(nn::RMSNorm::load(w, prefix + "model.norm", a.hidden_size, a.rms_norm_eps)) {
    for (int i = 0; i < a.num_hidden_layers; ++i) {
      layers_.emplace_back(a, i, w, prefix + "model.layers." + std::to_string(i));
      linear_.push_back(a.is_linear(i));
      if (!a.is_linear(i) && fa_idx_ < 0) fa_idx_ = i;
    }
    if (!a.tie_word_embeddings)
      lm_head_ = nn::Linear::load(w, prefix + "lm_head", a.hidden_size, a.vocab_size, false);
  }

  mx::array hidden(const mx::array& tokens, Cache& cache) override {
    mx::array h = embed_tokens_(tokens);
    // fa_mask from the first full-attention layer's cache; ArraysCache gives no ssm mask.
    const Mask fa_mask = fa_idx_ >= 0 ? cache[fa_idx_]->make_mask(h.shape(1)) : Mask{};
    const Mask none;
    for (size_t i = 0; i < layers_.size(); ++i) {
      h = layers_[i](h, linear_[i] ? none : fa_mask, *cache[i]);
      if (tap_) tap_->on_layer(static_cast<int>(i), h);
    }
    h = norm_(h);
    if (tap_) tap_->on_final(h);
    return h;
  }

  mx::array operator()(const mx::array& tokens, Cache& cache) override {
    return head(hidden(tokens, cache));
  }
  mx::array embed(const mx::array& tokens) const override { return embed_tokens_(tokens); }
  mx::array head(const mx::array& h) const override {
    return lm_head_ ? (*lm_head_)(h) : embed_tokens_.as_linear(h);
  }

  Cache make_cache() const override {
    Cache c;
    for (bool lin : linear_) {
      if (lin) {
        c.push_back(std::make_unique<ArraysCache>());
      } else {
        c.push_back(std::make_unique<KVCache>());
      }
    }
    return c;
  }
  int num_layers() const override { return static_cast<int>(layers_.size()); }
  // The recurrent state has no per-row view: the scheduler steps rows one at a time.
  bool batches_rows() const override { return false; }

 private:
  nn::Embedding embed_tokens_;
  std::vector<DecoderLayer> layers_;
  std::vector<bool> linear_;
  int fa_idx_ = -1;
  nn::RMSNorm norm_;
  std::optional<nn::Linear> lm_head_;
};

}  // namespace

std::unique_ptr<Model> build(const Args& a, WeightStore& w, const std::string& prefix) {
  return std::make_unique<HybridDecoder>(a, w, prefix);
}

void move_conv_axis(Weights& w) {
  for (auto& [k, v] : w)
    if (k.find("conv1d.weight") != std::string::npos && v.shape(-1) != 1) v = mx::moveaxis(v, 2, 1);
}

void add_one_to_norms(Weights& w) {
  static const char* kNorms[] = {".input_layernorm.weight", ".post_attention_layernorm.weight",
                                 "model.norm.weight", ".q_norm.weight", ".k_norm.weight"};
  for (auto& [k, v] : w) {
    if (v.ndim() != 1) continue;
    for (const char* s : kNorms) {
      if (k.ends_with(s)) {
        v = mx::add(v, mx::array(1.0f, v.dtype()));
        break;
      }
    }
  }
}

namespace {

constexpr const char* kSource = "config.json";

// qwen3_next.ModelArgs: every key is required but norm_topk_prob, tie_word_embeddings,
// attention_bias, rope_scaling and full_attention_interval.
Args parse_args(const json& c) {
  JsonView v{c, kSource};
  Args a;
  a.hidden_size = v.get<int>("hidden_size");
  a.num_hidden_layers = v.get<int>("num_hidden_layers");
  a.intermediate_size = v.get<int>("intermediate_size");
  a.num_attention_heads = v.get<int>("num_attention_heads");
  a.linear_num_value_heads = v.get<int>("linear_num_value_heads");
  a.linear_num_key_heads = v.get<int>("linear_num_key_heads");
  a.linear_key_head_dim = v.get<int>("linear_key_head_dim");
  a.linear_value_head_dim = v.get<int>("linear_value_head_dim");
  a.linear_conv_kernel_dim = v.get<int>("linear_conv_kernel_dim");
  a.num_experts = v.get<int>("num_experts");
  a.num_experts_per_tok = v.get<int>("num_experts_per_tok");
  a.decoder_sparse_step = v.get<int>("decoder_sparse_step");
  a.shared_expert_intermediate_size = v.get<int>("shared_expert_intermediate_size");
  a.mlp_only_layers = v.get<std::vector<int>>("mlp_only_layers");
  a.moe_intermediate_size = v.get<int>("moe_intermediate_size");
  a.rms_norm_eps = v.get<float>("rms_norm_eps");
  a.vocab_size = v.get<int>("vocab_size");
  a.num_key_value_heads = v.get<int>("num_key_value_heads");
  const float theta = v.get<float>("rope_theta");
  const double partial = v.get<double>("partial_rotary_factor");
  const int max_pos = v.get<int>("max_position_embeddings");
  a.head_dim = v.get<int>("head_dim");
  a.norm_topk_prob = v.get<bool>("norm_topk_prob", false);
  a.tie_word_embeddings = v.get<bool>("tie_word_embeddings", false);
  a.attention_bias = v.get<bool>("attention_bias", false);
  a.full_attention_interval = v.get<int>("full_attention_interval", 4);
  validate(a, v);
  a.rope = nn::make_rope(static_cast<int>(a.head_dim * partial), theta, false,
                         v.has("rope_scaling") ? c["rope_scaling"] : json(), max_pos, kSource);
  return a;
}

}  // namespace

// qwen3_next.sanitize: only checkpoints with per-expert tensors (Hugging Face's) are rewritten:
// mtp.* dropped, a tied lm_head dropped, experts stacked into switch_mlp, conv1d axes moved and
// the norms' +1.
void sanitize_qwen3_next(const json& c, Weights& w) {
  JsonView v{c, "config.json"};
  const std::string suffix = ".mlp.experts.0.up_proj.weight";
  std::vector<std::string> prefixes;
  for (const auto& [k, t] : w)
    if (k.starts_with("model.layers.") && k.ends_with(suffix))
      prefixes.push_back(k.substr(0, k.size() - suffix.size()));
  if (prefixes.empty()) return;
  std::erase_if(w, [](const auto& kv) { return kv.first.find("mtp.") != std::string::npos; });
  if (v.get<bool>("tie_word_embeddings", false)) w.erase("lm_head.weight");
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
  move_conv_axis(w);
  add_one_to_norms(w);
}

namespace {

const ArchitectureRegistrar kQwen3Next("qwen3_next",
                                       {sanitize_qwen3_next, [](const json& c, WeightStore& w) {
                                          return build(parse_args(c), w, "");
                                        }});

}  // namespace
}  // namespace lmx::hybrid
