// Continuous batching (docs/batching.md). One thread owns the model. Each iteration admits
// queued requests as rows (up to max_batch), prefills one chunk of up to prompt_concurrency
// joining rows, then runs one decode step over every ready row: a single forward of (B, 1)
// tokens through a row view of the rows' own caches (cache/rows_cache.h), then each row's own
// processors, constraint, log-probabilities and sampler. As in the single-stream loop, the next
// step is queued (async_eval) before the tokens of the current one are read; a row that ends on
// a token it reads has one more step in flight, whose output is dropped.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "cache/prompt_cache_lru.h"
#include "cache/rows_cache.h"
#include "core/error.h"
#include "core/progress.h"
#include "engine/memory.h"
#include "engine/model_impl.h"
#include "generate/generate.h"
#include "generate/speculative.h"
#include "kernels/cpu/log_softmax.h"
#include "kernels/cuda/routing.h"
#include "lmx/lmx.h"
#include "nn/rows_tier.h"
#include "tokenizer/tokenizer.h"

namespace lmx {

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct Row {
  uint64_t id = 0;
  StreamRequest req;
  GenerateOptions opt;  // req.options with the model's kv_config as the default
  std::unique_ptr<AdapterHold> adapter;
  std::string cache_key;  // the scheduler's key and the row's adapter
  Cache cache;
  size_t cached = 0;      // prompt tokens taken from the prompt cache
  std::vector<int> rest;  // the prompt after them
  int fed = 0;            // tokens of `rest` prefilled
  std::vector<int> seen;  // prompt and read tokens: what the cache holds, for the prompt cache
  std::optional<mx::array> history;
  std::optional<mx::random::KeySequence> keys;
  std::optional<mx::array> feed;         // the last sampled token: the next step's input
  std::optional<mx::array> y, logprobs;  // the last step's output, not yet read
  std::optional<mx::array> next_y, next_logprobs;
  int produced = 0;  // tokens sampled, read or not
  int delivered = 0;
  std::optional<StreamingDetokenizer> detok;
  // Speculative decoding (GenerateOptions::speculative): the row runs its own rounds (draft K,
  // verify K + 1 in one forward) beside the batched step, never inside it.
  std::unique_ptr<SpeculativeGenerator> spec;
  GenerationStats stats;
  Clock::time_point start, first_token;
  bool done = false;

  bool prefilling() const { return !spec && fed < static_cast<int>(rest.size()) - 1; }
  bool steps() const { return !done && !spec && !prefilling() && produced < opt.max_tokens; }
};

// The sampled token's log-probability and the n best alternatives, from (V,) log-probabilities.
void add_logprobs(StreamToken& t, const mx::array& logprobs_any, int n) {
  const mx::array logprobs = mx::astype(logprobs_any, mx::float32);  // bf16 / f16 models too
  t.logprob = mx::take(logprobs, mx::array(t.token)).item<float>();
  if (n <= 0) return;
  n = std::min(n, static_cast<int>(logprobs.size()));
  mx::array idx = mx::slice(mx::argsort(mx::negative(logprobs)), {0}, {n});
  mx::array vals = mx::take(logprobs, idx);
  mx::eval({idx, vals});
  const auto* ip = idx.data<uint32_t>();
  const auto* vp = vals.data<float>();
  for (int i = 0; i < n; ++i) t.top.emplace_back(static_cast<int>(ip[i]), vp[i]);
}

}  // namespace

struct Scheduler::State {
  State(LanguageModel& m, const SchedulerOptions& o)
      : model(m),
        impl(m.impl()),
        opt(o),
        prompt_cache(o.prompt_cache_entries, o.prompt_cache_bytes) {
    check(o.max_batch >= 0, "scheduler", "max_batch must be >= 0, got ", o.max_batch);
    check(o.prompt_concurrency >= 1, "scheduler", "prompt_concurrency must be >= 1, got ",
          o.prompt_concurrency);
    check(o.prefill_step_size >= 1, "scheduler", "prefill_step_size must be >= 1, got ",
          o.prefill_step_size);
    check(o.max_queue >= 0, "scheduler", "max_queue must be >= 0, got ", o.max_queue);
    max_batch = o.max_batch > 0 ? o.max_batch : (mx::default_device() == mx::Device::gpu ? 64 : 16);
    if (o.memory_budget) memory = model_memory(impl.dir);
  }

