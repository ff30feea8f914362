#include <mlx/mlx.h>

#include <variant>

#include "core/error.h"
#include "generate/generate.h"
#include "kernels/cpu/qmm.h"
#include "kernels/cpu/thread_pool.h"
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

struct LanguageModel::Impl {
  LoadedWeights loaded;
  Tokenizer tokenizer;
  std::vector<int> eos;
};

LanguageModel::LanguageModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LanguageModel::~LanguageModel() = default;
LanguageModel::LanguageModel(LanguageModel&&) noexcept = default;
LanguageModel& LanguageModel::operator=(LanguageModel&&) noexcept = default;

LanguageModel LanguageModel::load(const std::filesystem::path& dir, const LoadOptions& options) {
  LoadedWeights loaded = load_model(dir, options);
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

namespace {

std::string describe_tier(bool cpu_kernels) {
  if (!cpu_kernels) return "L1 (exact: stock MLX ops)";
  return "L3 (lmx CPU kernels: " + kernels::cpu::isa_name(kernels::cpu::active_isa()) + ", " +
         std::to_string(kernels::cpu::num_threads()) + " threads)";
}

}  // namespace

std::string tier_description(const LoadOptions& options) {
  return describe_tier(!options.exact && mx::default_device() == mx::Device::cpu);
}

std::string LanguageModel::tier() const { return describe_tier(impl_->loaded.cpu_kernels); }

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

GenerationStats LanguageModel::generate(const std::vector<int>& prompt,
                                        const GenerateOptions& options,
                                        const std::function<bool(const TokenOutput&)>& on_token) {
  check(!prompt.empty(), "generate", "the prompt is empty, expected at least one token");
  check(options.max_tokens >= 0, "generate", "max_tokens must be >= 0, got ", options.max_tokens);
  if (auto ctx = context_length()) {
    check(static_cast<int>(prompt.size()) <= *ctx, "generate", "the prompt has ", prompt.size(),
          " tokens, longer than the model's context of ", *ctx, " tokens");
  }
  const int vocab = vocab_size();
  for (int t : prompt)
    check(t >= 0 && t < vocab, "generate", "token id ", t, " is outside the vocabulary of ", vocab);
  validate(options.sampler, vocab);
  StreamingDetokenizer detok(impl_->tokenizer);
  std::string text;
  bool stopped = false;
  GenerationStats stats =
      lmx::generate(*impl_->loaded.model, prompt, options,
                    options.ignore_eos ? std::vector<int>{} : impl_->eos, [&](const Step& s) {
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

}  // namespace lmx
