// lmx lora --train against mlx_lm.lora (scripts/gen_train_fixtures.py writes
// $LMX_TEST_DATA/train/<row>/: a tiny model with a tokenizer, data, mlx-lm's adapter and reports,
// the logits with its adapter loaded). Same arguments and seed: every train loss (each step),
// validation loss and learning rate, and the test loss, equal mlx-lm's bit for bit; the saved
// adapter's tensors equal mlx-lm's; the adapter loads in lmx and gives mlx-lm's logits. Bad
// input: errors naming the file and line. lmx fuse: tensors and config.json identical to
// mlx_lm.fuse's (quantized modules re-quantized with their spec; --dequantize).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/json.h"
#include "io/safetensors.h"
#include "models/model.h"
#include "test_util.h"
#include "train/fuse.h"
#include "train/train.h"
#include "train/yaml.h"

namespace lmx {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  fs::path p = fs::temp_directory_path() /
               ("lmx_train_" + name + "_" + std::to_string(static_cast<long>(::getpid())));
  fs::remove_all(p);
  return p;
}

struct TrainRun {
  std::vector<json> reports;
  fs::path adapter;
};

// Trains with the row's mlx_lm.lora arguments; `edit` changes them first.
TrainRun train_row(const std::string& row, const std::function<void(json&)>& edit = {}) {
  const fs::path dir = test::data_path("train/" + row);
  json args = read_json_file(dir / "reference.json").at("args");
  TrainRun r;
  r.adapter = scratch(row);
  args["model"] = (dir / "model").string();
  args["data"] = (dir / "data").string();
  args["adapter_path"] = r.adapter.string();
  if (edit) edit(args);
  train::run(train::TrainOptions::from_args(args), [&](const json& j) { r.reports.push_back(j); });
  return r;
}

void expect_same_tensors(const fs::path& ours, const fs::path& theirs) {
  Weights a = load_safetensors(ours), b = load_safetensors(theirs);
  ASSERT_EQ(a.size(), b.size());
  for (auto& [name, t] : b) {
    ASSERT_TRUE(a.count(name)) << name;
    ASSERT_EQ(a.at(name).shape(), t.shape()) << name;
    ASSERT_EQ(a.at(name).dtype(), t.dtype()) << name;
    EXPECT_TRUE(mx::array_equal(a.at(name), t).item<bool>()) << name;
  }
}

class TrainParity : public ::testing::TestWithParam<std::string> {};

TEST_P(TrainParity, LossesAdapterAndLogitsEqualMlxLm) {
  const std::string row = GetParam();
  const fs::path dir = test::data_path("train/" + row);
  const json ref = read_json_file(dir / "reference.json");
  TrainRun r = train_row(row);
  // The reports in mlx-lm's order; the last one of ours is the test loss.
  const auto& want = ref.at("reports");
  ASSERT_EQ(r.reports.size(), want.size() + 1);
  int train_reports = 0, val_reports = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const json& w = want[i];
    const json& g = r.reports[i];
    SCOPED_TRACE("report " + std::to_string(i) + ": " + w.dump());
    EXPECT_EQ(g.at("iteration").get<int>(), w.at("iteration").get<int>());
    if (w.contains("train_loss")) {
      ++train_reports;
      // float32 values in both: bit-identical, not merely close.
      EXPECT_EQ(g.at("train_loss").get<double>(), w.at("train_loss").get<double>());
      EXPECT_EQ(g.at("learning_rate").get<double>(), w.at("learning_rate").get<double>());
      EXPECT_EQ(g.at("trained_tokens").get<double>(), w.at("trained_tokens").get<double>());
    } else {
      ++val_reports;
      EXPECT_EQ(g.at("val_loss").get<double>(), w.at("val_loss").get<double>());
    }
  }
  EXPECT_EQ(train_reports, 20);
  EXPECT_GE(val_reports, 3);
  EXPECT_EQ(r.reports.back().at("test_loss").get<double>(), ref.at("test_loss").get<double>());

  expect_same_tensors(r.adapter / "adapters.safetensors", dir / "adapters/adapters.safetensors");
  const json cfg = read_json_file(r.adapter / "adapter_config.json");
  const json theirs = read_json_file(dir / "adapters/adapter_config.json");
  for (const char* k : {"fine_tune_type", "num_layers", "lora_parameters"})
    EXPECT_EQ(cfg.at(k), theirs.at(k)) << k;

  // lmx loads the adapter it wrote and gives mlx-lm's logits with mlx-lm's adapter.
  Weights want_logits = load_safetensors(dir / "reference.safetensors");
  auto loaded = load_model(dir / "model", LoadOptions{.exact = true, .adapter_path = r.adapter});
  Cache cache = loaded.model->make_cache();
  mx::array logits = mx::astype((*loaded.model)(want_logits.at("tokens"), cache), mx::float32);
  EXPECT_TRUE(mx::array_equal(logits, want_logits.at("logits")).item<bool>());
  fs::remove_all(r.adapter);
}