  LanguageModel& model;
  LanguageModel::Impl& impl;
  SchedulerOptions opt;
  int max_batch = 16;
  PromptCacheLRU prompt_cache;

  struct Queued {
    uint64_t id;
    StreamRequest req;
  };
  mutable std::mutex mu;
  std::condition_variable cv;
  std::deque<Queued> queue;
  std::deque<std::function<void()>> tasks;
  std::unordered_set<uint64_t> cancels;
  uint64_t next_id = 1;
  bool stopping = false;
  std::atomic<int> n_active{0};
  std::thread thread;
  std::thread::id thread_id;

  std::vector<std::unique_ptr<Row>> rows;  // the scheduler thread's
  SchedulerStats counts;                   // the scheduler thread's; published into `stats`
  SchedulerStats stats;                    // under mu

  // Memory admission: the model's layout, and the KV bytes each queued or running request
  // reserved at submit (released as its on_done runs).
  std::optional<ModelMemory> memory;
  std::unordered_map<uint64_t, size_t> reserved;
  size_t reserved_total = 0;
  void admit_memory(uint64_t id, StreamRequest& request);

  Model& net() { return *impl.loaded.model; }

  void loop();
  bool wait_for_work();
  void admit(std::deque<Queued>& in);
  void start_row(Row& r);
  void prefill(Row& r);
  mx::array forward(const mx::array& tokens, const std::vector<Row*>& batch);
  void step();
  void speculate();
  void deliver(Row& r);
  void deliver_token(Row& r, int token, const mx::array& logprobs);
  void finish(Row& r, const std::string& reason, const std::string& error = {});
  void reap();
  void publish();
};

struct TurnLock::State {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t next = 0, serving = 0;
};

std::shared_ptr<TurnLock::State> TurnLock::make_state() { return std::make_shared<State>(); }

void TurnLock::lock() {
  std::unique_lock<std::mutex> lock(s_->mu);
  const uint64_t ticket = s_->next++;
  s_->cv.wait(lock, [&] { return s_->serving == ticket; });
}

void TurnLock::unlock() {
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    ++s_->serving;
  }
  s_->cv.notify_all();
}

bool Scheduler::State::wait_for_work() {
  std::deque<Queued> in;
  std::deque<std::function<void()>> run;
  std::unordered_set<uint64_t> cancel;
  std::deque<Queued> dropped;
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return stopping || !rows.empty() || !queue.empty() || !tasks.empty(); });
    if (stopping) return false;
    run.swap(tasks);
    cancel.swap(cancels);
    for (auto it = queue.begin(); it != queue.end();) {
      if (cancel.count(it->id)) {
        dropped.push_back(std::move(*it));
        it = queue.erase(it);
      } else {
        ++it;
      }
    }
    const int room = max_batch - static_cast<int>(rows.size());
    for (int i = 0; i < room && !queue.empty(); ++i) {
      in.push_back(std::move(queue.front()));
      queue.pop_front();
    }
  }
  for (auto& fn : run) fn();
  for (auto& r : rows)
    if (!r->done && cancel.count(r->id)) finish(*r, "cancelled");
  for (auto& q : dropped) {
    StreamResult res;
    res.finish_reason = "cancelled";
    if (q.req.on_done) q.req.on_done(res);
  }
  admit(in);
  return true;
}

void Scheduler::State::admit(std::deque<Queued>& in) {
  for (auto& q : in) {
    auto r = std::make_unique<Row>();
    r->id = q.id;
    r->req = std::move(q.req);
    try {
      start_row(*r);
    } catch (const std::exception& e) {
      finish(*r, "error", e.what());
      continue;
    }
    rows.push_back(std::move(r));
  }
  n_active = static_cast<int>(rows.size());
}

