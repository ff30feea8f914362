#include <mlx/mlx.h>

#include <mutex>
#include <variant>

#include "cache/kv_config.h"
#include "constrain/token_constraint.h"
#include "core/error.h"
#include "core/heap.h"
#include "engine/embed.h"
#include "engine/model_impl.h"
#include "engine/tensor_parallel.h"
#include "engine/vocab.h"
#include "generate/generate.h"
#include "generate/speculative.h"
#include "hub/hub.h"
#include "kernels/cpu/qmm.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cuda/qmm.h"
#include "lmx/lmx.h"
#include "lora/lora.h"
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

LanguageModel LanguageModel::load(const std::filesystem::path& model, const LoadOptions& options) {
  // A directory, or a Hugging Face repo id from the cache / the hub (HF_HUB_OFFLINE honoured).
  const std::filesystem::path dir = hub::resolve_model(model.string());
  check(options.tensor_parallel >= 1, "load", "tensor_parallel must be >= 1, got ",
        options.tensor_parallel);
  std::optional<ShardSpec> shard;
  if (options.tensor_parallel > 1) shard = join_tensor_parallel_group(options.tensor_parallel);
  if (options.cpu_buffer_cache_limit && mx::default_device() == mx::Device::cpu)
    mx::set_cache_limit(*options.cpu_buffer_cache_limit);
  // The tokenizer before the weights when there is one (a missing one is reported after the
  // weights' errors): parsing tokenizer.json builds a JSON tree several times the file's size
  // (~17 MB for a 49k-token BPE), and its freed pages go back before the weights arrive instead of
  // staying resident under the run (docs/memory.md).
  std::optional<Tokenizer> tok;
  const auto load_tokenizer = [&] {
    tok = Tokenizer::from_dir(dir);
    trim_heap();
  };
  if (std::filesystem::exists(dir / "tokenizer.json")) load_tokenizer();
  LoadedWeights loaded = load_model(dir, options, shard);
  // Tier L3's packed copies live in their own mappings: the checkpoint's bytes they replaced
  // left holes in the malloc heap, handed back here (docs/memory.md).
  trim_heap();
  if (!tok) load_tokenizer();
  std::vector<int> eos = merged_eos_ids(loaded.info, *tok);
  auto impl =
      std::make_unique<Impl>(std::move(loaded), std::move(*tok), std::move(eos), std::move(shard));
  impl->dir = dir;
  // mlx-optiq's per-layer KV bits, used by generate unless the options say otherwise.
  if (std::filesystem::exists(dir / "kv_config.json"))
    impl->kv_config = lmx::read_kv_config(dir / "kv_config.json", impl->num_caches());
  return LanguageModel(std::move(impl));
}

const std::vector<KVLayerBits>& LanguageModel::kv_config() const { return impl_->kv_config; }

std::vector<KVLayerBits> LanguageModel::read_kv_config(const std::filesystem::path& file) const {
  return lmx::read_kv_config(file, impl_->num_caches());
}

std::string LanguageModel::broadcast_from_rank0(const std::string& payload) const {
  if (!impl_->shard) return payload;
  return lmx::broadcast_from_rank0(payload, *impl_->shard->group);
}

const std::string& LanguageModel::model_type() const { return impl_->loaded.info.model_type; }

std::optional<int> LanguageModel::context_length() const {
  return impl_->loaded.info.max_position_embeddings;
}

std::vector<int> LanguageModel::eos_token_ids() const { return impl_->eos; }

