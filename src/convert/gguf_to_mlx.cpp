// GGUF -> MLX: tensor names to mlx-lm's, llama.cpp's converter edits undone (llama Q/K row
// permutation, Gemma's stored 1 + w norms), blocks repacked (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K)
// or re-quantized (Q6_K), config.json and the tokenizer rebuilt from the metadata.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <regex>

#include "convert/common.h"
#include "convert/convert.h"
#include "convert/gguf_quant.h"
#include "convert/gguf_tokenizer.h"
#include "convert/mlx_writer.h"
#include "core/error.h"
#include "io/gguf.h"

namespace lmx::convert {

namespace fs = std::filesystem;
using gguf::GGMLType;

namespace {

enum class Arch { kLlama, kQwen2, kQwen3, kGemma3 };

Arch parse_arch(const gguf::File& f, const std::string& arch) {
  if (arch == "llama") return Arch::kLlama;
  if (arch == "qwen2") return Arch::kQwen2;
  if (arch == "qwen3") return Arch::kQwen3;
  if (arch == "gemma3") return Arch::kGemma3;
  fail(f.path(), "general.architecture '", arch,
       "' is not supported by lmx convert (llama, qwen2, qwen3, gemma3)");
}

// GGUF tensor name -> mlx-lm name; "" for tensors that have no MLX counterpart.
std::string map_name(const gguf::File& f, Arch arch, const std::string& name) {
  static const std::regex block(R"(blk\.(\d+)\.([a-z_]+)\.(weight|bias))");
  if (name == "token_embd.weight") return "model.embed_tokens.weight";
  if (name == "output_norm.weight") return "model.norm.weight";
  if (name == "output.weight") return "lm_head.weight";
  if (name == "rope_freqs.weight") return "";  // llama3 RoPE factors, see below
  std::smatch m;
  if (std::regex_match(name, m, block)) {
    const std::string layer = m[1], part = m[2], kind = m[3];
    const bool gemma = arch == Arch::kGemma3;
    std::string mod;
    if (part == "attn_q")
      mod = "self_attn.q_proj";
    else if (part == "attn_k")
      mod = "self_attn.k_proj";
    else if (part == "attn_v")
      mod = "self_attn.v_proj";
    else if (part == "attn_output")
      mod = "self_attn.o_proj";
    else if (part == "attn_q_norm")
      mod = "self_attn.q_norm";
    else if (part == "attn_k_norm")
      mod = "self_attn.k_norm";
    else if (part == "ffn_gate")
      mod = "mlp.gate_proj";
    else if (part == "ffn_up")
      mod = "mlp.up_proj";
    else if (part == "ffn_down")
      mod = "mlp.down_proj";
    else if (part == "attn_norm")
      mod = "input_layernorm";
    else if (part == "ffn_norm")
      mod = gemma ? "pre_feedforward_layernorm" : "post_attention_layernorm";
    else if (gemma && part == "post_attention_norm")
      mod = "post_attention_layernorm";
    else if (gemma && part == "post_ffw_norm")
      mod = "post_feedforward_layernorm";
    if (!mod.empty()) return "model.layers." + layer + "." + mod + "." + kind;
  }
  fail(f.path(), "tensor '", name, "' has no MLX name for this architecture");
}

// Inverse of llama.cpp's LlamaModel.permute: GGUF rows of a head are interleaved RoPE pairs
// (i, j) -> row 2i + j; HF rows are halves, j * (D/2) + i. Returns, per HF row, the GGUF row.
std::vector<int64_t> unpermute_rows(int64_t rows, int64_t heads, const std::string& where) {
  check(heads > 0 && rows % (2 * heads) == 0, where, ": ", rows, " rows cannot be split into ",
        heads, " heads of RoPE pairs");
  const int64_t hd = rows / heads, half = hd / 2;
  std::vector<int64_t> src(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t h = r / hd, rem = r % hd, j = rem / half, i = rem % half;
    src[r] = h * hd + 2 * i + j;
  }
  return src;
}

mx::array take_rows(const mx::array& a, const std::vector<int64_t>& rows) {
  std::vector<int32_t> idx(rows.begin(), rows.end());
  return mx::take(a, mx::array(idx.data(), {static_cast<int>(idx.size())}, mx::int32), 0);
}

// A float32 metadata value written the way Python prints the float32 (1e-05, not 9.99e-06).
double f32_value(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", static_cast<float>(v));
  // Shortest decimal that reads back as the same float32.
  for (int prec = 1; prec <= 9; ++prec) {
    char b[64];
    std::snprintf(b, sizeof(b), "%.*g", prec, static_cast<float>(v));
    if (std::strtof(b, nullptr) == static_cast<float>(v)) return std::strtod(b, nullptr);
  }
  return std::strtod(buf, nullptr);
}

bool is_kquant(GGMLType t) {
  return t == GGMLType::kQ4_K || t == GGMLType::kQ5_K || t == GGMLType::kQ6_K;
}

bool is_float_type(GGMLType t) {
  return t == GGMLType::kF32 || t == GGMLType::kF16 || t == GGMLType::kBF16;
}

struct Hparams {
  int64_t n_layer = 0, hidden = 0, ff = 0, n_head = 0, n_kv = 0, ctx = 0, vocab = 0;
  std::optional<int64_t> key_length;
  double eps = 1e-5, rope_theta = 10000.0;
};

int64_t head_count(const gguf::File& f, const std::string& key) {
  const gguf::Value& v = f.value(key);
  check(v.type != gguf::ValueType::kArray, f.path(), "metadata '", key,
        "' varies per layer, which lmx convert does not support");
  return f.get_int(key);
}

ojson rope_scaling(const gguf::File& f, const std::string& p) {
  const auto type = f.opt_string(p + "rope.scaling.type");
  if (!type || *type == "none") return nullptr;
  ojson r;
  r["rope_type"] = *type;
  r["type"] = *type;
  if (auto factor = f.opt_float(p + "rope.scaling.factor")) r["factor"] = f32_value(*factor);
  if (auto orig = f.opt_int(p + "rope.scaling.original_context_length"))
    r["original_max_position_embeddings"] = *orig;
  return r;
}

}  // namespace

void convert_gguf(const ConvertOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  check(fs::is_regular_file(opt.src), opt.src.string(), "file not found");
  gguf::File f(opt.src);
  const std::string& where = f.path();
  const std::string arch_name = f.get_string("general.architecture");
  const Arch arch = parse_arch(f, arch_name);
  const std::string p = arch_name + ".";
  const std::string dtype_str = opt.dtype.value_or("float32");
  const auto dtype_opt = parse_dtype(dtype_str);
  check(dtype_opt.has_value(), "convert", "--dtype '", dtype_str,
        "' is not supported, expected float16, bfloat16 or float32");
  const mx::Dtype dtype = *dtype_opt;
  const int q_bits = opt.q_bits.value_or(4), q_group = opt.q_group_size.value_or(64);
  if (opt.quantize) check_quant_params(q_bits, q_group);
  check(opt.quantize || (!opt.q_bits && !opt.q_group_size), "convert",
        "--q-bits / --q-group-size need -q (--quantize)");
  const int rq_group = opt.gguf_requant_group_size;
  check_quant_params(opt.gguf_requant_bits == 0 ? 4 : opt.gguf_requant_bits, rq_group);

  Hparams hp;
  hp.n_layer = f.get_int(p + "block_count");
  hp.hidden = f.get_int(p + "embedding_length");
  hp.ff = f.get_int(p + "feed_forward_length");
  hp.n_head = head_count(f, p + "attention.head_count");
  hp.n_kv = f.has(p + "attention.head_count_kv") ? head_count(f, p + "attention.head_count_kv")
                                                 : hp.n_head;
  hp.ctx = f.get_int(p + "context_length");
  hp.key_length = f.opt_int(p + "attention.key_length");
  hp.eps = f.get_float(p + "attention.layer_norm_rms_epsilon");
  hp.rope_theta =
      f.opt_float(p + "rope.freq_base").value_or(arch == Arch::kLlama ? 10000.0 : 1000000.0);
  check(hp.n_head > 0 && hp.n_kv > 0 && hp.hidden > 0 && hp.n_layer > 0, where,
        "invalid hyper-parameters: heads ", hp.n_head, ", kv heads ", hp.n_kv, ", hidden ",
        hp.hidden, ", layers ", hp.n_layer);
  const gguf::TensorInfo& embed = f.tensor("token_embd.weight");
  check(embed.dims.size() == 2 && embed.dims[0] == hp.hidden, where, "token_embd.weight has shape ",
        shape_str(embed.shape()), ", expected [vocab, ", hp.hidden, "]");
  hp.vocab = embed.dims[1];
  const bool tied = f.find_tensor("output.weight") == nullptr;

  if (opt.verbose)
    std::fprintf(stderr, "[INFO] Loading %s (%s, %zu tensors)\n", where.c_str(), arch_name.c_str(),
                 f.tensors().size());

  Weights weights;
  QuantMap quantized;
  int lossless = 0, rounded = 0, fallback = 0, requantized = 0, as_float = 0;
  for (const auto& t : f.tensors()) {
    const std::string name = map_name(f, arch, t.name);
    if (name.empty()) {
      std::fprintf(stderr,
                   "[WARN] %s: skipping '%s' (llama3 RoPE frequency factors; the config "
                   "gets no rope_scaling for it)\n",
                   where.c_str(), t.name.c_str());
      continue;
    }
    check(gguf::can_dequantize(t.type), where, "tensor '", t.name, "' has type ",
          gguf::type_name(t.type),
          ", which lmx convert does not support (F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K "
          "Q6_K)");
    const std::string tw = where + ": tensor '" + t.name + "'";
    // llama's Q/K rows (weights and biases) go back to HF's half-split RoPE layout.
    std::vector<int64_t> rows;
    if (arch == Arch::kLlama && (t.name.find(".attn_q.") != std::string::npos ||
                                 t.name.find(".attn_k.") != std::string::npos)) {
      const bool is_q = t.name.find(".attn_q.") != std::string::npos;
      const int64_t n_rows = t.dims.size() == 1 ? t.dims[0] : t.rows();
      rows = unpermute_rows(n_rows, is_q ? hp.n_head : hp.n_kv, tw);
    }
    const bool matrix = t.dims.size() == 2 && ends_with(name, ".weight");
    const std::string prefix = matrix ? name.substr(0, name.size() - 7) : "";
    auto store = [&](const AffineTensor& a) {
      weights.emplace(prefix + ".weight", a.weight);
      weights.emplace(prefix + ".scales", a.scales);
      weights.emplace(prefix + ".biases", a.biases);
      quantized[prefix] = {a.group_size, a.bits};
    };
    auto load_float = [&]() {
      mx::array w = gguf::dequantize(f, t);
      if (!rows.empty()) w = take_rows(w, rows);
      // Gemma's converter stores 1 + w for every RMSNorm weight; mlx-lm adds the 1 itself.
      if (arch == Arch::kGemma3 && ends_with(t.name, "norm.weight"))
        w = mx::subtract(w, mx::array(1.0f));
      return w;
    };

    const bool kquant_requant =
        is_kquant(t.type) && (opt.gguf_requant_bits != 0 || t.type == GGMLType::kQ6_K);
    const bool kquant_skip = is_kquant(t.type) && opt.gguf_kquant_float;
    if (matrix && !opt.gguf_dequantize && !kquant_skip && !kquant_requant &&
        is_affine_block_type(t.type)) {
      if (auto a = repack_affine_blocks(f, t, dtype, rows.empty() ? nullptr : &rows)) {
        store(a->tensor);
        ++(a->exact ? lossless : rounded);
        continue;
      }
      // A scale or bias overflows the dtype (float16 and |d| > 511 in Q8_0, say): re-quantize at
      // the same bits and group size from the exact float values.
      store(quantize_float(load_float(), affine_block_bits(t.type), 32, dtype));
      ++fallback;
      continue;
    }
    if (matrix && !opt.gguf_dequantize && !kquant_skip && kquant_requant) {
      // Q6_K's 16-weight sub-blocks have no group-32 form; 8 bits keep it within ~0.5% RMS.
      const int bits = opt.gguf_requant_bits ? opt.gguf_requant_bits : 8;
      const int group = t.dims[0] % rq_group == 0 ? rq_group : 32;
      store(quantize_float(load_float(), bits, group, dtype));
      ++requantized;
      continue;
    }
    mx::array w = load_float();
    if (matrix && opt.quantize && is_float_type(t.type) && t.dims[0] % q_group == 0) {
      // -q: quantize the float matrices like mlx_lm.convert (cast, then quantize).
      auto q = mx::quantize(mx::astype(w, dtype), q_group, q_bits);
      store(AffineTensor{q[0], q[1], q[2], q_bits, q_group});
      ++requantized;
      continue;
    }
    weights.emplace(name, mx::astype(w, dtype));
    ++as_float;
  }
  if (rounded || fallback)
    std::fprintf(stderr,
                 "[WARN] %s cannot hold every block scale exactly: %d tensors keep their "
                 "blocks with rounded scales, %d overflowed and were re-quantized (--dtype "
                 "float32 gives an exact copy)\n",
                 dtype_str.c_str(), rounded, fallback);

  // Quantization block: the most common (bits, group) is the default, the rest are overrides.
  ojson config;
  if (!quantized.empty()) {
    std::map<std::pair<int, int>, int> count;
    for (const auto& [k, q] : quantized) ++count[{q.bits, q.group_size}];
    auto best = count.begin();
    for (auto it = count.begin(); it != count.end(); ++it)
      if (it->second > best->second) best = it;
    const QuantParams def{best->first.second, best->first.first};
    QuantMap overrides;
    for (const auto& [k, q] : quantized)
      if (q.bits != def.bits || q.group_size != def.group_size) overrides[k] = q;
    config["quantization"] = quantization_block(def, overrides);
  }

  const int64_t head_dim = hp.key_length.value_or(hp.hidden / hp.n_head);
  GgufTokenizer tok = build_gguf_tokenizer(f, arch_name, hp.ctx);
  check(tok.vocab_size <= hp.vocab, where, "the tokenizer has ", tok.vocab_size,
        " tokens but token_embd.weight only ", hp.vocab, " rows");
  config["hidden_size"] = hp.hidden;
  config["intermediate_size"] = hp.ff;
  config["num_hidden_layers"] = hp.n_layer;
  config["num_attention_heads"] = hp.n_head;
  config["num_key_value_heads"] = hp.n_kv;
  config["head_dim"] = head_dim;
  config["rms_norm_eps"] = f32_value(hp.eps);
  config["rope_theta"] = f32_value(hp.rope_theta);
  config["max_position_embeddings"] = hp.ctx;
  config["vocab_size"] = hp.vocab;
  config["tie_word_embeddings"] = tied;
  config["rope_scaling"] = rope_scaling(f, p);
  if (tok.bos_id) config["bos_token_id"] = *tok.bos_id;
  if (tok.eos_id) config["eos_token_id"] = *tok.eos_id;
  if (tok.pad_id) config["pad_token_id"] = *tok.pad_id;
  config["torch_dtype"] = dtype_str;
  switch (arch) {
    case Arch::kLlama:
      config["model_type"] = "llama";
      config["architectures"] = ojson::array({"LlamaForCausalLM"});
      config["hidden_act"] = "silu";
      config["attention_bias"] = f.find_tensor("blk.0.attn_q.bias") != nullptr;
      config["mlp_bias"] = false;
      break;
    case Arch::kQwen2:
      config["model_type"] = "qwen2";
      config["architectures"] = ojson::array({"Qwen2ForCausalLM"});
      config["hidden_act"] = "silu";
      config.erase("head_dim");  // mlx-lm qwen2 derives it
      break;
    case Arch::kQwen3:
      config["model_type"] = "qwen3";
      config["architectures"] = ojson::array({"Qwen3ForCausalLM"});
      config["hidden_act"] = "silu";
      break;
    case Arch::kGemma3: {
      config["model_type"] = "gemma3_text";
      config["architectures"] = ojson::array({"Gemma3ForCausalLM"});
      config["hidden_activation"] = "gelu_pytorch_tanh";
      config["sliding_window"] = f.opt_int(p + "attention.sliding_window").value_or(512);
      int64_t pattern = 6;  // llama.cpp's default for gemma3
      if (f.has(p + "attention.sliding_window_pattern")) {
        check(f.value(p + "attention.sliding_window_pattern").type != gguf::ValueType::kArray,
              where, "per-layer sliding_window_pattern arrays are not supported");
        pattern = f.get_int(p + "attention.sliding_window_pattern");
      }
      config["sliding_window_pattern"] = pattern;
      config["rope_local_base_freq"] =
          f32_value(f.opt_float(p + "rope.freq_base_swa").value_or(10000.0));
      // llama.cpp: attention scale 1/sqrt(head_dim), except 27B (62 layers): hidden / heads.
      config["query_pre_attn_scalar"] = hp.n_layer == 62 ? hp.hidden / hp.n_head : head_dim;
      if (auto cap = f.opt_float(p + "final_logit_softcapping"))
        config["final_logit_softcapping"] = f32_value(*cap);
      else
        config["final_logit_softcapping"] = nullptr;
      config["attn_logit_softcapping"] = nullptr;
      break;
    }
  }

  StagingDir out(opt.dst);
  save_weights(out.path(), weights, quantized, 5ull << 30, opt.verbose);
  save_config(out.path() / "config.json", config);
  write_gguf_tokenizer(tok, out.path());
  out.commit();
  if (opt.verbose) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr,
                 "[INFO] Wrote %s in %.1f s: %d tensors repacked losslessly, %d with rounded "
                 "scales, %d re-quantized, %d float (%s)\n",
                 opt.dst.string().c_str(), s, lossless, rounded, requantized + fallback, as_float,
                 dtype_str.c_str());
  }
}

bool is_gguf(const fs::path& path) {
  if (!fs::is_regular_file(path)) return false;
  std::ifstream f(path, std::ios::binary);
  char magic[4] = {};
  f.read(magic, 4);
  return f.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

void convert(const ConvertOptions& opt) {
  std::error_code ec;
  check(fs::exists(opt.src, ec), opt.src.string(), "file or directory not found");
  if (fs::is_directory(opt.src)) return convert_hf(opt);
  if (is_gguf(opt.src) || opt.src.extension() == ".gguf") return convert_gguf(opt);
  fail(opt.src.string(), "not a Hugging Face model directory or a GGUF file");
}

}  // namespace lmx::convert