void Scheduler::State::start_row(Row& r) {
  r.start = Clock::now();
  r.opt = r.req.options;
  if (!r.opt.kv_config) r.opt.kv_config = impl.kv_config;
  if (r.opt.seed) r.keys.emplace(*r.opt.seed);
  r.detok.emplace(impl.tokenizer);
  r.adapter = std::make_unique<AdapterHold>(impl, r.opt.adapter);
  r.cache_key = opt.cache_key;
  if (!r.opt.adapter.empty()) r.cache_key += "\nadapter:" + impl.adapter_key(r.opt.adapter);
  const std::vector<int>& prompt = r.req.prompt;
  if (auto hit = prompt_cache.take(r.cache_key, prompt)) {
    r.cache = std::move(hit->cache);
    r.cached = hit->reused;
    ++counts.prompt_cache_hits;
    counts.cached_tokens += r.cached;
  } else {
    r.cache = net().make_cache();
    ++counts.prompt_cache_misses;
  }
  r.rest.assign(prompt.begin() + static_cast<long>(r.cached), prompt.end());
  r.seen = prompt;
  r.stats.prompt_tokens = static_cast<int>(r.rest.size());
  if (r.opt.max_tokens == 0) return finish(r, "length");
  if (r.opt.speculative()) {
    // Its prompt is prefilled here, whole (the generator's own prefill), with its adapter.
    Drafter drafter;
    if (r.opt.draft_model) drafter.model = r.opt.draft_model->impl().loaded.model.get();
    drafter.dflash = r.opt.dflash.get();
    drafter.prompt_lookup = r.opt.prompt_lookup;
    const std::vector<int> context(prompt.begin(), prompt.begin() + static_cast<long>(r.cached));
    nn::RouteGuard route(r.adapter->slot() >= 0 ? impl.router() : nullptr, {r.adapter->slot()});
    r.spec =
        std::make_unique<SpeculativeGenerator>(net(), r.cache, context, r.rest, r.opt, drafter);
  }
}

mx::array Scheduler::State::forward(const mx::array& tokens, const std::vector<Row*>& batch) {
  Model& m = net();
  // Each row's adapter applies to its own rows of the batch (nn/adapter_router.h).
  std::vector<int> slots;
  bool adapters = false;
  for (Row* r : batch) {
    slots.push_back(r->adapter ? r->adapter->slot() : -1);
    adapters = adapters || slots.back() >= 0;
  }
  // One row (a prefill chunk, a lone decode step) runs on its cache as a single stream does:
  // the same ops in L1, and in L3 the fused layer kernels, which take one position.
  if (batch.size() == 1) {
    nn::RouteGuard route(adapters ? impl.router() : nullptr, slots);
    return m(tokens, batch.front()->cache);
  }
  if (m.batches_rows()) {
    nn::RouteGuard route(adapters ? impl.router() : nullptr, slots);
    std::vector<Cache*> caches;
    caches.reserve(batch.size());
    for (Row* r : batch) caches.push_back(&r->cache);
    Cache view = rows_view(caches, m.cpu_kernels());
    nn::CudaRowsGuard cuda_rows(impl.loaded.cuda_kernels && kernels::cuda::rows_routed());
    return m(tokens, view);
  }
  std::vector<mx::array> out;
  for (size_t b = 0; b < batch.size(); ++b) {
    const int i = static_cast<int>(b);
    nn::RouteGuard route(slots[b] >= 0 ? impl.router() : nullptr, {slots[b]});
    out.push_back(m(mx::slice(tokens, {i, 0}, {i + 1, tokens.shape(1)}), batch[b]->cache));
  }
  return mx::concatenate(out, 0);
}

void Scheduler::State::prefill(Row& r) {
  const int n = std::min(opt.prefill_step_size, static_cast<int>(r.rest.size()) - 1 - r.fed);
  mx::array chunk(r.rest.data() + r.fed, {1, n}, mx::int32);
  prefill_chunk(chunk, r.cache, r.opt, r.history,
                [&](const mx::array& t) { return forward(t, {&r}); });
  r.fed += n;
}

