// What LanguageModel holds, shared by the engine's files (language_model.cpp, session.cpp).
#pragma once

#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "cache/kv_config.h"
#include "constrain/token_constraint.h"
#include "lmx/lmx.h"
#include "models/model.h"
#include "nn/adapter_router.h"
#include "tokenizer/tokenizer.h"

namespace lmx {

struct LanguageModel::Impl {
  Impl(LoadedWeights l, Tokenizer t, std::vector<int> e, std::optional<ShardSpec> s)
      : loaded(std::move(l)), tokenizer(std::move(t)), eos(std::move(e)), shard(std::move(s)) {}
  LoadedWeights loaded;
  Tokenizer tokenizer;
  std::vector<int> eos;
  std::vector<KVLayerBits> kv_config;  // kv_config.json of the model directory
  std::optional<ShardSpec> shard;      // tensor parallelism: this rank's part
  std::filesystem::path dir;           // the model directory it was loaded from
  // Token bytes and their trie for constrained decoding, built on first use.
  std::shared_ptr<const constrain::TokenTable> token_table;
  std::once_flag token_table_once;
  const std::shared_ptr<const constrain::TokenTable>& tokens() {
    std::call_once(token_table_once,
                   [&] { token_table = constrain::TokenTable::build(tokenizer); });
    return token_table;
  }
  int num_caches() const { return static_cast<int>(loaded.model->make_cache().size()); }
  nn::AdapterRouter* router() const { return loaded.router.get(); }
  // What names the weights of a generation with `adapter` in prompt-cache keys ("" for none).
  std::string adapter_key(const std::string& adapter) const;
};

// A generation's hold on its adapter (GenerateOptions::adapter) while it runs: -1 for none.
class AdapterHold {
 public:
  AdapterHold(const LanguageModel::Impl& impl, const std::string& adapter);
  ~AdapterHold();
  AdapterHold(const AdapterHold&) = delete;
  AdapterHold& operator=(const AdapterHold&) = delete;
  int slot() const { return slot_; }

 private:
  nn::AdapterRouter* router_ = nullptr;
  int slot_ = -1;
};

// Throws lmx::Error for an empty prompt, one longer than the context, ids outside the vocabulary
// or invalid sampler options.
void validate_request(const LanguageModel& model, const std::vector<int>& prompt,
                      const GenerateOptions& options);

// Generates from `prompt` continuing `cache`, which holds `context` (what speculation's draft
// model and prompt lookup read too), streaming detokenized text; appends every sampled token
// that reached `on_token` to `generated` when given.
GenerationStats stream_generate(LanguageModel::Impl& impl, Cache& cache,
                                const std::vector<int>& prompt, const GenerateOptions& options,
                                const std::function<bool(const TokenOutput&)>& on_token,
                                std::vector<int>* generated, const std::vector<int>& context = {});

}  // namespace lmx
