// lmx convert against the Python references made by scripts/gen_convert_fixtures.py:
// HF -> MLX bit-identical to mlx_lm.convert; GGUF blocks dequantized exactly as gguf-py does and
// repacked losslessly into MLX affine quantization; config.json keys; bad inputs.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "core/error.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "models/model.h"
#include "test_util.h"

namespace lmx {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json read_json(const fs::path& p) {
  std::ifstream f(p);
  EXPECT_TRUE(f.good()) << p;
  return json::parse(f, nullptr, /*allow_exceptions=*/false);
}

// A fresh directory under /tmp, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() /
            ("lmx_convert_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& s) const { return path_ / s; }

 private:
  fs::path path_;
};

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

test::RunResult convert(const fs::path& src, const fs::path& dst, const std::string& flags = "") {
  return test::run_lmx("convert --hf-path " + q(src) + " --mlx-path " + q(dst) + " --quiet " +
                       flags);
}

bool same_bytes(const mx::array& a, const mx::array& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  mx::array ca = mx::contiguous(a), cb = mx::contiguous(b);
  mx::eval(ca, cb);
  return ca.nbytes() == cb.nbytes() &&
         std::memcmp(ca.data<uint8_t>(), cb.data<uint8_t>(), ca.nbytes()) == 0;
}

float max_abs_diff(const mx::array& a, const mx::array& b) {
  return mx::max(mx::abs(mx::subtract(mx::astype(a, mx::float32), mx::astype(b, mx::float32))))
      .item<float>();
}

// ---------------------------------------------------------------------------------------------
// HF -> MLX: every tensor, the index and config.json equal mlx_lm.convert's output.

TEST(ConvertHf, BitIdenticalToMlxLm) {
  const fs::path hf = test::data_path("convert/hf");
  const json index = read_json(hf / "index.json");
  ASSERT_TRUE(index.is_array() && !index.empty());
  for (const auto& c : index) {
    const std::string name = c["name"];
    SCOPED_TRACE("case " + name);
    std::string flags;
    for (const auto& f : c["flags"]) flags += f.get<std::string>() + " ";
    TempDir tmp;
    const fs::path out = tmp / "mlx";
    auto r = convert(hf / name / "src", out, flags);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const fs::path ref = hf / name / "ref";
    Weights got = load_model_weights(out), want = load_model_weights(ref);
    std::set<std::string> got_names, want_names;
    for (const auto& [k, v] : got) got_names.insert(k);
    for (const auto& [k, v] : want) want_names.insert(k);
    EXPECT_EQ(got_names, want_names);
    for (const auto& [k, w] : want) {
      auto it = got.find(k);
      if (it == got.end()) continue;
      EXPECT_TRUE(same_bytes(it->second, w))
          << k << ": got " << dtype_name(it->second.dtype()) << " " << shape_str(it->second.shape())
          << ", mlx-lm " << dtype_name(w.dtype()) << " " << shape_str(w.shape());
    }
    EXPECT_EQ(read_json(out / "config.json"), read_json(ref / "config.json"));
    const json gi = read_json(out / "model.safetensors.index.json");
    const json wi = read_json(ref / "model.safetensors.index.json");
    EXPECT_EQ(gi["metadata"], wi["metadata"]);
    EXPECT_EQ(gi["weight_map"], wi["weight_map"]);
    EXPECT_TRUE(fs::exists(out / "tokenizer.json"));
    EXPECT_TRUE(fs::exists(out / "tokenizer_config.json"));
    EXPECT_FALSE(fs::exists(tmp / "mlx.partial"));
    // And lmx loads what it wrote (every tensor taken, shapes as the config says).
    EXPECT_NO_THROW(load_model(out, {.exact = true}));
  }
}

// ---------------------------------------------------------------------------------------------
// GGUF

struct Expected {
  json meta;  // gen_convert_fixtures.py's <model>_expected.json
  Weights values;
};

Expected load_expected(const std::string& model) {
  Expected e;
  e.meta = read_json(test::data_path("convert/gguf/" + model + "_expected.json"));
  e.values = load_safetensors(test::data_path("convert/gguf/" + model + "_expected.safetensors"));
  return e;
}

// The quantization parameters config.json records for a module.
std::pair<int, int> config_quant(const json& config, const std::string& module) {
  const json& q = config["quantization"];
  if (q.contains(module)) return {q[module]["bits"], q[module]["group_size"]};
  return {q["bits"], q["group_size"]};
}

// Every GGUF tensor that gen_convert_fixtures dequantized in full: lmx's dequantization must be
// bit-identical to gguf.quants.dequantize.
void check_dequantize(const std::string& model, const Expected& e) {
  gguf::File file(test::data_path("convert/gguf/" + model + ".gguf"));
  int checked = 0;
  for (const auto& [hname, m] : e.meta["tensors"].items()) {
    if (!m["full"].get<bool>()) continue;
    const std::string gname = m["gguf"];
    SCOPED_TRACE(model + " " + gname + " (" + m["type"].get<std::string>() + ")");
    const mx::array want = e.values.at("gguf/" + gname);
    mx::array got = gguf::dequantize(file, file.tensor(gname));
    if (want.ndim() == 1) got = mx::reshape(got, {-1});
    ASSERT_EQ(got.shape(), want.shape());
    EXPECT_TRUE(same_bytes(got, want)) << "max |diff| " << max_abs_diff(got, want);
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

struct ConvertedCheck {
  std::string dtype = "float32";  // --dtype: scales and float tensors
  bool kquant_float = false;      // --gguf-kquant-float
  bool all_float = false;         // --gguf-dequantize
  int requant_bits = 0;           // --gguf-requant-bits (0: only Q6_K, at 8)
  int requant_group = 32;         // --gguf-requant-group-size
};

mx::Dtype dtype_of(const std::string& s) {
  return s == "float16" ? mx::float16 : s == "bfloat16" ? mx::bfloat16 : mx::float32;
}

float dtype_eps(mx::Dtype d) {
  return d == mx::float32   ? 1.0f / (1 << 24)
         : d == mx::float16 ? 1.0f / (1 << 11)
                            : 1.0f / (1 << 8);
}

// How lmx stores a tensor under the variant's flags (convert_gguf's policy): "float", "exact"
// (repacked blocks, scales exact in the dtype), "rounded" (repacked, scales rounded to the dtype)
// or "requant" (mx::quantize).
struct Mode {
  std::string how;
  int bits = 0, group = 0;
};

Mode expected_mode(const json& m, const ConvertedCheck& c) {
  const std::string type = m["type"], how = m["convert"];
  const bool kquant = type == "Q4_K" || type == "Q5_K" || type == "Q6_K";
  if (how == "float" || c.all_float || (kquant && c.kquant_float)) return {"float"};
  if (kquant && c.requant_bits) return {"requant", c.requant_bits, c.requant_group};
  if (how == "exact") {
    // f16 products of the k-quant super-block scales rarely fit in f16; bf16 holds few scales.
    const bool exact = c.dtype == "float32" || (c.dtype == "float16" && !kquant);
    return {exact ? "exact" : "rounded", m["bits"], m["group_size"]};
  }
  return {how, m["bits"], m["group_size"]};
}

// Converted tensors against the reference values: exact blocks bit for bit, float tensors exactly
// after rounding the reference to the dtype, rounded blocks as the float32 conversion's exact
// blocks with their scales and biases rounded to the dtype (`exact32`, checked bit for bit against
// the reference before), re-quantized ones within a bound taken from the reference values alone.
void check_converted(const fs::path& dir, const Expected& e, const ConvertedCheck& c,
                     const Weights* exact32 = nullptr) {
  Weights w = load_model_weights(dir);
  const json config = read_json(dir / "config.json");
  const mx::Dtype dt = dtype_of(c.dtype);
  for (const auto& [hname, m] : e.meta["tensors"].items()) {
    const Mode mode = expected_mode(m, c);
    SCOPED_TRACE(hname + " (" + m["type"].get<std::string>() + ", " + c.dtype + ", " + mode.how +
                 ")");
    const mx::array want = e.values.at("hf/" + hname);
    const std::string prefix = hname.substr(0, hname.size() - std::string(".weight").size());
    if (mode.how == "float") {
      ASSERT_TRUE(w.count(hname)) << "missing float tensor";
      mx::array got = w.at(hname);
      EXPECT_EQ(got.dtype(), dt);
      if (want.ndim() == 2) got = mx::slice(got, {0, 0}, {want.shape(0), got.shape(1)});
      ASSERT_EQ(got.shape(), want.shape());
      EXPECT_TRUE(same_bytes(got, mx::astype(want, dt)))
          << "max |diff| " << max_abs_diff(got, want);
      continue;
    }
    ASSERT_TRUE(w.count(prefix + ".scales")) << "not quantized";
    const mx::array qw = w.at(prefix + ".weight"), s = w.at(prefix + ".scales"),
                    b = w.at(prefix + ".biases");
    EXPECT_EQ(s.dtype(), dt);
    EXPECT_EQ(b.dtype(), dt);
    const int bits = mode.bits, group = mode.group;
    const int cols = want.shape(-1);
    EXPECT_EQ(config_quant(config, prefix), std::make_pair(bits, group));
    ASSERT_EQ(qw.shape(1), cols * bits / 32);
    ASSERT_EQ(s.shape(1), cols / group);
    const int rows = want.shape(0);
    if (mode.how == "rounded") {
      ASSERT_NE(exact32, nullptr) << "rounded blocks need the float32 conversion to compare with";
      for (const char* part : {".weight", ".scales", ".biases"}) {
        const mx::array& ref = exact32->at(prefix + part);
        const mx::array& got = w.at(prefix + part);
        EXPECT_TRUE(same_bytes(got, part == std::string(".weight") ? ref : mx::astype(ref, dt)))
            << prefix << part << " is not the float32 conversion's, rounded to " << c.dtype;
      }
      continue;
    }
    const mx::array s32 = mx::astype(mx::slice(s, {0, 0}, {rows, s.shape(1)}), mx::float32);
    const mx::array b32 = mx::astype(mx::slice(b, {0, 0}, {rows, b.shape(1)}), mx::float32);
    mx::array got =
        mx::dequantize(mx::slice(qw, {0, 0}, {rows, qw.shape(1)}), s32, b32, group, bits);
    if (mode.how == "exact") {
      EXPECT_EQ(max_abs_diff(got, want), 0.0f);
      continue;
    }
    // Re-quantized (mx::quantize): within one grid step of the group, (max - min) / (2^bits - 1)
    // of the reference values (the grid is moved so that 0 is exact: a step at the clamped end),
    // plus the rounding of scale and bias to the dtype, eps * (n * scale + |bias|) <=
    // eps * (1.25 * range + max |w|) for the rescaled grid.
    const float eps = dtype_eps(dt), n = static_cast<float>((1 << bits) - 1);
    const mx::array g = mx::reshape(want, {rows, cols / group, group});
    const mx::array range = mx::subtract(mx::max(g, -1, true), mx::min(g, -1, true));
    const mx::array amax = mx::max(mx::abs(g), -1, true);
    const mx::array bound = mx::add(mx::multiply(range, mx::array(1.0f / n + 1.25f * eps)),
                                    mx::multiply(amax, mx::array(2.0f * eps + 1e-6f)));
    const mx::array err = mx::abs(mx::subtract(mx::reshape(got, {rows, cols / group, group}), g));
    EXPECT_TRUE(mx::all(mx::less_equal(err, bound)).item<bool>())
        << "max |diff| " << max_abs_diff(got, want) << " exceeds the bound for " << mode.how;
  }
}

TEST(GgufReader, TinyHeaderAndMetadata) {
  gguf::File f(test::data_path("convert/gguf/tiny.gguf"));
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_int("llama.block_count"), 2);
  EXPECT_NEAR(f.get_float("llama.attention.layer_norm_rms_epsilon"), 1e-5, 1e-12);
  EXPECT_FALSE(f.get_bool("tokenizer.ggml.add_bos_token"));
  EXPECT_EQ(f.get_array("tokenizer.ggml.tokens", gguf::ValueType::kString).size(), 267u);
  EXPECT_EQ(f.get_array("tokenizer.ggml.token_type", gguf::ValueType::kInt32)[266], 3);
  const gguf::TensorInfo& t = f.tensor("blk.0.attn_k.weight");
  EXPECT_EQ(t.type, gguf::GGMLType::kQ5_1);
  EXPECT_EQ(t.shape(), mx::Shape({128, 256}));
  EXPECT_EQ(t.nbytes, 128u * 8 * 24);
  EXPECT_THROW(f.tensor("nope"), Error);
  EXPECT_THROW(f.get_int("general.architecture"), Error);
}

TEST(ConvertGguf, TinyEveryType) {
  const Expected e = load_expected("tiny");
  check_dequantize("tiny", e);
  const fs::path src = test::data_path("convert/gguf/tiny.gguf");
  struct Variant {
    std::string flags;
    ConvertedCheck check;
  };
  const std::vector<Variant> variants = {
      {"", {}},
      {"--dtype float16", {.dtype = "float16"}},
      {"--dtype bfloat16", {.dtype = "bfloat16"}},
      {"--gguf-kquant-float", {.kquant_float = true}},
      {"--gguf-dequantize --dtype float16", {.dtype = "float16", .all_float = true}},
      {"--gguf-requant-bits 8 --gguf-requant-group-size 64",
       {.requant_bits = 8, .requant_group = 64}},
  };
  // The first variant (float32: every block exact) is what the rounded ones are compared with.
  TempDir exact_tmp;
  Weights exact32;
  for (const auto& v : variants) {
    SCOPED_TRACE("flags: " + v.flags);
    TempDir tmp;
    const fs::path out = (exact32.empty() ? exact_tmp : tmp) / "mlx";
    auto r = convert(src, out, v.flags);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    check_converted(out, e, v.check, &exact32);
    if (exact32.empty()) {
      ASSERT_FALSE(::testing::Test::HasFailure()) << "the float32 conversion must be exact";
      exact32 = load_model_weights(out);
    }
    const json config = read_json(out / "config.json");
    EXPECT_EQ(config["tie_word_embeddings"], false);  // tiny.gguf has output.weight
    EXPECT_EQ(config["torch_dtype"], v.check.dtype);
    EXPECT_EQ(config.contains("quantization"), !v.check.all_float);
  }
}

TEST(ConvertGguf, SmolLM2Q4_1Lossless) {
  const Expected e = load_expected("smollm2");
  check_dequantize("smollm2", e);
  TempDir tmp;
  const fs::path out = tmp / "smollm2";
  auto r = convert(test::data_path("convert/gguf/smollm2.gguf"), out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  check_converted(out, e, {});

  const json c = read_json(out / "config.json");
  EXPECT_EQ(c["model_type"], "llama");
  EXPECT_EQ(c["hidden_size"], 576);
  EXPECT_EQ(c["intermediate_size"], 1536);
  EXPECT_EQ(c["num_hidden_layers"], 30);
  EXPECT_EQ(c["num_attention_heads"], 9);
  EXPECT_EQ(c["num_key_value_heads"], 3);
  EXPECT_EQ(c["head_dim"], 64);
  EXPECT_EQ(c["vocab_size"], 49152);
  EXPECT_EQ(c["max_position_embeddings"], 8192);
  EXPECT_EQ(c["rms_norm_eps"], 1e-5);
  EXPECT_EQ(c["rope_theta"], 100000.0);
  EXPECT_EQ(c["tie_word_embeddings"], true);
  const json quant = {{"group_size", 32},
                      {"bits", 4},
                      {"mode", "affine"},
                      {"model.embed_tokens", {{"group_size", 32}, {"bits", 8}}}};
  EXPECT_EQ(c["quantization"], quant);
  EXPECT_EQ(c["quantization_config"], quant);
  Weights w = load_model_weights(out);
  EXPECT_EQ(w.size(), 61u + 211u * 3);  // norms + (weight, scales, biases) per quantized matrix
  EXPECT_FALSE(w.count("lm_head.weight"));

  const json tok = read_json(out / "tokenizer.json");
  EXPECT_EQ(tok["model"]["type"], "BPE");
  EXPECT_EQ(tok["model"]["vocab"].size(), 49152u);
  EXPECT_EQ(tok["model"]["merges"].size(), 48900u);
  EXPECT_EQ(tok["pre_tokenizer"]["pretokenizers"][0]["type"], "Digits");
  const json tc = read_json(out / "tokenizer_config.json");
  EXPECT_EQ(tc["eos_token"], "<|im_end|>");
  EXPECT_TRUE(tc["chat_template"].get<std::string>().find("<|im_start|>") != std::string::npos);
  const json gc = read_json(out / "generation_config.json");
  EXPECT_EQ(gc["eos_token_id"], json::array({2, 0}));  // eos, then <|endoftext|>
}

TEST(ConvertGguf, Gemma3Q4_K_M) {
  const Expected e = load_expected("gemma3");
  check_dequantize("gemma3", e);  // Q4_K, Q6_K, Q5_0, Q8_0, F32
  TempDir tmp;
  const fs::path out = tmp / "gemma3";
  auto r = convert(test::data_path("convert/gguf/gemma3.gguf"), out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  check_converted(out, e, {});

  const json c = read_json(out / "config.json");
  EXPECT_EQ(c["model_type"], "gemma3_text");
  EXPECT_EQ(c["hidden_size"], 640);
  EXPECT_EQ(c["intermediate_size"], 2048);
  EXPECT_EQ(c["num_hidden_layers"], 18);
  EXPECT_EQ(c["num_attention_heads"], 4);
  EXPECT_EQ(c["num_key_value_heads"], 1);
  EXPECT_EQ(c["head_dim"], 256);
  EXPECT_EQ(c["query_pre_attn_scalar"], 256);
  EXPECT_EQ(c["sliding_window"], 512);
  EXPECT_EQ(c["sliding_window_pattern"], 6);
  EXPECT_EQ(c["rope_theta"], 1000000.0);
  EXPECT_EQ(c["rope_local_base_freq"], 10000.0);
  EXPECT_EQ(c["rms_norm_eps"], 1e-6);
  EXPECT_EQ(c["vocab_size"], 262144);
  EXPECT_EQ(c["max_position_embeddings"], 32768);
  EXPECT_EQ(c["tie_word_embeddings"], true);
  EXPECT_EQ(c["quantization"]["bits"], 5);  // Q5_0 is the most common type
  EXPECT_EQ(c["quantization"]["model.embed_tokens"], json({{"group_size", 32}, {"bits", 8}}));

  Weights w = load_model_weights(out);
  for (int i = 0; i < 18; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    for (const char* n :
         {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
          "post_feedforward_layernorm", "self_attn.q_norm", "self_attn.k_norm"})
      EXPECT_TRUE(w.count(p + n + ".weight")) << p << n;
    for (const char* n : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                          "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"})
      EXPECT_TRUE(w.count(p + n + ".scales")) << p << n;
  }
  const json tok = read_json(out / "tokenizer.json");
  EXPECT_EQ(tok["model"]["byte_fallback"], true);
  EXPECT_EQ(tok["normalizer"]["type"], "Replace");
  EXPECT_EQ(tok["post_processor"]["type"], "TemplateProcessing");  // adds <bos>
  EXPECT_EQ(read_json(out / "generation_config.json")["eos_token_id"], json::array({1, 106}));
}

// ---------------------------------------------------------------------------------------------
// Bad inputs: exit 1, a message naming the problem, nothing left at the destination.

class ConvertBadInput : public ::testing::Test {
 protected:
  void expect_failure(const fs::path& src, const std::string& needle, const std::string& flags = "",
                      const fs::path& dst = {}) {
    const fs::path out = dst.empty() ? tmp_ / "out" : dst;
    auto r = convert(src, out, flags);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos)
        << "stderr does not mention '" << needle << "':\n"
        << r.err;
    if (dst.empty()) {
      EXPECT_FALSE(fs::exists(out));
    }
    EXPECT_FALSE(fs::exists(fs::path(out.string() + ".partial")));
  }
  fs::path copy_tiny(const std::string& name, size_t keep_bytes) {
    const fs::path src = test::data_path("convert/gguf/tiny.gguf");
    const fs::path p = tmp_ / name;
    fs::copy_file(src, p);
    fs::resize_file(p, keep_bytes);
    return p;
  }
  TempDir tmp_;
};

TEST_F(ConvertBadInput, MissingFile) { expect_failure(tmp_ / "nope.gguf", "not found"); }

TEST_F(ConvertBadInput, TruncatedTensorData) {
  const size_t size = fs::file_size(test::data_path("convert/gguf/tiny.gguf"));
  expect_failure(copy_tiny("cut.gguf", size / 2), "extends past the end of the file");
}

TEST_F(ConvertBadInput, TruncatedMetadata) {
  expect_failure(copy_tiny("head.gguf", 200), "truncated");
}

TEST_F(ConvertBadInput, BadMagic) {
  const fs::path p = tmp_ / "magic.gguf";
  std::ofstream(p, std::ios::binary) << "GGML" << std::string(64, '\0');
  expect_failure(p, "bad magic");
}

TEST_F(ConvertBadInput, BadVersion) {
  const fs::path p =
      copy_tiny("version.gguf", fs::file_size(test::data_path("convert/gguf/tiny.gguf")));
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(4);
  const uint32_t v = 99;
  f.write(reinterpret_cast<const char*>(&v), 4);
  f.close();
  expect_failure(p, "unsupported GGUF version 99");
}

TEST_F(ConvertBadInput, UnsupportedTensorType) {
  expect_failure(test::data_path("convert/gguf/tiny_q2k.gguf"), "Q2_K");
}

TEST_F(ConvertBadInput, HfDirectoryWithoutConfig) {
  fs::create_directories(tmp_ / "hf");
  expect_failure(tmp_ / "hf", "config.json");
}

TEST_F(ConvertBadInput, UnsupportedModelType) {
  fs::create_directories(tmp_ / "hf");
  std::ofstream(tmp_ / "hf" / "config.json") << R"({"model_type": "bert"})";
  expect_failure(tmp_ / "hf", "model_type 'bert' is not supported");
}

// The families converted through their architecture check the sanitized tensors as mlx-lm's
// strict load does: a misshapen tensor, a missing one and one the model lacks are named.
// transformers' float gpt-oss experts (experts.gate_up_proj, (experts, hidden, 2 x inter)) are
// refused as mlx-lm refuses them: its sanitize renames them to a name without `.weight`.
TEST_F(ConvertBadInput, FamilyTensorsNotMatchingTheConfig) {
  auto broken = [&](const std::string& name, const std::function<void(Weights&)>& edit) {
    const fs::path src = test::data_path("convert/hf/" + name + "/src");
    const fs::path dir = tmp_ / ("broken_" + name);
    fs::create_directories(dir);
    for (const auto& e : fs::directory_iterator(src))
      if (e.path().filename() != "model.safetensors")
        fs::copy_file(e.path(), dir / e.path().filename());
    Weights w = load_safetensors(src / "model.safetensors");
    edit(w);
    save_safetensors(dir / "model.safetensors", w);
    return dir;
  };
  const std::string q = "model.layers.1.self_attn.q_proj.weight";
  expect_failure(broken("glm4_bf16",
                        [&](Weights& w) {
                          w.insert_or_assign(q, mx::zeros({32, 64}, mx::bfloat16));
                        }),
                 "tensor '" + q + "' has shape [32, 64], expected [64, 64]");
  expect_failure(broken("olmo2_bf16_inv_freq", [&](Weights& w) { w.erase(q); }),
                 "missing tensor '" + q + "', expected shape [64, 64]");
  expect_failure(broken("phi3_bf16",
                        [](Weights& w) {
                          w.insert_or_assign("model.layers.0.mlp.extra.weight", mx::ones({2}));
                        }),
                 "model.layers.0.mlp.extra.weight");
  const fs::path gpt = broken("gpt_oss_mxfp4", [](Weights& w) {
    for (int i = 0; i < 2; ++i) {
      const std::string m = "model.layers." + std::to_string(i) + ".mlp.experts.";
      for (const char* k :
           {"gate_up_proj_blocks", "gate_up_proj_scales", "down_proj_blocks", "down_proj_scales"})
        w.erase(m + k);
      w.insert_or_assign(m + "gate_up_proj", mx::zeros({4, 64, 128}, mx::bfloat16));
      w.insert_or_assign(m + "down_proj", mx::zeros({4, 64, 64}, mx::bfloat16));
    }
  });
  json config = read_json(gpt / "config.json");
  config.erase("quantization_config");
  std::ofstream(gpt / "config.json") << config.dump();
  expect_failure(gpt, "missing tensor 'model.layers.0.mlp.experts.gate_proj.weight'");
}

TEST_F(ConvertBadInput, DestinationExists) {
  const fs::path dst = tmp_ / "taken";
  fs::create_directories(dst);
  std::ofstream(dst / "file") << "x";
  expect_failure(test::data_path("convert/gguf/tiny.gguf"), "already exists", "", dst);
  EXPECT_TRUE(fs::exists(dst / "file"));
}

TEST_F(ConvertBadInput, BadFlags) {
  const fs::path src = test::data_path("convert/gguf/tiny.gguf");
  expect_failure(src, "--dtype 'float8'", "--dtype float8");
  expect_failure(src, "bits 7", "-q --q-bits 7");
  expect_failure(src, "group size 48", "--gguf-requant-group-size 48");
  expect_failure(src, "unknown flag", "--bogus");
}

}  // namespace
}  // namespace lmx