void Scheduler::State::step() {
  std::vector<Row*> batch;
  auto collect = [&] {
    batch.clear();
    for (auto& r : rows)
      if (r->steps()) batch.push_back(r.get());
  };
  collect();
  // A constrained row's mask needs its last token on the host: read the step in flight first.
  bool constrained = false;
  for (Row* r : batch) constrained = constrained || r->opt.constraint != nullptr;
  if (constrained) {
    for (auto& r : rows) deliver(*r);
    collect();
  }
  if (!batch.empty()) {
    ++counts.steps;
    std::vector<mx::array> inputs;
    inputs.reserve(batch.size());
    for (Row* r : batch)
      inputs.push_back(r->feed ? *r->feed : mx::array(&r->rest.back(), {1}, mx::int32));
    const int B = static_cast<int>(batch.size());
    try {
      mx::array logits = forward(mx::reshape(mx::concatenate(inputs), {B, 1}), batch);
      const int V = logits.shape(2);
      // Tier L3 on the CPU: rows without processors or a constraint take their log-probabilities
      // from one log_softmax over the step's logits, and greedy rows their tokens from one argmax
      // (each row's values are those of its own (1, V) call: the kernel and argmax work row by
      // row), instead of a small graph per row.
      std::optional<mx::array> all_lp, all_y;
      const auto plain = [](const Row& r) {
        return !r.opt.processors.any() && r.opt.constraint == nullptr;
      };
      if (net().cpu_kernels() && B > 1) {
        bool any = false, greedy = false;
        for (Row* r : batch) {
          any = any || plain(*r);
          greedy = greedy || (plain(*r) && r->opt.sampler.temp == 0);
        }
        if (any) all_lp = kernels::cpu::log_softmax(mx::reshape(logits, {B, V}));
        if (greedy) all_y = mx::argmax(*all_lp, -1);
      }
      std::vector<mx::array> out;
      for (int b = 0; b < B; ++b) {
        Row& r = *batch[b];
        try {
          std::optional<mx::array> key;
          if (r.keys && r.opt.sampler.temp != 0) key = r.keys->next();
          mx::array y = mx::array(0), lp = mx::array(0.0f);
          if (all_lp && plain(r)) {
            maybe_quantize_kv_cache(r.cache, r.opt);
            mx::array row = mx::slice(*all_lp, {b, 0}, {b + 1, V});
            y = r.opt.sampler.temp == 0 ? mx::slice(*all_y, {b}, {b + 1})
                                        : sample(row, r.opt.sampler, key);
            lp = mx::reshape(row, {V});
          } else {
            mx::array row = mx::reshape(mx::slice(logits, {b, 0, 0}, {b + 1, 1, V}), {1, V});
            std::tie(y, lp) = sample_next(net(), row, inputs[b], r.feed.has_value(), r.cache, r.opt,
                                          r.history, key);
          }
          r.feed = y;
          r.next_y = y;
          r.next_logprobs = lp;
          ++r.produced;
          out.push_back(y);
          out.push_back(lp);
        } catch (const std::exception& e) {
          finish(r, "error", e.what());
        }
      }
      mx::async_eval(out);
    } catch (const std::exception& e) {
      for (Row* r : batch) finish(*r, "error", e.what());
    }
  }
  for (auto& r : rows) {
    deliver(*r);
    if (r->next_y) {
      r->y = std::move(r->next_y);
      r->logprobs = std::move(r->next_logprobs);
      r->next_y.reset();
      r->next_logprobs.reset();
    }
  }
}

void Scheduler::State::speculate() {
  for (auto& rp : rows) {
    Row& r = *rp;
    if (r.done || !r.spec) continue;
    try {
      nn::RouteGuard route(r.adapter->slot() >= 0 ? impl.router() : nullptr, {r.adapter->slot()});
      // One round's tokens (its accepted proposals and the target's own token).
      do {
        std::optional<Step> s = r.spec->next();
        if (!s) {
          finish(r, "length");
          break;
        }
        deliver_token(r, s->token, s->logprobs);
      } while (!r.done && r.spec->has_ready());
    } catch (const std::exception& e) {
      finish(r, "error", e.what());
    }
  }
}

void Scheduler::State::deliver(Row& r) {
  if (!r.y) return;
  mx::array y = *r.y, lp = *r.logprobs;
  r.y.reset();
  r.logprobs.reset();
  if (r.done) return;
  try {
    deliver_token(r, y.item<int>(), lp);
  } catch (const std::exception& e) {
    finish(r, "error", e.what());
  }
}

