#include "generate/generate.h"

#include <algorithm>
#include <cmath>

#include "cache/kv_config.h"
#include "cache/quantized_kv_cache.h"
#include "constrain/token_constraint.h"
#include "core/error.h"
#include "core/heap.h"
#include "kernels/cpu/log_softmax.h"

namespace lmx {

using Clock = std::chrono::steady_clock;

namespace {
double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
}  // namespace

TokenGenerator::TokenGenerator(Model& model, Cache& cache, std::vector<int> prompt,
                               GenerateOptions options)
    : model_(model), cache_(cache), opt_(std::move(options)) {
  check(!prompt.empty(), "generate", "the prompt is empty, expected at least one token");
  validate_generation(opt_, static_cast<int>(cache_.size()));
  if (opt_.seed) mx::random::seed(*opt_.seed);
  start_ = Clock::now();
  stats_.prompt_tokens = static_cast<int>(prompt.size());

  mx::array tokens(prompt.data(), {static_cast<int>(prompt.size())}, mx::int32);
  int done = 0;
  const int total = static_cast<int>(prompt.size());
  while (total - done > 1) {
    const int n = std::min(prefill_rows(model_, opt_), total - done - 1);
    prefill_chunk(mx::expand_dims(mx::slice(tokens, {done}, {done + n}), 0), cache_, opt_, history_,
                  [&](const mx::array& t) { return model_(t, cache_); });
    done += n;
    if (opt_.on_prefill) opt_.on_prefill(done, total);
  }
  auto [y, lp] = step(mx::slice(tokens, {done}, {total}), /*generated=*/false);
  mx::async_eval({y, lp});
  y_ = y;
  logprobs_ = lp;
}

TokenGenerator::~TokenGenerator() {
  try {
    if (y_) mx::synchronize();
  } catch (...) {  // a failed step has nothing left to wait for
  }
}

std::pair<mx::array, mx::array> TokenGenerator::step(const mx::array& input, bool generated) {
  mx::array logits = model_(mx::expand_dims(input, 0), cache_);
  const int L = logits.shape(1), V = logits.shape(2);
  logits =
      mx::reshape(mx::slice(logits, {0, L - 1, 0}, {logits.shape(0), L, V}), {logits.shape(0), V});
  return sample_next(model_, logits, input, generated, cache_, opt_, history_);
}

int prefill_rows(const Model& model, const GenerateOptions& options) {
  return model.cpu_kernels() ? std::min(options.prefill_step_size, kCpuPrefillRows)
                             : options.prefill_step_size;
}

void prefill_chunk(const mx::array& chunk, Cache& cache, const GenerateOptions& opt,
                   std::optional<mx::array>& history,
                   const std::function<mx::array(const mx::array&)>& forward) {
  forward(chunk);
  maybe_quantize_kv_cache(cache, opt);
  std::vector<mx::array> state;
  for (auto& c : cache)
    for (auto& a : c->state()) state.push_back(a);
  mx::eval(state);
  if (opt.processors.any()) {
    mx::array t = mx::reshape(chunk, {-1});
    history = history ? mx::concatenate({*history, t}) : t;
  }
  mx::clear_cache();
  // A chunk's activations and scratch, freed into the heap, would stay resident beside the
  // next chunk's (docs/memory.md).
  trim_heap();
}

std::pair<mx::array, mx::array> sample_next(const Model& model, mx::array logits,
                                            const mx::array& input, bool generated, Cache& cache,
                                            const GenerateOptions& opt,
                                            std::optional<mx::array>& history,
                                            const std::optional<mx::array>& key) {
  if (opt.processors.any()) {
    history = history ? mx::concatenate({*history, input}) : input;
    logits = process_logits(*history, logits, opt.processors);
  }
  if (opt.constraint) {
    // The mask depends on the token just sampled, read here on the host (outside the model): the
    // forward is queued first so that it runs while the host waits for the token and builds the
    // mask.
    if (generated) {
      mx::async_eval({logits});
      opt.constraint->accept(input.item<int>());
    }
    logits = constrain::apply_constraint(logits, *opt.constraint);
  }
  maybe_quantize_kv_cache(cache, opt);
  // mlx-lm's logits - logsumexp(logits); tier L3 takes its vectorized, threaded kernel.
  mx::array logprobs = model.cpu_kernels()
                           ? kernels::cpu::log_softmax(logits)
                           : mx::subtract(logits, mx::logsumexp(logits, -1, /*keepdims=*/true));
  mx::array sampled = sample(logprobs, opt.sampler, key);
  return {sampled, mx::squeeze(logprobs, 0)};
}

void check_sampled(const mx::array& logprobs, int token) {
  if (logprobs.ndim() != 1 || token < 0 || token >= logprobs.shape(0)) return;
  mx::array lp = logprobs;
  lp.eval();
  const int64_t at = static_cast<int64_t>(token) * lp.strides()[0];
  float v = 0;
  switch (lp.dtype()) {
    case mx::float32:
      v = lp.data<float>()[at];
      break;
    case mx::float16:
      v = static_cast<float>(lp.data<mx::float16_t>()[at]);
      break;
    case mx::bfloat16:
      v = static_cast<float>(lp.data<mx::bfloat16_t>()[at]);
      break;
    default:
      return;
  }
  check(std::isfinite(v), "generate", "the model's logits are not finite: token ", token,
        " was sampled at log-probability ", v, ", expected a finite value (NaN or infinite values ",
        "in the output)");
}

std::optional<Step> TokenGenerator::next() {
  if (n_ == opt_.max_tokens || !y_) return std::nullopt;
  std::optional<mx::array> next_y, next_lp;
  if (n_ + 1 != opt_.max_tokens) {
    auto [ny, nlp] = step(*y_, /*generated=*/true);
    mx::async_eval({ny, nlp});
    next_y = ny;
    next_lp = nlp;
  }
  if (n_ == 0) {
    mx::eval({*y_});
    first_token_ = Clock::now();
    stats_.prompt_seconds = seconds(start_, first_token_);
  }
  Step out{y_->item<int>(), *logprobs_};
  ++n_;
  stats_.generation_tokens = n_;
  stats_.generation_seconds = seconds(first_token_, Clock::now());
  stats_.peak_memory = mx::get_peak_memory();
  if (n_ % 256 == 0) mx::clear_cache();
  if (n_ == 1) trim_heap();  // the prompt's last step and its sampling freed, as a chunk's
  if (next_y) {
    y_ = next_y;
    logprobs_ = next_lp;
  } else {
    y_.reset();
    logprobs_.reset();
  }
  return out;
}

void validate_generation(const GenerateOptions& opt, int num_caches) {
  check(opt.prefill_step_size > 0, "generate", "prefill_step_size must be > 0");
  validate(opt.processors);
  if (opt.kv_bits) QuantizedKVCache::validate(opt.kv_group_size, *opt.kv_bits);
  if (opt.kv_config) validate_kv_config(*opt.kv_config, num_caches, "generate: kv_config");
}

void maybe_quantize_kv_cache(Cache& cache, const GenerateOptions& options) {
  const bool per_layer = options.kv_config && !options.kv_config->empty();
  if (!options.kv_bits && !per_layer) return;
  for (size_t i = 0; i < cache.size(); ++i) {
    auto& c = cache[i];
    const KVLayerBits* layer = nullptr;
    if (per_layer)
      for (const KVLayerBits& e : *options.kv_config)
        if (e.layer == static_cast<int>(i)) layer = &e;
    std::unique_ptr<KVCacheBase> q;
    if (layer) {
      // mlx-bun / mlx-optiq: from the first cached token (prefill runs unquantized).
      if (c->offset() > 0) q = c->to_quantized(layer->group_size, layer->bits);
    } else if (options.kv_bits && c->offset() >= options.quantized_kv_start) {
      q = c->to_quantized(options.kv_group_size, *options.kv_bits);
    }
    if (q) c = std::move(q);
  }
}

GenerationStats generate(Model& model, const std::vector<int>& prompt,
                         const GenerateOptions& options, const std::vector<int>& eos_ids,
                         const std::function<bool(const Step&)>& on_token) {
  Cache cache = model.make_cache();
  return generate(model, cache, prompt, options, eos_ids, on_token);
}

GenerationStats generate(Model& model, Cache& cache, const std::vector<int>& prompt,
                         const GenerateOptions& options, const std::vector<int>& eos_ids,
                         const std::function<bool(const Step&)>& on_token) {
  TokenGenerator gen(model, cache, prompt, options);
  while (auto s = gen.next()) {
    if (std::find(eos_ids.begin(), eos_ids.end(), s->token) != eos_ids.end()) break;
    if (!on_token(*s)) break;
  }
  GenerationStats stats = gen.stats();
  add_kv_stats(stats, cache);
  return stats;
}

void add_kv_stats(GenerationStats& stats, const Cache& cache) {
  for (const auto& c : cache) {
    stats.kv_bytes += c->nbytes();
    if (c->capacity() > 0)
      stats.kv_bytes_per_token += static_cast<double>(c->nbytes()) / c->capacity();
  }
}

}  // namespace lmx