namespace {

std::string describe_tier(bool cpu_kernels, bool cuda_kernels = false) {
  if (cuda_kernels)
    return "L3 (lmx CUDA kernel: quantized matmuls of <= " +
           std::to_string(kernels::cuda::kMaxRows) + " rows)";
  if (!cpu_kernels) return "L1 (exact: stock MLX ops)";
  namespace kc = kernels::cpu;
  const kc::Isa isa = kc::active_isa();
  std::string kernels = kc::isa_name(isa);
  if (const std::string i8 = kc::int8_kernel_name(isa);
      !i8.empty() && kc::int8_mode() != kc::Int8Mode::off)
    kernels += " + int8 " + i8 + (kc::int8_packed(isa) ? " packed" : "") +
               (kc::int8_mode() == kc::Int8Mode::all || kc::int8_all_rows(isa)
                    ? std::string(" (all rows)")
                    : " (<= " + std::to_string(kc::kInt8MaxRows) + " rows)");
  return "L3 (lmx CPU kernels: " + kernels + ", " + std::to_string(kc::num_threads()) + " threads)";
}

}  // namespace

std::string tier_description(const LoadOptions& options) {
  return describe_tier(!options.exact && mx::default_device() == mx::Device::cpu,
                       !options.exact && kernels::cuda::available() && kernels::cuda::enabled());
}

std::string LanguageModel::tier() const {
  return describe_tier(impl_->loaded.cpu_kernels, impl_->loaded.cuda_kernels);
}

int LanguageModel::vocab_size() const {
  return model_vocab_size(impl_->loaded.info, impl_->tokenizer);
}

std::vector<int> merged_eos_ids(const ModelInfo& info, const Tokenizer& tokenizer) {
  std::vector<int> eos = info.eos_token_ids;
  for (int id : tokenizer.eos_token_ids())
    if (std::find(eos.begin(), eos.end(), id) == eos.end()) eos.push_back(id);
  return eos;
}

int model_vocab_size(const ModelInfo& info, const Tokenizer& tokenizer) {
  const json& c = info.config;
  if (c.contains("vocab_size") && c["vocab_size"].is_number_integer())
    return c["vocab_size"].get<int>();
  return tokenizer.vocab_size();
}

std::vector<int> LanguageModel::encode(std::string_view text, bool add_special_tokens) const {
  return impl_->tokenizer.encode(text, add_special_tokens);
}

std::string LanguageModel::decode(const std::vector<int>& ids) const {
  return impl_->tokenizer.decode(ids);
}

std::shared_ptr<TokenConstraint> LanguageModel::json_schema_constraint(
    std::string_view schema) const {
  json j;
  try {
    j = json::parse(schema);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for 1e999
    fail("json-schema", "the schema is not valid JSON: ", e.what());
  }
  return std::make_shared<constrain::JsonConstraint>(impl_->tokens(), constrain::compile_schema(j),
                                                     impl_->eos);
}

std::shared_ptr<TokenConstraint> LanguageModel::json_object_constraint() const {
  return std::make_shared<constrain::JsonConstraint>(
      impl_->tokens(), constrain::any_json_grammar(/*object_only=*/true), impl_->eos);
}

std::vector<int> LanguageModel::embedding_tokens(std::string_view text) const {
  return lmx::embedding_tokens(impl_->tokenizer, text);
}

std::vector<std::vector<float>> LanguageModel::embed(const std::vector<std::vector<int>>& batch) {
  const int vocab = vocab_size();
  const std::optional<int> ctx = context_length();
  std::vector<std::vector<float>> out;
  out.reserve(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    const std::vector<int>& ids = batch[i];
    check(!ids.empty(), "embed", "input ", i, " is empty, expected at least one token");
    check(!ctx || static_cast<int>(ids.size()) <= *ctx, "embed", "input ", i, " has ", ids.size(),
          " tokens, longer than the model's context of ", ctx.value_or(0));
    for (int t : ids)
      check(t >= 0 && t < vocab, "embed", "input ", i, ": token id ", t,
            " is outside the vocabulary of ", vocab);
    mx::array e = embed_sequence(*impl_->loaded.model, ids);
    mx::eval(e);
    out.emplace_back(e.data<float>(), e.data<float>() + e.size());
  }
  return out;
}