INSTANTIATE_TEST_SUITE_P(Rows, TrainParity,
                         ::testing::Values("llama_f32_text", "llama_f32_dropout",
                                           "llama_q4_completions", "llama_q4_dora_chat",
                                           "llama_f32_full"));

// --resume-adapter-file with mlx-lm's final adapter and a learning rate of 0: the saved adapter is
// the file resumed from, and the test loss is mlx-lm's after its training (the test set is one
// batch: no draw changes its order). --test alone with mlx-lm's adapter directory: the same loss.
TEST(Train, ResumeAndTestOnlyGiveMlxLmsTestLoss) {
  const fs::path dir = test::data_path("train/llama_f32_text");
  const double want = read_json_file(dir / "reference.json").at("test_loss").get<double>();
  TrainRun r = train_row("llama_f32_text", [&](json& a) {
    a["resume_adapter_file"] = (dir / "adapters/adapters.safetensors").string();
    a["iters"] = 2;
    a["learning_rate"] = 0.0;
  });
  ASSERT_FALSE(r.reports.empty());
  EXPECT_EQ(r.reports.back().at("test_loss").get<double>(), want);
  expect_same_tensors(r.adapter / "adapters.safetensors", dir / "adapters/adapters.safetensors");
  fs::remove_all(r.adapter);

  TrainRun t = train_row("llama_f32_text", [&](json& a) {
    a["train"] = false;
    a["adapter_path"] = (dir / "adapters").string();
  });
  ASSERT_EQ(t.reports.size(), 1u);
  EXPECT_EQ(t.reports[0].at("test_loss").get<double>(), want);
}

// --grad-checkpoint recomputes each layer in the backward pass (mx::checkpoint, as mlx-lm's
// grad_checkpoint): the same losses, bit for bit, as mlx-lm's run without it.
TEST(Train, GradCheckpointGivesTheSameLosses) {
  const fs::path dir = test::data_path("train/llama_f32_text");
  const json want = read_json_file(dir / "reference.json").at("reports");
  TrainRun r = train_row("llama_f32_text", [&](json& a) {
    a["grad_checkpoint"] = true;
    a["test"] = false;
  });
  ASSERT_EQ(r.reports.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const char* key = want[i].contains("train_loss") ? "train_loss" : "val_loss";
    EXPECT_EQ(r.reports[i].at(key).get<double>(), want[i].at(key).get<double>()) << i;
  }
  expect_same_tensors(r.adapter / "adapters.safetensors", dir / "adapters/adapters.safetensors");
  fs::remove_all(r.adapter);
}

