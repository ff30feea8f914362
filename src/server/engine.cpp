#include "server/engine.h"

#include <algorithm>
#include <cstdio>

#include "engine/embed.h"
#include "engine/vocab.h"
#include "generate/generate.h"
#include "sampling/sampler.h"

namespace lmx::server {

void Job::push(TokenEvent ev) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(ev));
  }
  cv_.notify_all();
}

void Job::finish(JobResult r) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    result_ = std::move(r);
    done_ = true;
  }
  cv_.notify_all();
}

bool Job::pop(std::vector<TokenEvent>& out) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_ || !events_.empty(); });
  out.assign(std::make_move_iterator(events_.begin()), std::make_move_iterator(events_.end()));
  events_.clear();
  return !(done_ && out.empty());
}

Engine::Engine(const EngineOptions& o)
    : loaded_(load_model(o.model, {.exact = o.exact, .adapter_path = o.adapter_path})),
      tokenizer_(Tokenizer::from_dir(o.model)),
      eos_(merged_eos_ids(loaded_.info, tokenizer_)),
      // The K/V of a prompt depend on the adapter too.
      cache_key_(std::filesystem::weakly_canonical(o.model).string() +
                 (o.adapter_path
                      ? "\nadapter:" + std::filesystem::weakly_canonical(*o.adapter_path).string()
                      : "")),
      log_stats_(o.log_stats),
      prompt_cache_(o.prompt_cache_entries, o.prompt_cache_bytes) {}

Engine::~Engine() { stop(); }

int Engine::vocab_size() const { return model_vocab_size(loaded_.info, tokenizer_); }

int Engine::hidden_size() const {
  const auto& c = loaded_.info.config;
  // Multimodal configs keep the language model's size under text_config.
  const auto& t = c.contains("text_config") ? c["text_config"] : c;
  return t.contains("hidden_size") && t["hidden_size"].is_number_integer()
             ? t["hidden_size"].get<int>()
             : -1;
}

std::shared_ptr<const constrain::TokenTable> Engine::token_table() const {
  std::call_once(token_table_once_,
                 [&] { token_table_ = constrain::TokenTable::build(tokenizer_); });
  return token_table_;
}

void Engine::start() {
  thread_ = std::thread([this] { loop(); });
}

void Engine::submit(std::shared_ptr<Job> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      job->finish(JobResult{{}, 0, "cancelled", "the server is shutting down", {}});
      return;
    }
    queue_.push_back(std::move(job));
  }
  cv_.notify_one();
}

size_t Engine::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

void Engine::stop() {
  std::deque<std::shared_ptr<Job>> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    left.swap(queue_);
  }
  cv_.notify_all();
  for (auto& j : left) j->finish(JobResult{{}, 0, "cancelled", "the server is shutting down", {}});
  if (thread_.joinable()) thread_.join();
}

void Engine::loop() {
  while (true) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    run(*job);
  }
}

namespace {

// The sampled token's log-probability and the n best alternatives, from (V,) logprobs.
void add_logprobs(TokenEvent& ev, const mx::array& logprobs, int n) {
  ev.logprob = mx::take(logprobs, mx::array(ev.token)).item<float>();
  if (n <= 0) return;
  n = std::min(n, static_cast<int>(logprobs.size()));
  mx::array idx = mx::slice(mx::argsort(mx::negative(logprobs)), {0}, {n});
  mx::array vals = mx::take(logprobs, idx);
  mx::eval({idx, vals});
  const auto* ip = idx.data<uint32_t>();
  const auto* vp = vals.data<float>();
  for (int i = 0; i < n; ++i) ev.top.emplace_back(static_cast<int>(ip[i]), vp[i]);
}

}  // namespace

void Engine::run_embed(Job& job) {
  JobResult r;
  try {
    for (const auto& ids : job.embed) {
      if (job.cancelled.load()) {
        r.finish_reason = "cancelled";
        break;
      }
      mx::array e = embed_sequence(*loaded_.model, ids);
      mx::eval(e);
      r.embeddings.emplace_back(e.data<float>(), e.data<float>() + e.size());
    }
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  job.finish(std::move(r));
}

void Engine::run(Job& job) {
  if (!job.embed.empty()) return run_embed(job);
  JobResult r;
  std::optional<Cache> cache;
  std::vector<int> seen;  // tokens fed to the model, in cache order
  try {
    validate(job.options.sampler, vocab_size());
    if (auto hit = prompt_cache_.take(cache_key_, job.prompt)) {
      cache = std::move(hit->cache);
      r.cached_tokens = hit->reused;
    } else {
      cache = loaded_.model->make_cache();
    }
    std::vector<int> rest(job.prompt.begin() + static_cast<long>(r.cached_tokens),
                          job.prompt.end());
    seen = job.prompt;
    TokenGenerator gen(*loaded_.model, *cache, rest, job.options);
    StreamingDetokenizer detok(tokenizer_);
    r.finish_reason = "length";
    while (auto s = gen.next()) {
      seen.push_back(s->token);
      if (!job.options.ignore_eos && std::find(eos_.begin(), eos_.end(), s->token) != eos_.end()) {
        r.finish_reason = "stop";
        break;
      }
      TokenEvent ev{s->token, detok.add(s->token), 0, {}};
      if (job.top_logprobs >= 0) add_logprobs(ev, s->logprobs, job.top_logprobs);
      job.push(std::move(ev));
      if (job.cancelled.load()) {
        r.finish_reason = "cancelled";
        break;
      }
    }
    r.stats = gen.stats();
    if (r.finish_reason != "cancelled") {
      std::string tail = detok.finalize();
      if (!tail.empty()) job.push(TokenEvent{-1, std::move(tail), 0, {}});
    }
    // The generator queues the step after each token it hands out, so the cache may hold one
    // token more than was read; its offset says how many.
    const int offset = cache->empty() ? 0 : (*cache)[0]->offset();
    seen.resize(std::min(seen.size(), static_cast<size_t>(std::max(offset, 0))));
    prompt_cache_.put(cache_key_, std::move(seen), std::move(*cache));
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  if (log_stats_ && r.error.empty()) {
    std::fprintf(stderr,
                 "lmx serve: INFO: job: prompt %zu tokens (%zu cached), %.3f tokens-per-sec; "
                 "generation %d tokens, %.3f tokens-per-sec; %s\n",
                 job.prompt.size(), r.cached_tokens, r.stats.prompt_tps(),
                 r.stats.generation_tokens, r.stats.generation_tps(), r.finish_reason.c_str());
  }
  job.finish(std::move(r));
}

}  // namespace lmx::server
