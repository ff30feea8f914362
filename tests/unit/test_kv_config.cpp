// Per-layer KV bits (kv_config.json): parsing and errors that name the file and the entry; the
// CLI's --kv-config; `lmx bench`'s KV bytes per token shrinking by the factor the quantized
// format implies.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "cache/kv_config.h"
#include "core/error.h"
#include "core/json.h"
#include "test_util.h"

namespace lmx {
namespace {

namespace fs = std::filesystem;

class KVConfigFile : public ::testing::Test {
 protected:
  void SetUp() override {
    file_ = fs::temp_directory_path() /
            ("lmx_kv_config_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".json");
  }
  void TearDown() override { fs::remove(file_); }
  void write(const std::string& text) { std::ofstream(file_) << text; }
  // read_kv_config must throw an lmx::Error naming the file and containing every needle.
  void expect_error(const std::string& text, const std::vector<std::string>& needles) {
    write(text);
    try {
      read_kv_config(file_, 4);
      ADD_FAILURE() << "accepted " << text;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(file_.string()), std::string::npos) << msg;
      for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << msg;
    }
  }
  fs::path file_;
};

TEST_F(KVConfigFile, ReadsEntries) {
  write(R"([{"layer_idx": 0, "bits": 4, "group_size": 32}, {"layer_idx": 3, "bits": 8}])");
  EXPECT_EQ(read_kv_config(file_, 4), (std::vector<KVLayerBits>{{0, 4, 32}, {3, 8, 64}}));
  write("[]");
  EXPECT_TRUE(read_kv_config(file_, 4).empty());
}

TEST_F(KVConfigFile, NamesTheBadEntry) {
  expect_error(R"({"layer_idx": 0})", {"expected a JSON list"});
  expect_error(R"([{"layer_idx": 0, "bits": 4}, 7])", {"entry 1", "expected an object"});
  expect_error(R"([{"layer_idx": 4, "bits": 4}])",
               {"entry 0 (layer_idx 4)", "out of range", "0..3"});
  expect_error(R"([{"layer_idx": -1, "bits": 4}])", {"layer_idx -1", "out of range"});
  expect_error(R"([{"layer_idx": 1, "bits": 4}, {"layer_idx": 2, "bits": 7}])",
               {"entry 1 (layer_idx 2)", "bits 7"});
  expect_error(R"([{"layer_idx": 1, "bits": 1}])", {"bits 1"});
  expect_error(R"([{"layer_idx": 1, "bits": 4, "group_size": 48}])", {"group_size 48"});
  expect_error(R"([{"layer_idx": 1, "bits": 4}, {"layer_idx": 1, "bits": 8}])", {"twice"});
  expect_error(R"([{"bits": 4}])", {"entry 0", "layer_idx"});
  expect_error(R"([{"layer_idx": 0, "bits": "four"}])", {"entry 0", "bits"});
  expect_error("[{", {"invalid JSON"});
}

// The CLI reports a bad --kv-config file like any bad input: exit 1, file and entry named.
TEST_F(KVConfigFile, CliRejectsABadFile) {
  write(R"([{"layer_idx": 99, "bits": 4}])");
  const fs::path model = test::data_path("smollm2-135m-instruct-4bit");
  auto r = test::run_lmx("generate --model " + model.string() + " --prompt hi --max-tokens 1 " +
                         "--kv-config " + file_.string());
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find(file_.string()), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("layer_idx 99"), std::string::npos) << r.err;
}

// A tiny model directory for `lmx bench`: a parity row's weights (2 layers, 2 KV heads of 64)
// with SmolLM2's tokenizer files (bench only decodes what it generates).
class BenchKVBytes : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("lmx_bench_kv_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const fs::path row = test::data_path("parity/llama_kv4_g64");
    const fs::path tok = test::data_path("smollm2-135m-instruct-4bit");
    for (const fs::path& f : {row / "config.json", row / "model.safetensors",
                              tok / "tokenizer.json", tok / "tokenizer_config.json"})
      fs::copy_file(f, dir_ / f.filename());
  }
  void TearDown() override { fs::remove_all(dir_); }
  double kv_bytes_per_token(const std::string& flags) const;
  fs::path dir_;
};

double BenchKVBytes::kv_bytes_per_token(const std::string& flags) const {
  auto r = test::run_lmx("bench --model " + dir_.string() +
                         " --prompt-tokens 40 --gen-tokens 2 --trials 1 --json " + flags);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  if (r.exit_code != 0) return 0;
  return json::parse(r.out).at("kv_bytes_per_token").get<double>();
}

// Per layer and token, K and V of n_kv heads: unquantized 2 * n_kv * D * s bytes (s: the
// activation dtype's size), quantized 2 * n_kv * (D * bits / 8 + 2 * (D / group) * s): packed
// values plus a scale and a bias per group.
TEST_F(BenchKVBytes, QuantizedKVShrinksByTheFormatsFactor) {
  const json config = read_json_file(dir_ / "config.json");
  const double layers = config.at("num_hidden_layers").get<int>();
  const double n_kv = config.at("num_key_value_heads").get<int>();
  const double D = config.at("head_dim").get<int>();
  const double plain = kv_bytes_per_token("");
  const double s = plain / (layers * 2 * n_kv * D);
  ASSERT_TRUE(s == 2 || s == 4) << "unquantized KV bytes per token " << plain;
  struct Case {
    int bits, group;
  };
  for (Case c : {Case{8, 64}, Case{4, 64}, Case{4, 32}}) {
    const double want = layers * 2 * n_kv * (D * c.bits / 8 + 2 * (D / c.group) * s);
    const double got =
        kv_bytes_per_token("--kv-bits " + std::to_string(c.bits) + " --kv-group-size " +
                           std::to_string(c.group) + " --quantized-kv-start 0");
    EXPECT_EQ(got, want) << c.bits << " bits, group " << c.group;
    EXPECT_LT(got, plain * (c.bits / 16.0 + 0.07));
  }
  // Per-layer bits: layer 0 at 4 bits, the rest unquantized.
  const fs::path cfg = dir_ / "layer0.json";
  std::ofstream(cfg) << R"([{"layer_idx": 0, "bits": 4, "group_size": 64}])";
  const double mixed = kv_bytes_per_token("--kv-config " + cfg.string());
  EXPECT_EQ(mixed, plain / layers * (layers - 1) + 2 * n_kv * (D / 2 + 2 * (D / 64) * s));
  // The model directory's own kv_config.json is used unless --kv-config off.
  fs::copy_file(cfg, dir_ / "kv_config.json");
  EXPECT_EQ(kv_bytes_per_token(""), mixed);
  EXPECT_EQ(kv_bytes_per_token("--kv-config off"), plain);
}

// A model directory's kv_config.json is checked at load: a bad one fails every command.
TEST_F(BenchKVBytes, BadKvConfigInTheModelDirectoryFailsAtLoad) {
  std::ofstream(dir_ / "kv_config.json") << R"([{"layer_idx": 2, "bits": 4}])";
  auto r = test::run_lmx("generate --model " + dir_.string() + " --prompt hi --max-tokens 1");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find((dir_ / "kv_config.json").string()), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("expected 0..1"), std::string::npos) << r.err;
  // --kv-config off does not make a broken file acceptable: it is part of the model.
  r = test::run_lmx("generate --model " + dir_.string() + " --prompt hi --kv-config off");
  EXPECT_EQ(r.exit_code, 1) << r.err;
}

}  // namespace
}  // namespace lmx