TEST(Train, BadInputNamesFileAndLine) {
  const fs::path dir = test::data_path("train/llama_f32_text");
  const fs::path data = scratch("bad_data");
  fs::create_directories(data);
  fs::copy_file(dir / "data/valid.jsonl", data / "valid.jsonl");
  auto expect_error = [&](const std::string& train_jsonl, const std::string& needle) {
    std::ofstream(data / "train.jsonl") << train_jsonl;
    try {
      train_row("llama_f32_text", [&](json& a) {
        a["data"] = data.string();
        a["test"] = false;
      });
      ADD_FAILURE() << "no error for " << train_jsonl;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const std::string train_file = (data / "train.jsonl").string();
  expect_error("{\"text\": \"a b\"}\n{\"text\": \"c\"\n", train_file + ":2] malformed JSON");
  expect_error("{\"text\": \"a b\"}\n{\"other\": \"c\"}\n",
               train_file + ":2] row is missing 'text'");
  expect_error("{\"prompt\": \"a\", \"completion\": 3}\n",
               train_file + ":1] 'completion' must be a string");
  expect_error("{\"text\": \"a b\"}\n", "Dataset must have at least batch_size=4");
  expect_error("{\"foo\": 1}\n", "unsupported data format");
  fs::remove_all(data);
  // An adapter file from another configuration.
  try {
    train_row("llama_f32_text", [&](json& a) {
      a["resume_adapter_file"] = (dir / "adapters/adapters.safetensors").string();
      a["lora_parameters"]["rank"] = 4;
    });
    ADD_FAILURE() << "no error for a rank-8 adapter in a rank-4 run";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has shape [64, 8], expected [64, 4]"), std::string::npos)
        << e.what();
  }
  // Full fine-tuning of a quantized base: refused before training (mlx-lm fails in its first
  // backward pass: the packed weights have no gradient).
  try {
    train_row("llama_q4_completions", [&](json& a) {
      a["fine_tune_type"] = "full";
      a["num_layers"] = 1;
    });
    ADD_FAILURE() << "no error for a full fine-tune of a 4-bit model";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("--fine-tune-type full needs a float model, got a "
                                   "quantized layer (model.layers.1.self_attn.q_proj.scales)"),
        std::string::npos)
        << e.what();
  }
  try {
    train_row("llama_f32_text", [&](json& a) { a["num_layers"] = 3; });
    ADD_FAILURE() << "no error for 3 layers of 2";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Requested to train 3 layers but the model only has 2"),
              std::string::npos)
        << e.what();
  }
}

// --train-mode dpo|orpo against scripts/gen_pref_fixtures.py (the papers' losses written in
// Python over mlx-lm's model, LoRA layers and mlx's Adam, the same batches): every train loss,
// reward margin, learning rate and token count, and every validation loss and margin, equal the
// reference's bit for bit, and so do the trained adapter's tensors.
class PreferenceParity : public ::testing::TestWithParam<std::string> {};

TrainRun train_pref(const std::string& row, const std::function<void(json&)>& edit = {}) {
  const fs::path dir = test::data_path("pref/" + row);
  json args = read_json_file(dir / "reference.json").at("args");
  TrainRun r;
  r.adapter = scratch(row);
  args["model"] = (dir / "model").string();
  args["data"] = (dir / "data").string();
  args["adapter_path"] = r.adapter.string();
  args["train"] = true;
  if (edit) edit(args);
  train::run(train::TrainOptions::from_args(args), [&](const json& j) { r.reports.push_back(j); });
  return r;
}