void Scheduler::State::deliver_token(Row& r, int token, const mx::array& lp) {
  if (r.delivered == 0) {
    r.first_token = Clock::now();
    r.stats.prompt_seconds = seconds(r.start, r.first_token);
  }
  check_sampled(lp, token);
  r.seen.push_back(token);
  const auto& eos = impl.eos;
  if (!r.opt.ignore_eos && std::find(eos.begin(), eos.end(), token) != eos.end())
    return finish(r, "stop");
  StreamToken t{token, {}, 0, {}};
  const std::string text = r.detok->add(token);
  t.text = text;
  if (r.req.top_logprobs >= 0) add_logprobs(t, lp, r.req.top_logprobs);
  ++r.delivered;
  r.stats.generation_tokens = r.delivered;
  r.stats.generation_seconds = seconds(r.first_token, Clock::now());
  if (r.req.on_token && !r.req.on_token(t)) return finish(r, "cancelled");
  if (r.delivered == r.opt.max_tokens) finish(r, "length");
}

void Scheduler::State::finish(Row& r, const std::string& reason, const std::string& error) {
  if (r.done) return;
  r.done = true;
  StreamResult res;
  res.finish_reason = reason;
  res.error = error;
  res.cached_tokens = r.cached;
  if (reason != "cancelled" && reason != "error" && r.detok && r.req.on_token) {
    try {
      const std::string tail = r.detok->finalize();
      if (!tail.empty()) r.req.on_token(StreamToken{-1, tail, 0, {}});
    } catch (const std::exception&) {  // a client gone at its last text
    }
  }
  if (r.spec) {
    r.stats.speculative = r.spec->stats().speculative;
    r.spec.reset();  // waits for its last round
  }
  r.stats.peak_memory = mx::get_peak_memory();
  add_kv_stats(r.stats, r.cache);
  res.stats = r.stats;
  if (error.empty() && !r.cache.empty()) {
    // A step may be in flight past the last token read: the cache's offset says what it holds.
    const int offset = r.cache[0]->offset();
    r.seen.resize(std::min(r.seen.size(), static_cast<size_t>(std::max(offset, 0))));
    if (r.fed + static_cast<int>(r.cached) > 0 || offset > 0)
      prompt_cache.put(r.cache_key, std::move(r.seen), std::move(r.cache));
  }
  r.adapter.reset();
  if (r.req.on_done) {
    try {
      r.req.on_done(res);
    } catch (const std::exception&) {  // the caller's; the row is over either way
    }
  }
}

void Scheduler::State::reap() {
  std::erase_if(rows, [](const std::unique_ptr<Row>& r) { return r->done; });
  n_active = static_cast<int>(rows.size());
}

void Scheduler::State::publish() {
  counts.active = static_cast<int>(rows.size());
  counts.prompt_cache_entries = prompt_cache.entries();
  counts.prompt_cache_bytes = prompt_cache.bytes();
  counts.kv_bytes = 0;
  for (auto& r : rows) counts.kv_bytes += cache_bytes(r->cache);
  std::lock_guard<std::mutex> lock(mu);
  counts.waiting = static_cast<int>(queue.size());
  stats = counts;
}

void Scheduler::State::loop() {
  // Other models' schedulers (SchedulerOptions::turns) run between two iterations of this one.
  std::unique_lock<TurnLock> turn;
  if (opt.turns) turn = std::unique_lock<TurnLock>(*opt.turns, std::defer_lock);
  while (true) {
    if (turn.owns_lock()) turn.unlock();
    {
      // Waits outside the turn: an idle model holds no one up.
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return stopping || !rows.empty() || !queue.empty() || !tasks.empty(); });
    }
    if (turn.mutex()) turn.lock();
    if (!wait_for_work()) break;
    int prefilled = 0;
    for (auto& r : rows) {
      if (prefilled == opt.prompt_concurrency) break;
      if (r->done || !r->prefilling()) continue;
      try {
        prefill(*r);
      } catch (const std::exception& e) {
        finish(*r, "error", e.what());
      }
      ++prefilled;
    }
    step();
    speculate();
    reap();
    if (rows.empty()) mx::clear_cache();
    publish();
  }
  // Stopping: the step in flight finishes before the rows' arrays go.
  mx::synchronize();
  for (auto& r : rows) finish(*r, "cancelled");
  rows.clear();
  std::deque<Queued> left;
  std::deque<std::function<void()>> run;
  {
    std::lock_guard<std::mutex> lock(mu);
    left.swap(queue);
    run.swap(tasks);
  }
  for (auto& fn : run) fn();  // their callers wait on them
  for (auto& q : left) {
    StreamResult res;
    res.finish_reason = "cancelled";
    if (q.req.on_done) q.req.on_done(res);
  }
}

