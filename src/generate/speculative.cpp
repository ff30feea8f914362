#include "generate/speculative.h"

#include <algorithm>
#include <limits>

#include "cache/quantized_kv_cache.h"
#include "cache/rotating_kv_cache.h"
#include "core/error.h"
#include "generate/dflash.h"
#include "kernels/cpu/log_softmax.h"

namespace lmx {

using Clock = std::chrono::steady_clock;

namespace {

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

mx::array int_array(const std::vector<int>& v) {
  return mx::array(v.data(), {static_cast<int>(v.size())}, mx::int32);
}

std::vector<int> to_host(const mx::array& a) {
  mx::array i = mx::astype(a, mx::int32);
  mx::eval(i);
  return std::vector<int>(i.data<int32_t>(), i.data<int32_t>() + i.size());
}

// (N,) tokens -> (N, V) one-hot rows: the proposal distribution of a deterministic proposer.
mx::array one_hot(const mx::array& tokens, int V) {
  return mx::astype(mx::equal(mx::expand_dims(mx::arange(V), 0), mx::expand_dims(tokens, 1)),
                    mx::float32);
}

// Prefills all but the last of `tokens` into `cache`, as TokenGenerator does; `forward` runs
// the model on each chunk.
void prefill(Model& model, Cache& cache, const std::vector<int>& tokens, const GenerateOptions& opt,
             const std::function<mx::array(const mx::array&)>& forward = nullptr) {
  mx::array t = int_array(tokens);
  std::optional<mx::array> history;  // no processors with speculation
  const int total = static_cast<int>(tokens.size());
  int done = 0;
  while (total - done > 1) {
    const int n = std::min(prefill_rows(model, opt), total - done - 1);
    prefill_chunk(mx::expand_dims(mx::slice(t, {done}, {done + n}), 0), cache, opt, history,
                  [&](const mx::array& c) { return forward ? forward(c) : model(c, cache); });
    done += n;
    if (opt.on_prefill) opt.on_prefill(done, total);
  }
}

}  // namespace

std::vector<int> prompt_lookup(const std::vector<int>& tokens, int max_ngram, int k) {
  const int T = static_cast<int>(tokens.size());
  if (k <= 0) return {};
  for (int n = std::min(max_ngram, T - 1); n >= 1; --n) {
    // The latest start s < T - n whose n tokens equal the last n.
    for (int s = T - n - 1; s >= 0; --s) {
      if (!std::equal(tokens.begin() + s, tokens.begin() + s + n, tokens.end() - n)) continue;
      const int from = s + n, to = std::min(T, from + k);
      return std::vector<int>(tokens.begin() + from, tokens.begin() + to);
    }
  }
  return {};
}

mx::array acceptance_probability(const mx::array& p, const mx::array& q, const mx::array& draft) {
  mx::array idx = mx::expand_dims(mx::astype(draft, mx::int32), 1);
  mx::array pd = mx::squeeze(mx::take_along_axis(p, idx, 1), 1);
  mx::array qd = mx::squeeze(mx::take_along_axis(q, idx, 1), 1);
  // q(d) > 0 for a token the proposer drew; the guard keeps a 0/0 out of the graph.
  return mx::minimum(mx::array(1.0f), mx::divide(pd, mx::maximum(qd, mx::array(1e-30f))));
}

mx::array residual_distribution(const mx::array& p, const mx::array& q) {
  mx::array r = mx::maximum(mx::subtract(p, q), mx::array(0.0f));
  mx::array total = mx::sum(r, -1, /*keepdims=*/true);
  mx::array empty = mx::less_equal(total, mx::array(0.0f));
  return mx::where(empty, p, mx::divide(r, mx::where(empty, mx::array(1.0f), total)));
}

SampledVerdict verify_sampled(const mx::array& p, const mx::array& q, const mx::array& draft) {
  const int N = q.shape(0), V = p.shape(1);
  mx::array pn = mx::slice(p, {0, 0}, {N, V});
  mx::array u = mx::random::uniform({N});
  mx::array accept = mx::less(u, acceptance_probability(pn, q, draft));
  mx::array resampled = mx::random::categorical(mx::log(residual_distribution(pn, q)), -1);
  mx::array bonus =
      mx::random::categorical(mx::log(mx::reshape(mx::slice(p, {N, 0}, {N + 1, V}), {V})), -1);
  return {accept, resampled, bonus};
}

void validate_speculative(const GenerateOptions& opt, const Cache& cache, const char* which) {
  check(opt.num_draft_tokens >= 1, "speculative", "num_draft_tokens must be >= 1, got ",
        opt.num_draft_tokens);
  check(opt.prompt_lookup >= 0, "speculative", "prompt_lookup must be >= 0 (0: off), got ",
        opt.prompt_lookup);
  check((opt.draft_model ? 1 : 0) + (opt.dflash ? 1 : 0) + (opt.prompt_lookup > 0 ? 1 : 0) <= 1,
        "speculative",
        "more than one proposer (draft model, DFlash drafter, prompt lookup) was given, expected "
        "one of them");
  check(!opt.processors.any(), "speculative",
        "logits processors (logit bias, repetition/presence/frequency penalties) are not "
        "supported with speculative decoding");
  check(!opt.constraint, "speculative",
        "a token constraint (JSON schema) is not supported with speculative decoding");
  for (size_t i = 0; i < cache.size(); ++i) {
    const KVCacheBase* c = cache[i].get();
    check(dynamic_cast<const KVCache*>(c) || dynamic_cast<const QuantizedKVCache*>(c) ||
              dynamic_cast<const RotatingCacheBase*>(c),
          "speculative", "the ", which, "'s cache layer ", i,
          " cannot be rolled back, expected a KVCache, QuantizedKVCache or rotating cache");
  }
}

SpeculativeGenerator::SpeculativeGenerator(Model& model, Cache& cache,
                                           const std::vector<int>& context, std::vector<int> prompt,
                                           GenerateOptions options, Drafter drafter)
    : model_(model), cache_(cache), opt_(std::move(options)), drafter_(drafter) {
  check(!prompt.empty(), "generate", "the prompt is empty, expected at least one token");
  check(drafter_.model || drafter_.dflash || drafter_.prompt_lookup > 0, "speculative",
        "no proposer, expected a draft model, a DFlash drafter or prompt_lookup > 0");
  check(!(drafter_.model && drafter_.dflash), "speculative",
        "a draft model and a DFlash drafter were both given, expected one of them");
  validate_generation(opt_, static_cast<int>(cache_.size()));
  validate_speculative(opt_, cache_, "model");
  // The draft quantizes its KV cache as the target does; the target's per-layer kv_config is
  // the target's alone.
  draft_opt_ = opt_;
  draft_opt_.kv_config = std::vector<KVLayerBits>{};
  if (opt_.seed) mx::random::seed(*opt_.seed);
  start_ = Clock::now();
  stats_.prompt_tokens = static_cast<int>(prompt.size());

  history_ = context;
  history_.insert(history_.end(), prompt.begin(), prompt.end());
  if (drafter_.dflash) {
    const DFlashConfig& dc = drafter_.dflash->config();
    drafter_.dflash->check_target(model_);
    check(opt_.num_draft_tokens <= dc.block_size - 1, "speculative", "num_draft_tokens is ",
          opt_.num_draft_tokens, ", the DFlash drafter's block of ", dc.block_size,
          " proposes at most ", dc.block_size - 1);
    tap_.layers = std::set<int>(dc.target_layer_ids.begin(), dc.target_layer_ids.end());
    draft_cache_ = drafter_.dflash->make_cache();
    // The drafter reads the states of this prompt on; a chat's earlier turns (already in the
    // target's cache) are not re-run for it.
    prefill(model_, cache_, prompt, opt_, [&](const mx::array& chunk) {
      mx::array states{0.0f};
      mx::array logits = tapped_forward(chunk, &states);
      dflash_context_.push_back(states);
      return logits;
    });
  } else {
    prefill(model_, cache_, prompt, opt_);
  }
  if (drafter_.model) {
    draft_cache_ = drafter_.model->make_cache();
    validate_speculative(opt_, draft_cache_, "draft model");
    prefill(*drafter_.model, draft_cache_, history_, draft_opt_);
    draft_pending_ = {history_.back()};
  }
  y_ = history_.back();
}

SpeculativeGenerator::~SpeculativeGenerator() {
  try {
    mx::synchronize();
  } catch (...) {  // a failed round has nothing left to wait for
  }
}

mx::array SpeculativeGenerator::tapped_forward(const mx::array& tokens, mx::array* states) {
  // Set only around this stream's forwards: the scheduler's batched rows share the model.
  HiddenTap* before = model_.hidden_tap();
  model_.set_hidden_tap(&tap_);
  mx::array logits{0.0f};
  try {
    logits = model_(tokens, cache_);
  } catch (...) {
    model_.set_hidden_tap(before);
    throw;
  }
  model_.set_hidden_tap(before);
  std::vector<mx::array> parts;
  for (int id : drafter_.dflash->config().target_layer_ids) {
    auto it = tap_.layer_states.find(id);
    check(it != tap_.layer_states.end(), "speculative", "the model recorded no state for layer ",
          id, ", expected every layer the DFlash drafter reads");
    parts.push_back(it->second);
  }
  tap_.layer_states.clear();
  *states = parts.size() == 1 ? parts[0] : mx::concatenate(parts, -1);
  return logits;
}

mx::array SpeculativeGenerator::log_probs(const Model& m, const mx::array& logits) const {
  return m.cpu_kernels() ? kernels::cpu::log_softmax(logits)
                         : mx::subtract(logits, mx::logsumexp(logits, -1, /*keepdims=*/true));
}

// Plain steps of a back-off pause queued before one read: fewer reads than one per token, and a
// stream that ends early (EOS, a stop) computed at most this many tokens it did not need.
constexpr int kPlainChunk = 8;

void SpeculativeGenerator::plain_steps() {
  const int steps = std::min({pause_, kPlainChunk, opt_.max_tokens - n_});
  const bool greedy = opt_.sampler.temp == 0;
  mx::array in = int_array({y_});
  std::vector<mx::array> tokens, lps, states;
  for (int i = 0; i < steps; ++i) {
    mx::array st{0.0f};
    mx::array logits = drafter_.dflash ? tapped_forward(mx::expand_dims(in, 0), &st)
                                       : model_(mx::expand_dims(in, 0), cache_);
    maybe_quantize_kv_cache(cache_, opt_);
    const int V = logits.shape(2);
    mx::array lp = log_probs(model_, mx::reshape(logits, {1, V}));
    mx::array t = mx::astype(greedy ? mx::argmax(lp, -1) : sample(lp, opt_.sampler), mx::int32);
    mx::async_eval(t);
    tokens.push_back(t);
    lps.push_back(lp);
    if (drafter_.dflash) states.push_back(st);
    in = t;
  }
  for (int i = 0; i < steps; ++i) {
    const int tok = to_host(tokens[i])[0];
    ready_.push_back(Step{tok, mx::reshape(lps[i], {lps[i].shape(1)})});
    history_.push_back(tok);
    // What the drafters have not seen waits for their next drafting round.
    if (drafter_.model) draft_pending_.push_back(tok);
    if (drafter_.dflash) dflash_context_.push_back(states[i]);
    y_ = tok;
  }
  stats_.speculative.rounds += steps;
  pause_ -= steps;
}

void SpeculativeGenerator::round() {
  if (pause_ > 0) return plain_steps();
  const int budget = std::min(opt_.num_draft_tokens, opt_.max_tokens - n_);
  const bool greedy = opt_.sampler.temp == 0;
  int k = 0, draft_fed = 0;
  std::optional<mx::array> draft, q;
  std::optional<int> draft_vocab;
  // The draft's rotating layers as they were before this round, for a rollback trim cannot do.
  std::vector<std::pair<const KVCacheBase*, RotatingCacheBase::Snapshot>> snaps;
  const std::vector<int> pending_before = draft_pending_;
  if (drafter_.model) {
    for (auto& c : draft_cache_) {
      auto* r = dynamic_cast<RotatingCacheBase*>(c.get());
      snaps.emplace_back(c.get(), r ? r->snapshot() : RotatingCacheBase::Snapshot{});
    }
    // Each draft step is queued behind the previous one; nothing is read until verification.
    mx::array in = int_array(draft_pending_);
    std::vector<mx::array> ds, qs;
    for (int i = 0; i < budget; ++i) {
      mx::array logits = (*drafter_.model)(mx::expand_dims(in, 0), draft_cache_);
      draft_fed += in.shape(0);
      const int L = logits.shape(1), V = logits.shape(2);
      draft_vocab = V;
      logits = mx::reshape(mx::slice(logits, {0, L - 1, 0}, {1, L, V}), {1, V});
      maybe_quantize_kv_cache(draft_cache_, draft_opt_);
      mx::array lp = log_probs(*drafter_.model, logits);
      mx::array d = mx::astype(sample(lp, opt_.sampler), mx::int32);
      if (!greedy) qs.push_back(sampling_distribution(lp, opt_.sampler));
      mx::async_eval(d);
      ds.push_back(d);
      in = d;
    }
    draft_fed -= 1;  // the last proposal is drafted, not fed
    k = budget;
    draft = mx::concatenate(ds);
    if (!greedy) q = mx::concatenate(qs, 0);  // (k, V); without an axis MLX flattens
  } else if (drafter_.dflash) {
    // One forward of the block [y, mask * budget]; its output at mask position i proposes the
    // token at that position.
    const DFlashDrafter& df = *drafter_.dflash;
    std::vector<int> block(budget + 1, df.config().mask_token_id);
    block[0] = y_;
    mx::array ctx = dflash_context_.empty()
                        ? mx::zeros({1, 0,
                                     static_cast<int>(df.config().target_layer_ids.size()) *
                                         df.config().hidden_size})
                    : dflash_context_.size() == 1 ? dflash_context_[0]
                                                  : mx::concatenate(dflash_context_, 1);
    dflash_context_.clear();
    mx::array logits = df(model_, mx::expand_dims(int_array(block), 0), ctx, draft_cache_);
    const int V = logits.shape(2);
    draft_vocab = V;
    mx::array lp = log_probs(
        model_, mx::reshape(mx::slice(logits, {0, 1, 0}, {1, budget + 1, V}), {budget, V}));
    draft = mx::astype(sample(lp, opt_.sampler), mx::int32);
    if (!greedy) q = sampling_distribution(lp, opt_.sampler);
    mx::async_eval(*draft);
    k = budget;
  } else {
    std::vector<int> proposal = prompt_lookup(history_, drafter_.prompt_lookup, budget);
    k = static_cast<int>(proposal.size());
    if (k > 0) draft = int_array(proposal);
  }

  mx::array input = int_array({y_});
  if (k > 0) input = mx::concatenate({input, *draft});
  mx::array states{0.0f};
  mx::array logits = drafter_.dflash ? tapped_forward(mx::expand_dims(input, 0), &states)
                                     : model_(mx::expand_dims(input, 0), cache_);
  const int V = logits.shape(2);
  check(!draft_vocab || *draft_vocab == V, "speculative", "the draft model's logits have ",
        draft_vocab.value_or(0), " entries, the model's ", V,
        ": the two must share one vocabulary");
  maybe_quantize_kv_cache(cache_, opt_);
  mx::array lp = log_probs(model_, mx::reshape(logits, {k + 1, V}));

  int n = 0, token = 0;
  std::vector<int> d;
  if (greedy) {
    mx::array t = mx::argmax(lp, -1);
    if (draft) mx::async_eval({t, *draft});
    const std::vector<int> th = to_host(t);
    if (draft) d = to_host(*draft);
    while (n < k && th[n] == d[n]) ++n;
    token = th[n];
  } else if (k == 0) {
    token = to_host(sample(mx::slice(lp, {0, 0}, {1, V}), opt_.sampler))[0];
  } else {
    mx::array p = sampling_distribution(lp, opt_.sampler);
    if (!q) q = one_hot(*draft, V);
    SampledVerdict v = verify_sampled(p, *q, *draft);
    mx::array accept = mx::astype(v.accept, mx::int32);
    mx::async_eval({accept, v.resampled, v.bonus, *draft});
    const std::vector<int> ah = to_host(accept), rh = to_host(v.resampled);
    d = to_host(*draft);
    while (n < k && ah[n]) ++n;
    token = n < k ? rh[n] : to_host(v.bonus)[0];
  }

  for (int i = 0; i <= n; ++i) {
    const int tok = i < n ? d[i] : token;
    ready_.push_back(Step{tok, mx::reshape(mx::slice(lp, {i, 0}, {i + 1, V}), {V})});
    history_.push_back(tok);
  }
  stats_.speculative.rounds += 1;
  stats_.speculative.drafted += k;
  stats_.speculative.accepted += n;

  // The target keeps y and the accepted proposals; its last write held all k + 1.
  if (k - n > 0)
    for (auto& c : cache_) c->trim(k - n, /*bypass=*/true);
  // The drafter's cache holds committed states only: y's and the accepted proposals' join it
  // with the next block.
  if (drafter_.dflash)
    dflash_context_ = {mx::slice(states, {0, 0, 0}, {1, n + 1, states.shape(2)})};
  if (drafter_.model) {
    // The draft was fed its pending tokens and proposals 0..k-2; it keeps those up to n - 1.
    const int trim = std::max(k - 1 - n, 0);
    bool trimmable = true;
    for (auto& c : draft_cache_) trimmable = trimmable && c->is_trimmable();
    if (trim == 0) {
      draft_pending_ = n == k ? std::vector<int>{d[k - 1], token} : std::vector<int>{token};
    } else if (trimmable) {
      for (auto& c : draft_cache_) c->trim(trim);
      draft_pending_ = {token};
    } else {
      // A wrapped ring lost rows to single-token writes: back to before the round, and the
      // next round's first draft forward feeds everything since.
      for (size_t i = 0; i < draft_cache_.size(); ++i) {
        KVCacheBase* c = draft_cache_[i].get();
        check(c == snaps[i].first, "speculative", "the draft's cache layer ", i,
              " was replaced (quantized) in this round and cannot be rolled back");
        if (auto* r = dynamic_cast<RotatingCacheBase*>(c))
          r->restore(snaps[i].second);
        else
          c->trim(draft_fed);
      }
      draft_pending_ = pending_before;
      draft_pending_.insert(draft_pending_.end(), d.begin(), d.begin() + n);
      draft_pending_.push_back(token);
    }
  }
  y_ = token;

  if (!drafter_.backoff) return;
  if (k > 0 && n == 0) {
    if (++dry_ >= Drafter::kDryRounds) {
      ++backoffs_;
      const bool model_drafter = drafter_.model || drafter_.dflash;
      // Past the longest pause, or at a useless model's second back-off, the proposer is dropped
      // for the rest of the stream: a draft model would otherwise still be fed every token at its
      // next probe.
      const SpeculativeStats& st = stats_.speculative;
      const bool useless = model_drafter && backoffs_ >= 2 &&
                           st.accepted * Drafter::kUselessRatio < st.drafted;
      pause_ = useless || next_pause_ > Drafter::kMaxPause ? std::numeric_limits<int>::max()
                                                           : next_pause_;
      next_pause_ *= 2;
      // A model's probe after the pause is one round (its drafting and catch-up cost); prompt
      // lookup's proposals cost nothing to make, so it probes for kDryRounds rounds again.
      dry_ = model_drafter ? Drafter::kDryRounds - 1 : 0;
    }
  } else if (n > 0) {
    dry_ = 0;
    next_pause_ = Drafter::kFirstPause;
  }
}

std::optional<Step> SpeculativeGenerator::next() {
  if (n_ >= opt_.max_tokens) return std::nullopt;
  if (ready_.empty()) round();
  if (!started_) {
    started_ = true;
    first_token_ = Clock::now();
    stats_.prompt_seconds = seconds(start_, first_token_);
  }
  Step out = ready_.front();
  ready_.pop_front();
  ++n_;
  stats_.generation_tokens = n_;
  stats_.generation_seconds = seconds(first_token_, Clock::now());
  stats_.peak_memory = mx::get_peak_memory();
  if (n_ % 256 == 0) mx::clear_cache();
  return out;
}

GenerationStats speculative_generate(Model& model, Cache& cache, const std::vector<int>& context,
                                     const std::vector<int>& prompt, const GenerateOptions& options,
                                     Drafter drafter, const std::vector<int>& eos_ids,
                                     const std::function<bool(const Step&)>& on_token) {
  SpeculativeGenerator gen(model, cache, context, prompt, options, drafter);
  while (auto s = gen.next()) {
    if (std::find(eos_ids.begin(), eos_ids.end(), s->token) != eos_ids.end()) break;
    if (!on_token(*s)) break;
  }
  GenerationStats stats = gen.stats();
  add_kv_stats(stats, cache);
  return stats;
}

}  // namespace lmx
