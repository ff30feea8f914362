// lmx::Session: a KV cache kept across generate() calls, reused up to the longest common prefix
// (what mlx-lm's server and chat do with their prompt caches), through the same PromptCacheLRU
// the scheduler uses.
#include <algorithm>

#include "cache/prompt_cache_lru.h"
#include "core/error.h"
#include "engine/model_impl.h"

namespace lmx {

struct Session::State {
  LanguageModel::Impl* impl;
  LanguageModel* model;
  // The scheduler's prefix reuse with room for one context: this session's.
  PromptCacheLRU cache{1, std::nullopt};
  int cached = 0;  // tokens whose keys and values the cache holds
  int reused = 0;
};

Session::Session(LanguageModel& model) : s_(std::make_unique<State>()) {
  s_->impl = model.impl_.get();
  s_->model = &model;
}
Session::~Session() = default;
Session::Session(Session&&) noexcept = default;
Session& Session::operator=(Session&&) noexcept = default;

int Session::cached_tokens() const { return s_->cached; }
int Session::reused_tokens() const { return s_->reused; }

void Session::reset() {
  s_->cache = PromptCacheLRU(1, std::nullopt);
  s_->cached = 0;
  s_->reused = 0;
}

GenerationStats Session::generate(const std::vector<int>& prompt, const GenerateOptions& options,
                                  const std::function<bool(const TokenOutput&)>& on_token) {
  validate_request(*s_->model, prompt, options);
  State& s = *s_;
  // At most all but the last prompt token come from the cache: its logits start the answer.
  Cache cache;
  size_t keep = 0;
  // A cache made under another adapter (or none) never serves this one.
  const std::string key = s.impl->adapter_key(options.adapter);
  if (auto hit = s.cache.take(key, prompt)) {
    cache = std::move(hit->cache);
    keep = hit->reused;
  } else {
    cache = s.impl->loaded.model->make_cache();
  }
  s.reused = static_cast<int>(keep);
  s.cached = 0;
  std::vector<int> tokens(prompt.begin(), prompt.end());
  const std::vector<int> suffix(prompt.begin() + static_cast<std::ptrdiff_t>(keep), prompt.end());
  std::vector<int> generated;
  const std::vector<int> context(prompt.begin(),
                                 prompt.begin() + static_cast<std::ptrdiff_t>(keep));
  GenerationStats stats =
      stream_generate(*s.impl, cache, suffix, options, on_token, &generated, context);
  tokens.insert(tokens.end(), generated.begin(), generated.end());
  // The cache may hold one token more than was returned (the step queued ahead), or fewer.
  const int offset = cache.empty() ? 0 : cache.front()->offset();
  if (static_cast<int>(tokens.size()) > offset) tokens.resize(static_cast<size_t>(offset));
  s.cached = static_cast<int>(tokens.size());
  s.cache.put(key, std::move(tokens), std::move(cache));
  stats.prompt_tokens = static_cast<int>(suffix.size());
  return stats;
}

}  // namespace lmx