TEST_P(PreferenceParity, LossesAndMarginsEqualTheReference) {
  const std::string row = GetParam();
  const fs::path dir = test::data_path("pref/" + row);
  const json want = read_json_file(dir / "reference.json").at("reports");
  TrainRun r = train_pref(row);
  ASSERT_EQ(r.reports.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE("report " + std::to_string(i) + ": " + want[i].dump());
    const json& g = r.reports[i];
    EXPECT_EQ(g.at("iteration"), want[i].at("iteration"));
    for (const char* k : {"train_loss", "val_loss", "reward_margin", "learning_rate"}) {
      if (want[i].contains(k)) {
        EXPECT_EQ(g.at(k).get<double>(), want[i].at(k).get<double>()) << k;
      }
    }
    if (want[i].contains("trained_tokens")) {
      EXPECT_EQ(g.at("trained_tokens").get<long long>(),
                want[i].at("trained_tokens").get<long long>());
    }
  }
  expect_same_tensors(r.adapter / "adapters.safetensors", dir / "adapters.safetensors");
  EXPECT_EQ(read_json_file(r.adapter / "adapter_config.json").at("train_mode"),
            read_json_file(dir / "reference.json").at("args").at("train_mode"));
  if (row == "dpo_toy") {
    // 200 steps on a learnable preference (the chosen answer repeats the prompt): the chosen
    // answers are preferred on training and held-out rows.
    const json& last_train = r.reports.back();
    EXPECT_LT(last_train.at("train_loss").get<double>(), 0.4);
    EXPECT_GT(last_train.at("reward_margin").get<double>(), 1.0);
    const json& last_val = r.reports[r.reports.size() - 2];
    ASSERT_TRUE(last_val.contains("val_loss"));
    EXPECT_LT(last_val.at("val_loss").get<double>(), 0.69);
    EXPECT_GT(last_val.at("reward_margin").get<double>(), 0.5);
  }
  fs::remove_all(r.adapter);
}

INSTANTIATE_TEST_SUITE_P(Rows, PreferenceParity,
                         ::testing::Values("dpo_lora", "orpo_lora", "dpo_toy"));

// DPO on a full fine-tune: the reference is the loaded weights, not the moving policy. The first
// step's policy is the reference (z = 0: loss log 2, margin 0); after updates the loss and margin
// move (a reference that followed the policy would keep them at log 2 and 0).
TEST(Preference, FullFineTuneDpoKeepsTheLoadedReference) {
  TrainRun r = train_pref("dpo_lora", [](json& a) {
    a["fine_tune_type"] = "full";
    a["num_layers"] = 1;
    a["iters"] = 4;
    a["steps_per_eval"] = 100;
    a["learning_rate"] = 1e-3;
  });
  std::vector<json> train;
  for (const json& j : r.reports)
    if (j.contains("train_loss")) train.push_back(j);
  ASSERT_EQ(train.size(), 4u);
  EXPECT_EQ(train[0].at("train_loss").get<double>(), static_cast<double>(std::log(2.0f)));
  EXPECT_EQ(train[0].at("reward_margin").get<double>(), 0.0);
  EXPECT_NE(train[3].at("train_loss").get<double>(), train[0].at("train_loss").get<double>());
  EXPECT_NE(train[3].at("reward_margin").get<double>(), 0.0);
  const Weights saved = load_safetensors(r.adapter / "adapters.safetensors");
  EXPECT_TRUE(saved.count("model.layers.1.mlp.down_proj.weight"));
  fs::remove_all(r.adapter);
}

