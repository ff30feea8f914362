// Memory admission (SchedulerOptions::memory_budget): a request whose KV cache at prompt +
// max_tokens does not fit beside the weights and what the queued and running requests reserved
// is refused at submit with MemoryAdmissionError, and admitted again once those finished. The
// layout's bytes per token (engine/memory.h, from config.json) match what a generation's cache
// measures, and the weights' bytes the tensors the checkpoint loads.
#include <gtest/gtest.h>

#include <filesystem>
#include <future>
#include <thread>

#include "core/error.h"
#include "engine/memory.h"
#include "engine/model_impl.h"
#include "io/safetensors.h"
#include "lmx/lmx.h"
#include "test_util.h"

namespace lmx {
namespace {

namespace fs = std::filesystem;

// A parity model with the default model's tokenizer beside it (links), loadable by LanguageModel.
fs::path linked_model(const std::string& row) {
  const fs::path src = fs::absolute(test::data_path("parity/" + row));
  const fs::path tok = fs::absolute(test::data_path("smollm2-135m-instruct-4bit"));
  const fs::path dir =
      fs::temp_directory_path() / ("lmx_admission_" + std::to_string(getpid())) / row;
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(src)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with("reference")) fs::create_symlink(e.path(), dir / name);
  }
  for (const char* name : {"tokenizer.json", "tokenizer_config.json"})
    fs::create_symlink(tok / name, dir / name);
  return dir;
}

StreamRequest request(int prompt_len, int max_tokens, std::promise<StreamResult>& done) {
  StreamRequest r;
  for (int i = 0; i < prompt_len; ++i) r.prompt.push_back(1 + i % 50);
  r.options.max_tokens = max_tokens;
  r.options.ignore_eos = true;
  r.on_token = [](const StreamToken&) { return true; };
  r.on_done = [&done](const StreamResult& res) { done.set_value(res); };
  return r;
}

TEST(MemoryAdmission, LayoutMatchesTheLoadedModel) {
  for (const char* row : {"llama_tied", "gemma3_text_window8", "qwen3_tied"}) {
    SCOPED_TRACE(row);
    const fs::path dir = linked_model(row);
    const ModelMemory m = model_memory(dir);
    size_t loaded = 0;
    for (const auto& [name, a] : load_model_weights(dir)) loaded += a.nbytes();
    EXPECT_EQ(m.weight_bytes, loaded);
    LanguageModel model = LanguageModel::load(dir, {.exact = true});
    GenerateOptions o;
    o.max_tokens = 4;
    o.ignore_eos = true;
    // The stats' bytes per token: every cache's bytes over its capacity, all layers together.
    const GenerationStats st = model.generate({1, 2}, o, [](const TokenOutput&) { return true; });
    EXPECT_DOUBLE_EQ(st.kv_bytes_per_token, kv_bytes_per_token(m, 0));
  }
}

// A hybrid: KV only on its attention layers, and the linear-attention states' fixed bytes, which
// equal what a prefilled cache holds.
TEST(MemoryAdmission, HybridLayoutMatchesTheLoadedModel) {
  for (const char* row : {"qwen3_next_f32", "qwen3_5"}) {
    SCOPED_TRACE(row);
    const fs::path dir = linked_model(row);
    const ModelMemory m = model_memory(dir);
    LanguageModel model = LanguageModel::load(dir, {.exact = true});
    GenerateOptions o;
    o.max_tokens = 4;
    o.ignore_eos = true;
    const GenerationStats st = model.generate({1, 2}, o, [](const TokenOutput&) { return true; });
    EXPECT_DOUBLE_EQ(st.kv_bytes_per_token, kv_bytes_per_token(m, 0));
    Model& net = *model.impl().loaded.model;
    Cache cache = net.make_cache();
    mx::eval(net(mx::array({1, 2, 3}, {1, 3}, mx::int32), cache));
    size_t state = 0, kv_layers = 0;
    for (const auto& c : cache) {
      if (c->capacity() > 0) {
        ++kv_layers;
      } else {
        state += c->nbytes();
      }
    }
    EXPECT_EQ(m.kv.size(), kv_layers);
    EXPECT_GT(m.state_bytes, 0u);
    EXPECT_EQ(m.state_bytes, state);
  }
}

TEST(MemoryAdmission, RefusesWhatCannotFitAndAdmitsOnceMemoryIsBack) {
  const fs::path dir = linked_model("llama_tied");
  const ModelMemory m = model_memory(dir);
  LanguageModel model = LanguageModel::load(dir, {.exact = true});
  // Room for one request of 8 + 24 tokens, not two.
  const size_t budget =
      m.weight_bytes + kv_bytes(m, 32) + kv_bytes(m, 16) + transient_bytes(m, 8, 32);
  Scheduler s(model, {.max_batch = 4, .memory_budget = budget});

  std::promise<StreamResult> too_big;
  try {
    s.submit(request(8, 4000, too_big));
    FAIL() << "a request of 4008 tokens was admitted";
  } catch (const MemoryAdmissionError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("memory admission"), std::string::npos) << msg;
    EXPECT_NE(msg.find("4008 tokens (prompt 8 + max_tokens 4000)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("expected at most the memory budget"), std::string::npos) << msg;
  }

  std::promise<StreamResult> first, second, third;
  std::promise<void> entered, release;
  std::thread stall([&] {
    s.run([&] {
      entered.set_value();
      release.get_future().wait();
    });
  });
  entered.get_future().wait();
  s.submit(request(8, 24, first));  // queued: its 32 tokens are reserved
  EXPECT_THROW(s.submit(request(8, 24, second)), MemoryAdmissionError);
  release.set_value();
  stall.join();
  const StreamResult r1 = first.get_future().get();
  EXPECT_EQ(r1.finish_reason, "length");
  EXPECT_EQ(r1.stats.generation_tokens, 24);
  // Its reservation went with it: the same request fits now.
  s.submit(request(8, 24, third));
  EXPECT_EQ(third.get_future().get().finish_reason, "length");
}

TEST(MemoryAdmission, WithoutABudgetNothingIsChecked) {
  LanguageModel model = LanguageModel::load(linked_model("llama_tied"), {.exact = true});
  Scheduler s(model, {.max_batch = 1});
  std::promise<StreamResult> done;
  s.submit(request(4, 3, done));
  EXPECT_EQ(done.get_future().get().finish_reason, "length");
}

}  // namespace
}  // namespace lmx