Scheduler::Scheduler(LanguageModel& model, SchedulerOptions options)
    : s_(std::make_unique<State>(model, options)) {
  std::lock_guard<std::mutex> lock(s_->mu);  // thread_id is written before anyone reads it
  s_->thread = std::thread([this] { s_->loop(); });
  s_->thread_id = s_->thread.get_id();
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    s_->stopping = true;
  }
  s_->cv.notify_all();
  if (s_->thread.joinable()) s_->thread.join();
}

uint64_t Scheduler::submit(StreamRequest request) {
  validate_request(s_->model, request.prompt, request.options);
  validate_generation(request.options, s_->impl.num_caches());
  std::lock_guard<std::mutex> lock(s_->mu);
  check(!s_->stopping, "scheduler", "the scheduler is shutting down");
  if (s_->opt.max_queue > 0 && static_cast<int>(s_->queue.size()) >= s_->opt.max_queue)
    throw QueueFullError("[scheduler] the queue is full: " + std::to_string(s_->queue.size()) +
                         " requests waiting, expected at most max_queue " +
                         std::to_string(s_->opt.max_queue));
  const uint64_t id = s_->next_id++;
  if (s_->memory) s_->admit_memory(id, request);
  s_->queue.push_back({id, std::move(request)});
  s_->cv.notify_all();
  return id;
}

// Called with mu held. The KV cache a request can reach: prompt + max_tokens tokens, quantized past
// quantized_kv_start with kv_bits (the float cache up to it counts until then).
void Scheduler::State::admit_memory(uint64_t id, StreamRequest& request) {
  const GenerateOptions& o = request.options;
  const long long tokens = static_cast<long long>(request.prompt.size()) + o.max_tokens;
  size_t need = kv_bytes(*memory, tokens);
  if (o.kv_bits && tokens > o.quantized_kv_start)
    need = std::max(kv_bytes(*memory, o.quantized_kv_start),
                    kv_bytes(*memory, tokens, {*o.kv_bits, o.kv_group_size}));
  const size_t transient = transient_bytes(
      *memory, std::min<long long>(opt.prefill_step_size, request.prompt.size()), tokens);
  const size_t budget = *opt.memory_budget;
  const size_t total = memory->weight_bytes + reserved_total + need + transient;
  if (total > budget) {
    auto gb = [](size_t b) { return format_bytes(b); };
    throw MemoryAdmissionError(
        "[scheduler] memory admission: the request needs " + gb(need) + " of KV cache for " +
        std::to_string(tokens) + " tokens (prompt " + std::to_string(request.prompt.size()) +
        " + max_tokens " + std::to_string(o.max_tokens) + ") and " + gb(transient) +
        " transient, beside " + gb(memory->weight_bytes) + " of weights and " + gb(reserved_total) +
        " reserved by " + std::to_string(reserved.size()) + " other requests: " + gb(total) +
        " needed, expected at most the memory budget " + gb(budget));
  }
  reserved[id] = need;
  reserved_total += need;
  request.on_done = [this, id, done = std::move(request.on_done)](const StreamResult& r) {
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = reserved.find(id);
      if (it != reserved.end()) {
        reserved_total -= it->second;
        reserved.erase(it);
      }
    }
    if (done) done(r);
  };
}

void Scheduler::cancel(uint64_t id) {
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    s_->cancels.insert(id);
  }
  s_->cv.notify_all();
}

void Scheduler::run(const std::function<void()>& fn) {
  if (std::this_thread::get_id() == s_->thread_id) return fn();
  std::promise<void> done;
  auto task = [&] {
    try {
      fn();
      done.set_value();
    } catch (...) {
      done.set_exception(std::current_exception());
    }
  };
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    check(!s_->stopping, "scheduler", "the scheduler is shutting down");
    s_->tasks.push_back(task);
  }
  s_->cv.notify_all();
  done.get_future().get();
}

int Scheduler::waiting() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return static_cast<int>(s_->queue.size());
}

int Scheduler::active() const { return s_->n_active.load(); }

int Scheduler::max_batch() const { return s_->max_batch; }

SchedulerStats Scheduler::stats() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  SchedulerStats st = s_->stats;
  st.waiting = static_cast<int>(s_->queue.size());
  st.active = s_->n_active.load();
  return st;
}

}  // namespace lmx