TEST(Preference, BadRowsNameFileAndLine) {
  const fs::path dir = test::data_path("pref/dpo_lora");
  const fs::path data = scratch("bad_pref");
  fs::create_directories(data);
  auto expect_error = [&](const std::string& train_jsonl, const std::string& needle,
                          const std::string& mode = "dpo") {
    std::ofstream(data / "train.jsonl") << train_jsonl;
    try {
      train_pref("dpo_lora", [&](json& a) {
        a["data"] = data.string();
        a["train_mode"] = mode;
      });
      ADD_FAILURE() << "no error for " << train_jsonl;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const std::string file = (data / "train.jsonl").string();
  const std::string ok = R"({"prompt": "a b", "chosen": "c", "rejected": "d"})";
  expect_error(ok + "\n" + R"({"prompt": "a", "rejected": "d"})" + "\n",
               file + ":2] row is missing 'chosen', which the prompt/chosen/rejected");
  expect_error(ok + "\n\n" + R"({"prompt": "a", "chosen": "d"})" + "\n",
               file + ":3] row is missing 'rejected'", "orpo");
  expect_error(R"({"prompt": "a", "chosen": 1, "rejected": "d"})"
               "\n",
               file + ":1] 'chosen' must be a string");
  expect_error(R"({"text": "a"})"
               "\n",
               file + ":1] row is missing 'prompt'");
  fs::remove_all(data);
  try {
    train_pref("dpo_lora", [&](json& a) { a["train_mode"] = "kto"; });
    ADD_FAILURE() << "no error for train_mode kto";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown train_mode 'kto', expected sft, dpo or orpo"),
              std::string::npos)
        << e.what();
  }
}

void expect_same_model(const fs::path& ours, const fs::path& theirs) {
  expect_same_tensors(ours / "model.safetensors", theirs / "model.safetensors");
  EXPECT_EQ(read_json_file(ours / "config.json"), read_json_file(theirs / "config.json"));
  EXPECT_EQ(read_json_file(ours / "model.safetensors.index.json"),
            read_json_file(theirs / "model.safetensors.index.json"));
}

TEST(Fuse, TensorsEqualMlxLmFuse) {
  for (const std::string row :
       {"llama_f32_text", "llama_q4_completions", "llama_q4_dora_chat", "llama_f32_full"}) {
    SCOPED_TRACE(row);
    const fs::path dir = test::data_path("train/" + row);
    const fs::path out = scratch("fuse_" + row);
    train::fuse({.model = dir / "model", .adapter_path = dir / "adapters", .save_path = out});
    expect_same_model(out, dir / "fused");
    EXPECT_TRUE(fs::exists(out / "tokenizer.json"));
    fs::remove_all(out);
  }
  for (const std::string row : {"llama_q4_completions", "llama_q4_dora_chat"}) {
    SCOPED_TRACE(row + " --dequantize");
    const fs::path dir = test::data_path("train/" + row);
    const fs::path out = scratch("fuse_dequantized");
    train::fuse({.model = dir / "model",
                 .adapter_path = dir / "adapters",
                 .save_path = out,
                 .dequantize = true});
    expect_same_model(out, dir / "fused_dequantized");
    fs::remove_all(out);
  }
  const fs::path dir = test::data_path("train/llama_q4_completions");
  const fs::path out = scratch("fuse_exists");
  fs::create_directories(out);
  // An existing destination is refused, not overwritten.
  try {
    train::fuse({.model = dir / "model", .adapter_path = dir / "adapters", .save_path = out});
    ADD_FAILURE() << "no error for an existing --save-path";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("already exists"), std::string::npos) << e.what();
  }
  fs::remove_all(out);
}

TEST(Train, YamlSubsetAsMlxLmReadsIt) {
  const json y = train::parse_yaml(R"(# mlx-lm style
model: "mlx-community/Model"   # comment
train: true
learning_rate: 1e-5
iters: 1_000
lora_parameters:
  keys: ["self_attn.q_proj", 'self_attn.v_proj']
  rank: 8
  scale: 20.0
lr_schedule:
  name: cosine_decay
  arguments: [1e-5, 1000, 1e-7]
  warmup: 100
optimizer_config:
  adamw:
    betas: [0.9, 0.98]
    weight_decay: 0.1
list:
  - a
  - 2
  - key: v
    other: w
empty:
)",
                                   "cfg.yaml");
  EXPECT_EQ(y["model"], "mlx-community/Model");
  EXPECT_EQ(y["train"], true);
  EXPECT_TRUE(y["learning_rate"].is_number_float());
  EXPECT_DOUBLE_EQ(y["learning_rate"].get<double>(), 1e-5);
  EXPECT_EQ(y["iters"], 1000);
  EXPECT_EQ(y["lora_parameters"]["keys"], json({"self_attn.q_proj", "self_attn.v_proj"}));
  EXPECT_EQ(y["lora_parameters"]["rank"], 8);
  EXPECT_DOUBLE_EQ(y["lr_schedule"]["arguments"][2].get<double>(), 1e-7);
  EXPECT_EQ(y["optimizer_config"]["adamw"]["betas"], json({0.9, 0.98}));
  EXPECT_EQ(y["list"], json::parse(R"(["a", 2, {"key": "v", "other": "w"}])"));
  EXPECT_TRUE(y["empty"].is_null());
  try {
    train::parse_yaml("a: [1, 2\n", "bad.yaml");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.yaml:1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lmx
