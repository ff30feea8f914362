// Qwen3.5 (`qwen3_5`, `qwen3_5_moe`): mlx_lm/models/qwen3_5.py and qwen3_5_moe.py, the text model
// of the multimodal checkpoints (vision tensors dropped) on the hybrid decoder of qwen3_next
// (models/qwen3_next.h) with separate in_proj_qkv / z / b / a projections. The text keys sit
// under text_config (or at the top level when there is none); the tensors under
// `language_model.`.
#include <algorithm>

#include "core/error.h"
#include "models/qwen3_next.h"

namespace lmx::hybrid {
namespace {

constexpr const char* kSource = "config.json";

const json& text_config(const json& c) { return c.contains("text_config") ? c["text_config"] : c; }

std::string text_source(const json& c) {
  return c.contains("text_config") ? std::string(kSource) + " text_config" : kSource;
}

// qwen3_5.TextModelArgs. mlx-lm defaults every field; lmx keeps its defaults for the optional
// ones but requires the sizes a checkpoint always states (a default 4096-wide model would only
// fail later, on a tensor's shape).
Args parse_args(const json& c) {
  const json& t = text_config(c);
  JsonView v{t, text_source(c)};
  Args a;
  a.qwen3_5 = true;
  a.hidden_size = v.get<int>("hidden_size");
  a.num_hidden_layers = v.get<int>("num_hidden_layers");
  a.num_attention_heads = v.get<int>("num_attention_heads");
  a.num_key_value_heads = v.get<int>("num_key_value_heads");
  a.vocab_size = v.get<int>("vocab_size");
  a.linear_num_value_heads = v.get<int>("linear_num_value_heads");
  a.linear_num_key_heads = v.get<int>("linear_num_key_heads");
  a.linear_key_head_dim = v.get<int>("linear_key_head_dim");
  a.linear_value_head_dim = v.get<int>("linear_value_head_dim");
  a.linear_conv_kernel_dim = v.get<int>("linear_conv_kernel_dim", 4);
  a.rms_norm_eps = v.get<float>("rms_norm_eps", 1e-6f);
  a.tie_word_embeddings = v.get<bool>("tie_word_embeddings", false);
  a.attention_bias = v.get<bool>("attention_bias", false);
  check(a.num_attention_heads > 0, v.source, "num_attention_heads must be > 0, got ",
        a.num_attention_heads);
  a.head_dim = v.get<int>("head_dim", a.hidden_size / a.num_attention_heads);
  a.full_attention_interval = v.get<int>("full_attention_interval", 4);
  a.num_experts = v.get<int>("num_experts", 0);
  if (a.num_experts > 0) {
    a.num_experts_per_tok = v.get<int>("num_experts_per_tok");
    a.moe_intermediate_size = v.get<int>("moe_intermediate_size");
    a.shared_expert_intermediate_size = v.get<int>("shared_expert_intermediate_size");
    a.decoder_sparse_step = v.get<int>("decoder_sparse_step", 1);
    a.norm_topk_prob = v.get<bool>("norm_topk_prob", true);
  } else {
    a.intermediate_size = v.get<int>("intermediate_size");
  }
  const int max_pos = v.get<int>("max_position_embeddings", 131072);
  validate(a, v);
  // __post_init__: rope_parameters (default: type default, theta 100000, partial 0.25) give the
  // theta, the partial factor and the scaling; when present but empty, the top-level keys do.
  json rp = {{"type", "default"},
             {"mrope_section", {11, 11, 10}},
             {"rope_theta", 100000},
             {"partial_rotary_factor", 0.25}};
  if (t.contains("rope_parameters")) rp = t["rope_parameters"];
  double partial = 0.25, theta = 100000.0;
  json scaling;
  if (rp.is_object() && !rp.empty()) {
    if (!rp.contains("type") && rp.contains("rope_type")) {
      rp["type"] = rp["rope_type"];
      rp.erase("rope_type");
    }
    partial = rp.value("partial_rotary_factor", 0.25);
    theta = rp.value("rope_theta", 100000.0);
    scaling = rp;
  } else {
    partial = v.get<double>("partial_rotary_factor", 0.25);
    theta = v.get<double>("rope_theta", 100000.0);
    if (v.has("rope_scaling")) scaling = t["rope_scaling"];
  }
  a.rope = nn::make_rope(static_cast<int>(a.head_dim * partial), static_cast<float>(theta), false,
                         scaling, max_pos, v.source);
  return a;
}

// qwen3_5.Model.sanitize: vision tensors dropped, text tensors moved under language_model.
void to_language_model(Weights& w) {
  Weights out;
  for (auto& [k, v] : w) {
    if (k.starts_with("vision_tower") || k.starts_with("model.visual")) continue;
    std::string key = k;
    if (key.starts_with("model.language_model")) {
      key = "language_model.model" + key.substr(std::string("model.language_model").size());
    } else if (!key.starts_with("language_model.")) {
      key = "language_model." + key;
    }
    out.insert_or_assign(key, v);
  }
  w = std::move(out);
}

// TextModel.sanitize: mtp.* dropped, the (no-op) tied lm_head pop, conv1d axes moved, and the
// norms' +1 only when a conv1d weight still had Hugging Face's layout.
void sanitize_text(const json& c, Weights& w) {
  const bool unsanitized = std::any_of(w.begin(), w.end(), [](const auto& kv) {
    return kv.first.find("conv1d.weight") != std::string::npos && kv.second.shape(-1) != 1;
  });
  std::erase_if(w, [](const auto& kv) { return kv.first.find("mtp.") != std::string::npos; });
  if (JsonView{text_config(c), text_source(c)}.get<bool>("tie_word_embeddings", false))
    w.erase("lm_head.weight");
  move_conv_axis(w);
  if (unsanitized) add_one_to_norms(w);
}

}  // namespace

void sanitize_qwen3_5(const json& c, Weights& w) {
  to_language_model(w);
  sanitize_text(c, w);
}

// qwen3_5_moe.Model.sanitize: Hugging Face's fused experts.gate_up_proj (E, 2 * I, H) split in
// halves into switch_mlp.gate_proj / up_proj, experts.down_proj into switch_mlp.down_proj.
void sanitize_qwen3_5_moe(const json& c, Weights& w) {
  to_language_model(w);
  const int layers = JsonView{text_config(c), text_source(c)}.get<int>("num_hidden_layers");
  for (int l = 0; l < layers; ++l) {
    const std::string p = "language_model.model.layers." + std::to_string(l) + ".mlp";
    auto it = w.find(p + ".experts.gate_up_proj");
    if (it == w.end()) continue;
    mx::array gate_up = it->second;
    w.erase(it);
    const int n = gate_up.ndim(), mid = gate_up.shape(-2) / 2;
    mx::Shape lo(n, 0), hi = gate_up.shape();
    hi[n - 2] = mid;
    w.insert_or_assign(p + ".switch_mlp.gate_proj.weight", mx::slice(gate_up, lo, hi));
    lo[n - 2] = mid;
    hi[n - 2] = gate_up.shape(-2);
    w.insert_or_assign(p + ".switch_mlp.up_proj.weight", mx::slice(gate_up, lo, hi));
    auto down = w.find(p + ".experts.down_proj");
    check(down != w.end(), kSource, "missing tensor '", p, ".experts.down_proj' beside '", p,
          ".experts.gate_up_proj'");
    w.insert_or_assign(p + ".switch_mlp.down_proj.weight", down->second);
    w.erase(p + ".experts.down_proj");
  }
  sanitize_text(c, w);
}

namespace {

std::unique_ptr<Model> build_text(const json& c, WeightStore& w) {
  return build(parse_args(c), w, "language_model.");
}

const ArchitectureRegistrar kQwen3_5("qwen3_5", {sanitize_qwen3_5, build_text});
const ArchitectureRegistrar kQwen3_5Moe("qwen3_5_moe", {sanitize_qwen3_5_moe, build_text});

}  // namespace
}  // namespace lmx::hybrid
