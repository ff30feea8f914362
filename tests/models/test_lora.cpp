// LoRA / DoRA / full fine-tune adapters in mlx-lm's format (scripts/gen_lora_fixtures.py writes
// $LMX_TEST_DATA/lora/<row>/: a tiny random model, its adapter/ made with mlx-lm's own
// linear_to_lora_layers, and mlx-lm's logits of generate_step's calls with the adapter loaded).
// Tier L1 with the adapter: every call's logits bit-identical to mlx-lm's. Tier L3 with the
// adapter: the gates of docs/cpu.md against L1 with the adapter. Bad adapters: errors naming the
// file, the tensor and the shapes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/json.h"
#include "io/safetensors.h"
#include "models/model.h"
#include "test_util.h"
#include "tier_gate.h"

namespace lmx {
namespace {

namespace fs = std::filesystem;

fs::path lora_dir() {
  const char* env = std::getenv("LMX_TEST_DATA");
  return (env ? fs::path(env) : fs::path(LMX_DEFAULT_TEST_DATA)) / "lora";
}

// Rows of lora/index.json (read while gtest registers the tests); `fast_only` keeps the float32
// quantized rows, where tier L3 runs the CPU kernels and is gated against L1.
std::vector<std::string> rows(bool fast_only) {
  std::vector<std::string> out;
  try {
    json meta = read_json_file(lora_dir() / "index.json");
    for (const auto& r : meta.at("rows")) {
      if (fast_only && (r.at("quantization").is_null() || r.at("dtype") != "float32")) continue;
      out.push_back(r.at("name").get<std::string>());
    }
  } catch (const std::exception&) {
    out.clear();
  }
  if (out.empty()) out.emplace_back("missing_lora_index");
  return out;
}

struct Call {
  std::string key;
  mx::array tokens = mx::array(0);
  mx::array logits = mx::array(0);
};

std::vector<Call> load_calls(const fs::path& dir) {
  json meta = read_json_file(dir / "reference.json");
  Weights arrays = load_safetensors(dir / "reference.safetensors");
  std::vector<Call> calls;
  for (const auto& c : meta.at("calls")) {
    const std::string key = c.at("key").get<std::string>();
    calls.push_back({key, arrays.at(key + ".tokens"), arrays.at(key + ".logits")});
  }
  return calls;
}

// max |a - b| over the logits, or -1 when shape or dtype differ.
float max_diff(const mx::array& a, const mx::array& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return -1.0f;
  return mx::max(mx::abs(mx::subtract(mx::astype(a, mx::float32), mx::astype(b, mx::float32))))
      .item<float>();
}

LoadedWeights load_row(const std::string& row, bool exact, bool with_adapter = true) {
  const fs::path dir = test::data_path("lora/" + row);
  LoadOptions o{.exact = exact};
  if (with_adapter) o.adapter_path = dir / "adapter";
  return load_model(dir, o);
}

class LoraParity : public ::testing::TestWithParam<std::string> {};

// Every generate_step call (prefill chunks, the last prompt token, greedy decode steps) with the
// recorded tokens: lmx's logits equal mlx-lm's in shape, dtype and every bit.
TEST_P(LoraParity, LogitsBitIdentical) {
  ASSERT_NE(GetParam(), "missing_lora_index") << "run scripts/gen_lora_fixtures.py";
  const fs::path dir = test::data_path("lora/" + GetParam());
  const auto calls = load_calls(dir);
  ASSERT_FALSE(calls.empty());
  LoadedWeights lw = load_row(GetParam(), /*exact=*/true);
  Cache cache = lw.model->make_cache();
  for (const auto& c : calls) {
    mx::array logits = (*lw.model)(c.tokens, cache);
    mx::eval(logits);
    EXPECT_EQ(max_diff(logits, c.logits), 0.0f)
        << GetParam() << " " << c.key << ": shape " << shape_str(logits.shape()) << " "
        << dtype_name(logits.dtype());
  }
}

// The adapter matters: without it the first call's logits differ from mlx-lm's with it.
TEST_P(LoraParity, BaseModelDiffers) {
  const auto calls = load_calls(test::data_path("lora/" + GetParam()));
  LoadedWeights lw = load_row(GetParam(), /*exact=*/true, /*with_adapter=*/false);
  Cache cache = lw.model->make_cache();
  mx::array logits = (*lw.model)(calls[0].tokens, cache);
  EXPECT_GT(max_diff(logits, calls[0].logits), 1e-2f);
}

INSTANTIATE_TEST_SUITE_P(Rows, LoraParity, ::testing::ValuesIn(rows(false)),
                         [](const auto& info) { return info.param; });

class LoraTiers : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ASSERT_NE(GetParam(), "missing_lora_index") << "run scripts/gen_lora_fixtures.py";
    exact_ = load_row(GetParam(), true);
    fast_ = load_row(GetParam(), false);
    ASSERT_TRUE(fast_.cpu_kernels) << "the default load must select tier L3 on the CPU";
    vocab_ = exact_.info.config.at("vocab_size").get<int>();
  }
  LoadedWeights exact_, fast_;
  int vocab_ = 0;
};