namespace lmx {
namespace {

// ---------------------------------------------------------------------------------------------
// Crash safety: `lmx convert` builds the model in "<dst>.partial" and renames it at the end, so
// a kill -9 at any moment leaves nothing at the destination, and a second run succeeds.

pid_t spawn_convert(const fs::path& src, const fs::path& dst) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::dup2(null, 2);
    const std::string bin = test::lmx_binary().string();
    ::execl(bin.c_str(), bin.c_str(), "convert", "--hf-path", src.c_str(), "--mlx-path",
            dst.c_str(), "--quiet", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

// Runs a conversion, waits until `ready` holds (polling every millisecond), kills it with SIGKILL
// and returns whether it was killed (false: it finished first, with exit code 0).
bool kill_when(const fs::path& src, const fs::path& dst, const std::function<bool()>& ready) {
  const pid_t pid = spawn_convert(src, dst);
  EXPECT_GT(pid, 0);
  int status = 0;
  for (;;) {
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "convert failed on its own";
      return false;
    }
    if (ready()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return WIFSIGNALED(status);
}

// The largest safetensors file being written in the staging directory, in bytes.
uintmax_t staged_bytes(const fs::path& partial) {
  uintmax_t most = 0;
  std::error_code ec;
  for (fs::directory_iterator it(partial, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code e2;
    if (it->path().string().find(".safetensors") != std::string::npos)
      most = std::max(most, fs::file_size(it->path(), e2));
  }
  return most;
}

TEST(ConvertCrashSafety, KillAtAnyMomentLeavesNoModel) {
  const fs::path src = test::data_path("convert/gguf/smollm2.gguf");
  TempDir tmp;
  const fs::path out = tmp / "model";
  const fs::path partial = out.string() + ".partial";
  struct Moment {
    std::string name;
    std::function<bool()> ready;
  };
  std::vector<Moment> moments = {
      {"staging directory created", [&] { return fs::exists(partial); }},
      {"tensor data being written", [&] { return staged_bytes(partial) > (1u << 20); }},
      {"config.json staged", [&] { return fs::exists(partial / "config.json"); }},
  };
  // LMX_HEAVY=1: also every 20 ms from the start, through the whole conversion.
  if (const char* h = std::getenv("LMX_HEAVY"); h && std::string(h) == "1") {
    for (int ms = 0; ms < 4000; ms += 20) {
      const auto start = std::make_shared<std::chrono::steady_clock::time_point>();
      moments.push_back({"after " + std::to_string(ms) + " ms", [start, ms] {
                           if (*start == std::chrono::steady_clock::time_point{})
                             *start = std::chrono::steady_clock::now();
                           return std::chrono::steady_clock::now() - *start >=
                                  std::chrono::milliseconds(ms);
                         }});
    }
  }
  int killed = 0;
  for (size_t i = 0; i < moments.size(); ++i) {
    const Moment& m = moments[i];
    SCOPED_TRACE("killed when: " + m.name);
    // The named moments are short windows polled every millisecond: a conversion may pass one
    // unseen, the more often the busier the machine (5 attempts missed one once on the loaded
    // 2-core VM), so each gets up to 25 conversions to be killed in; it ends at the first kill.
    const int attempts = i < 3 ? 25 : 1;
    for (int a = 0; a < attempts; ++a) {
      const bool was_killed = kill_when(src, out, m.ready);
      if (was_killed && !fs::exists(out)) {
        ++killed;
        break;
      }
      // It finished before the moment came, or the kill landed after the rename into place (the
      // poll races the process's last steps: "config.json staged" is the moment before it). The
      // model must then be whole, with nothing staged beside it; start over.
      EXPECT_TRUE(fs::exists(out / "config.json"));
      EXPECT_FALSE(fs::exists(partial)) << "a staging directory beside a finished model";
      if (was_killed) {
        EXPECT_EQ(load_model_weights(out).size(), 61u + 211u * 3)
            << "a killed conversion left an incomplete model at " << out;
      }
      fs::remove_all(out);
    }
  }
  EXPECT_GE(killed, 3) << "the conversion ended before the moments it should be killed at";
  // A later conversion replaces the stale staging directory and gives a model that loads.
  auto r = convert(src, out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(fs::exists(partial));
  EXPECT_EQ(load_model_weights(out).size(), 61u + 211u * 3);
}

TEST(SafetensorsWrite, RenamedIntoPlaceWithNothingLeftBeside) {
  TempDir tmp;
  const fs::path file = tmp / "a.safetensors";
  save_safetensors(file, {{"x", mx::array({1.0f, 2.0f})}});
  save_safetensors(file, {{"y", mx::array({3.0f})}});  // replaces the whole file
  const Weights w = load_safetensors(file);
  EXPECT_EQ(w.size(), 1u);
  EXPECT_TRUE(w.count("y"));
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(tmp.path())) names.push_back(e.path().filename());
  EXPECT_EQ(names, std::vector<std::string>{"a.safetensors"});
  // An unwritable place: an error naming the file, no temporary left.
  EXPECT_THROW(save_safetensors(tmp / "no" / "such" / "b.safetensors", {{"x", mx::array(1.0f)}}),
               Error);
  EXPECT_FALSE(fs::exists(tmp / "no"));
}

}  // namespace
}  // namespace lmx
