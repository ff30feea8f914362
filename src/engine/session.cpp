// lmx::Session: a KV cache kept across generate() calls, reused up to the longest common prefix
// (what mlx-lm's server and chat do with their prompt caches).
#include <algorithm>

#include "core/error.h"
#include "engine/model_impl.h"

namespace lmx {

struct Session::State {
  LanguageModel::Impl* impl;
  LanguageModel* model;
  Cache cache;
  std::vector<int> tokens;  // the context whose keys/values are cached (a prefix of what was fed)
  int reused = 0;
};

Session::Session(LanguageModel& model) : s_(std::make_unique<State>()) {
  s_->impl = model.impl_.get();
  s_->model = &model;
}
Session::~Session() = default;
Session::Session(Session&&) noexcept = default;
Session& Session::operator=(Session&&) noexcept = default;

int Session::cached_tokens() const { return static_cast<int>(s_->tokens.size()); }
int Session::reused_tokens() const { return s_->reused; }

void Session::reset() {
  s_->cache.clear();
  s_->tokens.clear();
  s_->reused = 0;
}

GenerationStats Session::generate(const std::vector<int>& prompt, const GenerateOptions& options,
                                  const std::function<bool(const TokenOutput&)>& on_token) {
  validate_request(*s_->model, prompt, options);
  State& s = *s_;
  // At least the last prompt token is fed again: its logits start the answer.
  size_t keep = 0;
  const size_t limit = std::min(s.tokens.size(), prompt.size() - 1);
  while (keep < limit && s.tokens[keep] == prompt[keep]) ++keep;
  // The cache may hold more than `tokens` (the last sampled token is fed before it is returned).
  bool trimmed = !s.cache.empty();
  for (auto& c : s.cache) {
    const int extra = c->offset() - static_cast<int>(keep);
    if (extra < 0 || (extra > 0 && (!c->is_trimmable() || c->trim(extra) != extra)))
      trimmed = false;
  }
  if (!trimmed) {
    s.cache = s.impl->loaded.model->make_cache();
    keep = 0;
  }
  s.reused = static_cast<int>(keep);
  s.tokens.assign(prompt.begin(), prompt.end());
  const std::vector<int> suffix(prompt.begin() + static_cast<std::ptrdiff_t>(keep), prompt.end());
  std::vector<int> generated;
  GenerationStats stats = stream_generate(*s.impl, s.cache, suffix, options, on_token, &generated);
  s.tokens.insert(s.tokens.end(), generated.begin(), generated.end());
  const int offset = s.cache.empty() ? 0 : s.cache.front()->offset();
  if (static_cast<int>(s.tokens.size()) > offset) s.tokens.resize(static_cast<size_t>(offset));
  stats.prompt_tokens = static_cast<int>(suffix.size());
  return stats;
}

}  // namespace lmx