// docs/cpu.md's gates, both tiers with the adapter; and a dropped adapter would fail them.
TEST_P(LoraTiers, TeacherForcedDistributionsAgree) {
  const auto tokens = test::random_tokens(512, vocab_, std::hash<std::string>{}(GetParam()));
  const auto r = test::compare_teacher_forced(*exact_.model, *fast_.model, tokens);
  EXPECT_GT(r.max_abs_diff, 0) << "L3 ran exactly L1's ops";
  EXPECT_LE(r.mean_kl, 1e-3);
  EXPECT_GE(r.top1_agree, 0.98);
  RecordProperty("mean_kl", std::to_string(r.mean_kl));
  LoadedWeights base = load_row(GetParam(), false, /*with_adapter=*/false);
  const auto dropped = test::compare_teacher_forced(*exact_.model, *base.model, tokens);
  EXPECT_GT(dropped.mean_kl, 1e-2) << "the adapter barely changes this row's distributions";
}

TEST_P(LoraTiers, GreedyOutputsAgree) {
  int same = 0;
  for (unsigned p = 0; p < 4; ++p) {
    const auto prompt = test::random_tokens(12, vocab_, 2000 + p);
    same += test::greedy(*exact_.model, prompt, 64) == test::greedy(*fast_.model, prompt, 64);
  }
  EXPECT_GE(same, 3) << "greedy outputs identical to L1 on " << same << " of 4 prompts";
}

INSTANTIATE_TEST_SUITE_P(Rows, LoraTiers, ::testing::ValuesIn(rows(true)),
                         [](const auto& info) { return info.param; });

// A copy of a row's adapter in a scratch directory, to break.
class BadAdapter : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = test::data_path("lora/llama_lora_last1");
    dir_ = fs::temp_directory_path() /
           ("lmx_lora_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::copy(model_ / "adapter", dir_, fs::copy_options::recursive);
    config_ = read_json_file(dir_ / "adapter_config.json");
    weights_ = load_safetensors(dir_ / "adapters.safetensors");
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write() {
    std::ofstream(dir_ / "adapter_config.json") << config_.dump(2);
    save_safetensors(dir_ / "adapters.safetensors", weights_);
  }
  // The load's error message; fails the test when the load succeeds.
  std::string error(const fs::path& adapter) {
    try {
      load_model(model_, {.exact = true, .adapter_path = adapter});
    } catch (const Error& e) {
      return e.what();
    }
    ADD_FAILURE() << "the adapter loaded";
    return "";
  }
  std::string error() { return error(dir_); }

  fs::path model_, dir_;
  json config_;
  Weights weights_;
};

TEST_F(BadAdapter, TheUnchangedCopyLoads) {
  EXPECT_NO_THROW(load_model(model_, {.adapter_path = dir_}));
}

TEST_F(BadAdapter, MissingDirectory) {
  const std::string e = error(dir_ / "nope");
  EXPECT_NE(e.find("adapter directory does not exist"), std::string::npos) << e;
  EXPECT_NE(e.find("nope"), std::string::npos) << e;
}

TEST_F(BadAdapter, MissingFiles) {
  fs::remove(dir_ / "adapters.safetensors");
  std::string e = error();
  EXPECT_NE(e.find("adapters.safetensors not found"), std::string::npos) << e;
  fs::remove(dir_ / "adapter_config.json");
  e = error();
  EXPECT_NE(e.find("adapter_config.json not found"), std::string::npos) << e;
}

