#include <mlx/mlx.h>

#include <variant>

#include "core/error.h"
#include "engine/model_impl.h"
#include "generate/generate.h"
#include "lmx/lmx.h"
#include "models/model.h"
#include "tokenizer/tokenizer.h"

namespace lmx {

namespace mx = mlx::core;

std::string version() { return LMX_VERSION; }

std::string backend_description() {
  const mx::Device& d = mx::default_device();
  std::string name;
  try {
    const auto& info = mx::device_info(d);
    if (auto it = info.find("device_name"); it != info.end())
      if (auto* s = std::get_if<std::string>(&it->second)) name = *s;
  } catch (const std::exception&) {
    // device_info is optional per backend.
  }
  std::string kind = d.type == mx::Device::gpu ? "gpu" : "cpu";
  std::string out = std::string(LMX_BACKEND) + " build, running on " + kind;
  if (!name.empty()) out += " (" + name + ")";
  return out + ", mlx " + mx::version();
}

LanguageModel::LanguageModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LanguageModel::~LanguageModel() = default;
LanguageModel::LanguageModel(LanguageModel&&) noexcept = default;
LanguageModel& LanguageModel::operator=(LanguageModel&&) noexcept = default;

LanguageModel LanguageModel::load(const std::filesystem::path& dir) {
  LoadedWeights loaded = load_model(dir);
  Tokenizer tok = Tokenizer::from_dir(dir);
  std::vector<int> eos = loaded.info.eos_token_ids;
  // mlx-lm's TokenizerWrapper adds the tokenizer's own eos token to the config's ids.
  for (int id : tok.eos_token_ids())
    if (std::find(eos.begin(), eos.end(), id) == eos.end()) eos.push_back(id);
  return LanguageModel(
      std::make_unique<Impl>(Impl{std::move(loaded), std::move(tok), std::move(eos)}));
}

const std::string& LanguageModel::model_type() const { return impl_->loaded.info.model_type; }

std::optional<int> LanguageModel::context_length() const {
  return impl_->loaded.info.max_position_embeddings;
}

std::vector<int> LanguageModel::eos_token_ids() const { return impl_->eos; }

int LanguageModel::vocab_size() const {
  const json& c = impl_->loaded.info.config;
  if (c.contains("vocab_size") && c["vocab_size"].is_number_integer())
    return c["vocab_size"].get<int>();
  return impl_->tokenizer.vocab_size();
}

std::vector<int> LanguageModel::encode(std::string_view text, bool add_special_tokens) const {
  return impl_->tokenizer.encode(text, add_special_tokens);
}

std::string LanguageModel::decode(const std::vector<int>& ids) const {
  return impl_->tokenizer.decode(ids);
}

void validate_request(const LanguageModel& model, const std::vector<int>& prompt,
                      const GenerateOptions& options) {
  check(!prompt.empty(), "generate", "the prompt is empty, expected at least one token");
  check(options.max_tokens >= 0, "generate", "max_tokens must be >= 0, got ", options.max_tokens);
  if (auto ctx = model.context_length()) {
    check(static_cast<int>(prompt.size()) <= *ctx, "generate", "the prompt has ", prompt.size(),
          " tokens, longer than the model's context of ", *ctx, " tokens");
  }
  const int vocab = model.vocab_size();
  for (int t : prompt)
    check(t >= 0 && t < vocab, "generate", "token id ", t, " is outside the vocabulary of ", vocab);
  validate(options.sampler, vocab);
}

GenerationStats stream_generate(LanguageModel::Impl& impl, Cache& cache,
                                const std::vector<int>& prompt, const GenerateOptions& options,
                                const std::function<bool(const TokenOutput&)>& on_token,
                                std::vector<int>* generated) {
  StreamingDetokenizer detok(impl.tokenizer);
  std::string text;
  bool stopped = false;
  GenerationStats stats =
      lmx::generate(*impl.loaded.model, cache, prompt, options,
                    options.ignore_eos ? std::vector<int>{} : impl.eos, [&](const Step& s) {
                      if (generated) generated->push_back(s.token);
                      text = detok.add(s.token);
                      stopped = !on_token(TokenOutput{s.token, text});
                      return !stopped;
                    });
  if (!stopped) {
    text = detok.finalize();
    if (!text.empty()) on_token(TokenOutput{-1, text});
  }
  return stats;
}

GenerationStats LanguageModel::generate(const std::vector<int>& prompt,
                                        const GenerateOptions& options,
                                        const std::function<bool(const TokenOutput&)>& on_token) {
  validate_request(*this, prompt, options);
  Cache cache = impl_->loaded.model->make_cache();
  return stream_generate(*impl_, cache, prompt, options, on_token, nullptr);
}

}  // namespace lmx