std::vector<std::vector<float>> LanguageModel::embed_texts(const std::vector<std::string>& texts) {
  std::vector<std::vector<int>> batch;
  batch.reserve(texts.size());
  for (const std::string& t : texts) batch.push_back(embedding_tokens(t));
  return embed(batch);
}

void LanguageModel::load_adapter(const std::string& name, const std::filesystem::path& dir) {
  check(impl_->router() != nullptr, "adapter",
        "per-request adapters are not supported with tensor parallelism, expected --tp 1");
  lora::load_routed(*impl_->router(), name, dir);
}

void LanguageModel::unload_adapter(const std::string& name) {
  check(impl_->router() != nullptr, "adapter", "unknown adapter '", name, "', none are loaded");
  impl_->router()->remove(name);
}

std::vector<AdapterInfo> LanguageModel::adapters() const {
  std::vector<AdapterInfo> out;
  if (!impl_->router()) return out;
  for (const auto& a : impl_->router()->list())
    out.push_back({a.name, a.path, a.rank, a.scale, a.modules});
  return out;
}

bool LanguageModel::has_adapter(const std::string& name) const {
  return impl_->router() && impl_->router()->has(name);
}

std::string LanguageModel::Impl::adapter_key(const std::string& adapter) const {
  if (adapter.empty()) return {};
  check(router() != nullptr, "adapter", "unknown adapter '", adapter, "', none are loaded");
  return router()->cache_key(adapter);
}

AdapterHold::AdapterHold(const LanguageModel::Impl& impl, const std::string& adapter) {
  if (adapter.empty()) return;
  check(impl.router() != nullptr, "adapter", "unknown adapter '", adapter, "', none are loaded");
  slot_ = impl.router()->acquire(adapter);
  router_ = impl.router();
}

AdapterHold::~AdapterHold() {
  if (router_) router_->release(slot_);
}

void validate_request(const LanguageModel& model, const std::vector<int>& prompt,
                      const GenerateOptions& options) {
  check(options.adapter.empty() || model.has_adapter(options.adapter), "adapter",
        "unknown adapter '", options.adapter, "', expected one loaded with load_adapter",
        model.adapters().empty() ? " (none are loaded)" : "");
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
  if (options.draft_model) {
    const int draft = options.draft_model->vocab_size();
    check(draft == vocab, "speculative", "the draft model's vocabulary has ", draft,
          " tokens, the model's has ", vocab, ", expected the same vocabulary");
  }
}

GenerationStats stream_generate(LanguageModel::Impl& impl, Cache& cache,
                                const std::vector<int>& prompt, const GenerateOptions& options,
                                const std::function<bool(const TokenOutput&)>& on_token,
                                std::vector<int>* generated, const std::vector<int>& context) {
  StreamingDetokenizer detok(impl.tokenizer);
  std::string text;
  bool stopped = false;
  GenerateOptions opt = options;
  if (!opt.kv_config) opt.kv_config = impl.kv_config;
  // Every forward of this generation is one row with this adapter.
  AdapterHold hold(impl, options.adapter);
  nn::RouteGuard route(hold.slot() >= 0 ? impl.router() : nullptr, {hold.slot()});
  const std::vector<int> eos = options.ignore_eos ? std::vector<int>{} : impl.eos;
  auto step = [&](const Step& s) {
    check_sampled(s.logprobs, s.token);
    if (generated) generated->push_back(s.token);
    text = detok.add(s.token);
    stopped = !on_token(TokenOutput{s.token, text});
    return !stopped;
  };
  GenerationStats stats;
  if (opt.speculative()) {
    Drafter drafter;
    if (opt.draft_model) drafter.model = opt.draft_model->impl().loaded.model.get();
    drafter.dflash = opt.dflash.get();
    drafter.prompt_lookup = opt.prompt_lookup;
    stats =
        speculative_generate(*impl.loaded.model, cache, context, prompt, opt, drafter, eos, step);
  } else {
    stats = lmx::generate(*impl.loaded.model, cache, prompt, opt, eos, step);
  }
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