TEST_F(BadAdapter, UnknownTensor) {
  // num_layers 1 of 2: layer 0 is not adapted, and q_prj is no module.
  weights_.insert_or_assign("model.layers.0.self_attn.q_proj.lora_a",
                            weights_.at("model.layers.1.self_attn.q_proj.lora_a"));
  weights_.insert_or_assign("model.layers.1.self_attn.q_prj.lora_b",
                            weights_.at("model.layers.1.self_attn.q_proj.lora_b"));
  write();
  const std::string e = error();
  EXPECT_NE(e.find("adapters.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("not adapter parameters of the model"), std::string::npos) << e;
  EXPECT_NE(e.find("model.layers.0.self_attn.q_proj.lora_a"), std::string::npos) << e;
  EXPECT_NE(e.find("model.layers.1.self_attn.q_prj.lora_b"), std::string::npos) << e;
}

TEST_F(BadAdapter, WrongShape) {
  weights_.insert_or_assign("model.layers.1.mlp.up_proj.lora_b", mx::zeros({4, 127}));
  write();
  const std::string e = error();
  EXPECT_NE(e.find("'model.layers.1.mlp.up_proj.lora_b' has shape [4, 127], expected [4, 128]"),
            std::string::npos)
      << e;
}

TEST_F(BadAdapter, RankMismatch) {
  config_["lora_parameters"]["rank"] = 8;  // the tensors have rank 4
  write();
  const std::string e = error();
  EXPECT_NE(e.find("'model.layers.1.self_attn.q_proj.lora_a' has shape [64, 4], expected [64, 8]"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("lora_parameters.rank 8"), std::string::npos) << e;
}

TEST_F(BadAdapter, MissingTensor) {
  weights_.erase("model.layers.1.self_attn.v_proj.lora_b");
  write();
  const std::string e = error();
  EXPECT_NE(e.find("missing tensor 'model.layers.1.self_attn.v_proj.lora_b'"), std::string::npos)
      << e;
}

TEST_F(BadAdapter, BadConfigFields) {
  config_["lora_parameters"].erase("scale");
  config_["lora_parameters"]["alpha"] = 16;
  write();
  std::string e = error();
  EXPECT_NE(e.find("'alpha'"), std::string::npos) << e;
  config_["lora_parameters"]["scale"] = 2.0;
  config_["fine_tune_type"] = "qlora";
  write();
  e = error();
  EXPECT_NE(e.find("fine_tune_type must be lora, dora or full, got 'qlora'"), std::string::npos)
      << e;
  config_["fine_tune_type"] = "lora";
  config_["num_layers"] = "all";
  write();
  e = error();
  EXPECT_NE(e.find("'num_layers' has the wrong type"), std::string::npos) << e;
  config_["num_layers"] = 1;
  config_["lora_parameters"]["keys"] = "self_attn.q_proj";
  write();
  e = error();
  EXPECT_NE(e.find("keys must be a list"), std::string::npos) << e;
}

TEST_F(BadAdapter, FullFineTuneUnknownTensor) {
  config_["fine_tune_type"] = "full";
  weights_ = {{"model.layers.1.self_attn.q_proj.weight", mx::zeros({64, 64}, mx::bfloat16)},
              {"model.layers.1.self_attn.q_proj.lora_a", mx::zeros({64, 4})}};
  write();
  const std::string e = error();
  EXPECT_NE(e.find("'model.layers.1.self_attn.q_proj.lora_a' is not a parameter of the model"),
            std::string::npos)
      << e;
}

TEST_F(BadAdapter, DoraOnTheEmbedding) {
  config_["fine_tune_type"] = "dora";
  config_["lora_parameters"]["keys"] = {"model.embed_tokens"};
  write();
  const std::string e = error();
  EXPECT_NE(e.find("DoRA on the embedding 'model.embed_tokens' is not supported"),
            std::string::npos)
      << e;
}

TEST_F(BadAdapter, PeftAdapter) {
  fs::rename(dir_ / "adapters.safetensors", dir_ / "adapter_model.safetensors");
  std::string e = error();
  EXPECT_NE(e.find("PEFT"), std::string::npos) << e;
  config_["peft_type"] = "LORA";
  write();
  e = error();
  EXPECT_NE(e.find("PEFT"), std::string::npos) << e;
}

}  // namespace
}  // namespace lmx
