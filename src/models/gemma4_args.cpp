// Gemma 4 text configuration and checkpoint: gemma4_text.ModelArgs (defaults, __post_init__'s
// layer_types) and Model.sanitize (mlx_lm/models/gemma4_text.py).
#include "models/gemma4_layers.h"
#include "models/gemma4_text.h"

namespace lmx {
namespace gemma4 {

Args parse_args(const json& c, const std::string& source) {
  JsonView v{c, source};
  // An explicit null is Python's None (falsy), a missing key the dataclass default.
  auto nullable = [&](const char* key, int fallback) {
    if (!c.contains(key)) return fallback;
    return c[key].is_null() ? 0 : v.get<int>(key);
  };
  Args a;
  a.hidden_size = v.get<int>("hidden_size", 1536);
  a.num_hidden_layers = v.get<int>("num_hidden_layers", 35);
  a.intermediate_size = v.get<int>("intermediate_size", 6144);
  a.num_attention_heads = v.get<int>("num_attention_heads", 8);
  a.head_dim = v.get<int>("head_dim", 256);
  a.global_head_dim = nullable("global_head_dim", 512);
  a.rms_norm_eps = v.get<float>("rms_norm_eps", 1e-6f);
  a.vocab_size = v.get<int>("vocab_size", 262144);
  a.vocab_size_per_layer_input = v.get<int>("vocab_size_per_layer_input", 262144);
  a.num_key_value_heads = v.get<int>("num_key_value_heads", 1);
  a.num_global_key_value_heads = v.get_opt<int>("num_global_key_value_heads");
  a.num_kv_shared_layers = v.get<int>("num_kv_shared_layers", 20);
  a.hidden_size_per_layer_input = nullable("hidden_size_per_layer_input", 256);
  a.rope_traditional = v.get<bool>("rope_traditional", false);
  a.sliding_window = v.get<int>("sliding_window", 512);
  a.sliding_window_pattern = v.get<int>("sliding_window_pattern", 5);
  a.max_position_embeddings = v.get<int>("max_position_embeddings", 131072);
  a.attention_k_eq_v = v.get<bool>("attention_k_eq_v", false);
  a.final_logit_softcapping = 30.0;
  if (c.contains("final_logit_softcapping"))
    a.final_logit_softcapping = v.get_opt<double>("final_logit_softcapping");
  a.use_double_wide_mlp = v.get<bool>("use_double_wide_mlp", true);
  a.enable_moe_block = v.get<bool>("enable_moe_block", false);
  a.tie_word_embeddings = v.get<bool>("tie_word_embeddings", true);
  if (a.enable_moe_block) {
    a.num_experts = v.get<int>("num_experts");
    a.top_k_experts = v.get<int>("top_k_experts");
    a.moe_intermediate_size = v.get<int>("moe_intermediate_size");
    check(a.top_k_experts > 0 && a.top_k_experts <= a.num_experts, source, "top_k_experts ",
          a.top_k_experts, " must be in [1, num_experts = ", a.num_experts, "]");
  }
  a.rope_parameters = v.has("rope_parameters") ? c["rope_parameters"]
                                               : json{{"full_attention",
                                                       {{"partial_rotary_factor", 0.25},
                                                        {"rope_theta", 1e6},
                                                        {"rope_type", "proportional"}}},
                                                      {"sliding_attention",
                                                       {{"partial_rotary_factor", 1.0},
                                                        {"rope_theta", 10000.0},
                                                        {"rope_type", "default"}}}};
  check(a.rope_parameters.is_object(), source, "rope_parameters must be an object");
  if (v.has("layer_types")) {
    a.layer_types = v.get<std::vector<std::string>>("layer_types");
  } else {
    check(a.sliding_window_pattern > 0, source, "sliding_window_pattern must be > 0, got ",
          a.sliding_window_pattern);
    for (int i = 0; i < a.num_hidden_layers; ++i)
      a.layer_types.emplace_back(i % a.sliding_window_pattern == a.sliding_window_pattern - 1
                                     ? "full_attention"
                                     : "sliding_attention");
  }
  check(static_cast<int>(a.layer_types.size()) >= a.num_hidden_layers, source, "layer_types has ",
        a.layer_types.size(), " entries, expected num_hidden_layers = ", a.num_hidden_layers);
  for (const auto& t : a.layer_types)
    check(t == "full_attention" || t == "sliding_attention", source, "layer_types entry '", t,
          "', expected full_attention or sliding_attention");
  check(a.num_kv_shared_layers >= 0 && a.num_kv_shared_layers <= a.num_hidden_layers, source,
        "num_kv_shared_layers ", a.num_kv_shared_layers, " must be in [0, num_hidden_layers]");
  return a;
}

}  // namespace gemma4

// Drops rotary tables, activation ranges and the K/V projections of KV-shared layers; splits
// Hugging Face's fused experts.gate_up_proj into SwitchGLU's gate_proj / up_proj.
void sanitize_gemma4_text(const json& c, Weights& w) {
  JsonView v{c, "config.json"};
  const int first_shared =
      v.get<int>("num_hidden_layers", 35) - v.get<int>("num_kv_shared_layers", 20);
  auto has = [](const std::string& k, std::initializer_list<const char*> parts) {
    for (const char* s : parts)
      if (k.find(s) != std::string::npos) return true;
    return false;
  };
  auto layer_of = [](const std::string& k) -> std::optional<int> {
    const size_t at = k.find("layers.");
    if (at == std::string::npos) return std::nullopt;
    const std::string rest = k.substr(at + 7, k.find('.', at + 7) - (at + 7));
    if (rest.empty() || rest.find_first_not_of("0123456789") != std::string::npos)
      return std::nullopt;
    return std::stoi(rest);
  };
  Weights out;
  for (auto& [k, t] : w) {
    if (has(k, {"self_attn.rotary_emb", "input_max", "input_min", "output_max", "output_min"}))
      continue;
    if (has(k, {".self_attn.k_proj", ".self_attn.v_proj", ".self_attn.k_norm"})) {
      auto layer = layer_of(k);
      if (layer && *layer >= first_shared) continue;
    }
    if (k.ends_with(".experts.gate_up_proj")) {
      const std::string base = k.substr(0, k.size() - std::string(".gate_up_proj").size());
      std::vector<mx::array> parts = mx::split(t, 2, -2);
      out.insert_or_assign(base + ".switch_glu.gate_proj.weight", mx::contiguous(parts[0]));
      out.insert_or_assign(base + ".switch_glu.up_proj.weight", mx::contiguous(parts[1]));
      continue;
    }
    if (k.ends_with(".experts.down_proj")) {
      const std::string base = k.substr(0, k.size() - std::string(".down_proj").size());
      out.insert_or_assign(base + ".switch_glu.down_proj.weight", t);
      continue;
    }
    out.insert_or_assign(k, t);
  }
  w = std::move(out);
}

}  // namespace lmx
