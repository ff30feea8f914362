// Bad input gives a clear message naming the problem and exit code 1, never a crash.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "models/model.h"
#include "test_util.h"

namespace lmx {
namespace {

namespace fs = std::filesystem;

// A tiny llama with random weights in a fresh temporary directory.
class BadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("lmx_bad_input_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    config_ = {
        {"model_type", "llama"},   {"hidden_size", 32},        {"num_hidden_layers", 1},
        {"intermediate_size", 64}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
        {"rms_norm_eps", 1e-5},    {"vocab_size", 64},         {"tie_word_embeddings", true}};
    write_config();
    mx::random::seed(0);
    auto r = [](mx::Shape s) { return mx::astype(mx::random::normal(s), mx::bfloat16); };
    weights_ = {{"model.embed_tokens.weight", r({64, 32})},
                {"model.norm.weight", r({32})},
                {"model.layers.0.input_layernorm.weight", r({32})},
                {"model.layers.0.post_attention_layernorm.weight", r({32})},
                {"model.layers.0.self_attn.q_proj.weight", r({32, 32})},
                {"model.layers.0.self_attn.k_proj.weight", r({16, 32})},
                {"model.layers.0.self_attn.v_proj.weight", r({16, 32})},
                {"model.layers.0.self_attn.o_proj.weight", r({32, 32})},
                {"model.layers.0.mlp.gate_proj.weight", r({64, 32})},
                {"model.layers.0.mlp.up_proj.weight", r({64, 32})},
                {"model.layers.0.mlp.down_proj.weight", r({32, 64})}};
    save_safetensors(dir_ / "model.safetensors", weights_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write_config() { std::ofstream(dir_ / "config.json") << config_.dump(); }
  void write_file(const std::string& name, const std::string& bytes) {
    std::ofstream(dir_ / name, std::ios::binary) << bytes;
  }
  std::string read_file(const std::string& name) {
    std::ifstream in(dir_ / name, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  // Loading must fail with an lmx::Error whose message contains `needle`; the CLI must exit 1
  // with the same message on stderr.
  void expect_load_error(const std::string& needle) {
    try {
      load_model(dir_);
      ADD_FAILURE() << "load_model succeeded, expected an error containing '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    auto r = test::run_lmx("generate --model " + dir_.string() + " --prompt hi");
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
  }

  fs::path dir_;
  nlohmann::json config_;
  Weights weights_;
};

TEST_F(BadInput, ValidModelLoads) { EXPECT_NO_THROW(load_model(dir_)); }

TEST_F(BadInput, MissingDirectory) {
  fs::remove_all(dir_);
  expect_load_error("model directory does not exist");
}

TEST_F(BadInput, MissingConfig) {
  fs::remove(dir_ / "config.json");
  expect_load_error("config.json not found");
}

TEST_F(BadInput, GarbledConfig) {
  write_file("config.json", "{\"model_type\": \"llama\", \"hidden_size\": ");
  expect_load_error("invalid JSON");
}

TEST_F(BadInput, MissingRequiredKey) {
  config_.erase("hidden_size");
  write_config();
  expect_load_error("missing required key 'hidden_size'");
}

TEST_F(BadInput, WrongTypeKey) {
  config_["num_hidden_layers"] = "two";
  write_config();
  expect_load_error("key 'num_hidden_layers' has the wrong type");
}

TEST_F(BadInput, UnknownModelType) {
  config_["model_type"] = "transformer-xl";
  write_config();
  expect_load_error("unsupported model_type 'transformer-xl'");
}

TEST_F(BadInput, NoWeights) {
  fs::remove(dir_ / "model.safetensors");
  expect_load_error("no model*.safetensors files found");
}

TEST_F(BadInput, TruncatedSafetensors) {
  std::string bytes = read_file("model.safetensors");
  write_file("model.safetensors", bytes.substr(0, bytes.size() - 100));
  expect_load_error("truncated file?");
}

TEST_F(BadInput, TruncatedHeader) {
  std::string bytes = read_file("model.safetensors");
  write_file("model.safetensors", bytes.substr(0, 40));
  expect_load_error("exceeds the file size");
}

TEST_F(BadInput, CorruptHeader) {
  std::string bytes = read_file("model.safetensors");
  bytes[8] = '#';  // the header's opening brace
  write_file("model.safetensors", bytes);
  expect_load_error("corrupt safetensors header");
}

TEST_F(BadInput, HugeHeaderLength) {
  std::string bytes = read_file("model.safetensors");
  const uint64_t n = 1ull << 40;
  bytes.replace(0, 8, reinterpret_cast<const char*>(&n), 8);
  write_file("model.safetensors", bytes);
  expect_load_error("header length");
}

TEST_F(BadInput, MissingTensor) {
  weights_.erase("model.layers.0.mlp.up_proj.weight");
  save_safetensors(dir_ / "model.safetensors", weights_);
  expect_load_error("missing tensor 'model.layers.0.mlp.up_proj.weight'");
}

TEST_F(BadInput, WrongShape) {
  weights_.insert_or_assign("model.layers.0.self_attn.k_proj.weight",
                            mx::zeros({32, 32}, mx::bfloat16));
  save_safetensors(dir_ / "model.safetensors", weights_);
  expect_load_error(
      "tensor 'model.layers.0.self_attn.k_proj.weight' has shape [32, 32], "
      "expected [16, 32]");
}

TEST_F(BadInput, UnexpectedTensor) {
  weights_.insert_or_assign("model.layers.7.mlp.extra.weight", mx::zeros({2}, mx::bfloat16));
  save_safetensors(dir_ / "model.safetensors", weights_);
  expect_load_error("unexpected tensors not used by the model: model.layers.7.mlp.extra.weight");
}

TEST_F(BadInput, BadHeadRatio) {
  config_["num_key_value_heads"] = 3;
  write_config();
  expect_load_error("is not a multiple of num_key_value_heads 3");
}

TEST_F(BadInput, UnsupportedRopeScaling) {
  config_["rope_scaling"] = {{"type", "mystery"}, {"factor", 2.0}};
  write_config();
  expect_load_error("unsupported rope_scaling type 'mystery'");
}

TEST_F(BadInput, UnknownLayerType) {
  config_["layer_types"] = {"chunked_attention"};
  write_config();
  expect_load_error(
      "[config.json] layer_types entry \"chunked_attention\" is not supported, expected "
      "\"full_attention\" or \"sliding_attention\"");
}

TEST_F(BadInput, LayerTypesWithoutFullLayer) {
  config_["layer_types"] = {"sliding_attention"};
  config_["sliding_window"] = 8;
  write_config();
  expect_load_error("[config.json] layer_types has no \"full_attention\" layer");
}

TEST_F(BadInput, LayerTypesCount) {
  config_["layer_types"] = {"full_attention", "full_attention"};
  write_config();
  expect_load_error("[config.json] layer_types must list num_hidden_layers (1) entries");
}

// A key the family needs, absent: the error names config.json and the key.
TEST_F(BadInput, FamilyKeysRequired) {
  const std::vector<std::pair<std::string, nlohmann::json>> cases = {
      {"granite", {{"logits_scaling", 1.0}, {"embedding_multiplier", 1.0}}},
      {"qwen3_moe", {{"head_dim", 8}}},
      {"glm4", {{"attention_bias", false}, {"head_dim", 8}}},
      {"gemma2", {}},
      {"gpt_oss", {{"head_dim", 8}}},
  };
  const std::vector<std::string> missing = {"attention_multiplier", "num_experts",
                                            "partial_rotary_factor", "head_dim",
                                            "num_local_experts"};
  const nlohmann::json llama = config_;
  for (size_t i = 0; i < cases.size(); ++i) {
    config_ = llama;
    config_["model_type"] = cases[i].first;
    for (const auto& [k, v] : cases[i].second.items()) config_[k] = v;
    write_config();
    SCOPED_TRACE(cases[i].first);
    expect_load_error("[config.json] missing required key '" + missing[i] + "'");
  }
}

// gpt-oss's layer_types: an unknown entry is named with its index; both kinds must appear.
TEST_F(BadInput, GptOssLayerTypes) {
  config_["model_type"] = "gpt_oss";
  config_["num_hidden_layers"] = 2;
  config_["head_dim"] = 8;
  config_["num_local_experts"] = 4;
  config_["num_experts_per_tok"] = 2;
  config_["sliding_window"] = 8;
  config_["rope_theta"] = 150000;
  config_["layer_types"] = {"sliding_attention", "chunked_attention"};
  write_config();
  expect_load_error(
      "[config.json] layer_types[1] is \"chunked_attention\", expected \"full_attention\" or "
      "\"sliding_attention\"");
  config_["layer_types"] = {"full_attention", "full_attention"};
  write_config();
  expect_load_error(
      "[config.json] layer_types must have both a \"sliding_attention\" and a "
      "\"full_attention\" layer");
  config_.erase("sliding_window");
  write_config();
  expect_load_error("[config.json] missing required key 'sliding_window'");
}

TEST_F(BadInput, Phi3RopeScalingKeys) {
  config_["model_type"] = "phi3";
  config_["rope_scaling"] = {{"type", "longrope"}, {"short_factor", 1.0}};
  write_config();
  expect_load_error("[config.json] rope_scaling must contain keys long_factor and type");
}

TEST(BadCli, UnknownCommandAndFlag) {
  auto r = test::run_lmx("frobnicate");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("unknown command 'frobnicate'"), std::string::npos) << r.err;
  r = test::run_lmx("generate --model x --prompt y --bogus 1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("unknown flag '--bogus'"), std::string::npos) << r.err;
  r = test::run_lmx("generate --model x --prompt y --max-tokens ten");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--max-tokens expects an integer, got 'ten'"), std::string::npos) << r.err;
  r = test::run_lmx("generate --prompt y");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("missing required flag --model"), std::string::npos) << r.err;
}

TEST(BadCli, HelpEverywhere) {
  for (const char* cmd : {"--help", "generate --help", "convert --help", "bench --help"}) {
    auto r = test::run_lmx(cmd);
    EXPECT_EQ(r.exit_code, 0) << cmd << ": " << r.err;
    EXPECT_NE(r.out.find("usage: lmx"), std::string::npos) << cmd << ": " << r.out;
  }
}

}  // namespace
}  // namespace lmx
