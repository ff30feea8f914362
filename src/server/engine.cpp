#include "server/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "engine/embed.h"
#include "engine/model_impl.h"
#include "engine/vocab.h"
#include "server/api_error.h"

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

bool Job::pop(std::vector<TokenEvent>& out, std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto ready = [&] { return done_ || !events_.empty(); };
  if (wait == std::chrono::milliseconds::max())
    cv_.wait(lock, ready);
  else
    cv_.wait_for(lock, wait, ready);
  out.assign(std::make_move_iterator(events_.begin()), std::make_move_iterator(events_.end()));
  events_.clear();
  return !(done_ && out.empty());
}

Engine::Engine(const EngineOptions& o)
    : options_(o),
      model_(LanguageModel::load(o.model, {.exact = o.exact, .adapter_path = o.adapter_path})) {
  for (const auto& [name, dir] : o.adapters) model_.load_adapter(name, dir);
  if (o.draft_model && is_dflash_drafter(*o.draft_model)) {
    dflash_ = load_dflash_drafter(*o.draft_model);
  } else if (o.draft_model) {
    draft_ =
        std::make_shared<LanguageModel>(LanguageModel::load(*o.draft_model, {.exact = o.exact}));
    check(draft_->vocab_size() == model_.vocab_size(), "serve", "the draft model's vocabulary has ",
          draft_->vocab_size(), " tokens, the model's has ", model_.vocab_size(),
          ", expected the same vocabulary");
  }
  // The K/V of a prompt depend on the adapter too.
  options_.scheduler.cache_key =
      std::filesystem::weakly_canonical(o.model).string() +
      (o.adapter_path ? "\nadapter:" + std::filesystem::weakly_canonical(*o.adapter_path).string()
                      : "");
}

Engine::~Engine() { stop(); }

const Tokenizer& Engine::tokenizer() const { return model_.impl().tokenizer; }
const ModelInfo& Engine::info() const { return model_.impl().loaded.info; }
const std::vector<int>& Engine::eos_ids() const { return model_.impl().eos; }
int Engine::vocab_size() const { return model_.vocab_size(); }

int Engine::hidden_size() const {
  const auto& c = info().config;
  // Multimodal configs keep the language model's size under text_config.
  const auto& t = c.contains("text_config") ? c["text_config"] : c;
  return t.contains("hidden_size") && t["hidden_size"].is_number_integer()
             ? t["hidden_size"].get<int>()
             : -1;
}

std::shared_ptr<const constrain::TokenTable> Engine::token_table() const {
  return model_.impl().tokens();
}

void Engine::start() {
  std::lock_guard<std::mutex> lock(mu_);
  scheduler_ = std::make_unique<Scheduler>(model_, options_.scheduler);
}

SchedulerStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return scheduler_ ? scheduler_->stats() : SchedulerStats{};
}

size_t Engine::queued() const {
  return scheduler_ ? static_cast<size_t>(scheduler_->waiting()) : 0;
}

void Engine::stop() {
  std::unique_ptr<Scheduler> s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s.swap(scheduler_);
  }
  s.reset();  // ends every job ("cancelled") and joins
}

void Engine::load_adapter(const std::string& name, const std::filesystem::path& dir) {
  std::lock_guard<std::mutex> lock(mu_);
  if (scheduler_)
    scheduler_->run([&] { model_.load_adapter(name, dir); });
  else
    model_.load_adapter(name, dir);
}

void Engine::unload_adapter(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  if (scheduler_)
    scheduler_->run([&] { model_.unload_adapter(name); });
  else
    model_.unload_adapter(name);
}

std::optional<std::string> Engine::adapter_at(const std::filesystem::path& dir) const {
  std::error_code ec;
  const auto want = std::filesystem::weakly_canonical(dir, ec);
  if (ec) return std::nullopt;
  for (const auto& a : model_.adapters()) {
    const auto have = std::filesystem::weakly_canonical(a.path, ec);
    if (!ec && have == want) return a.name;
  }
  return std::nullopt;
}

void Engine::cancel(Job& job) {
  job.cancelled = true;
  std::lock_guard<std::mutex> lock(mu_);
  if (scheduler_ && job.id) scheduler_->cancel(job.id);
}

void Engine::submit(const std::shared_ptr<Job>& job) {
  if (job->id) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!scheduler_) {
    job->finish(JobResult{{}, 0, "cancelled", "the server is shutting down", {}});
    return;
  }
  if (!job->embed.empty()) {
    job->id = ~uint64_t{0};
    scheduler_->run([&] { run_embed(*job); });
    return;
  }
  StreamRequest req;
  req.prompt = job->prompt;
  req.options = job->options;
  req.top_logprobs = job->top_logprobs;
  // The scheduler's thread: the job's events go to its HTTP thread.
  auto last = std::make_shared<std::chrono::steady_clock::time_point>();
  const auto submitted = std::chrono::steady_clock::now();
  req.on_token = [job, last, submitted, metrics = options_.metrics](const StreamToken& t) {
    if (metrics && t.token >= 0) {
      const auto now = std::chrono::steady_clock::now();
      if (*last == std::chrono::steady_clock::time_point{})
        metrics->first_token(std::chrono::duration<double>(now - submitted).count());
      else
        metrics->next_token(std::chrono::duration<double>(now - *last).count());
      *last = now;
    }
    job->push(TokenEvent{t.token, std::string(t.text), t.logprob, t.top});
    return !job->cancelled.load();
  };
  req.on_done = [job, log = options_.log_stats, metrics = options_.metrics,
                 name = options_.name](const StreamResult& r) {
    if (metrics)
      metrics->finished(name, static_cast<int>(job->prompt.size()), r.stats.generation_tokens,
                        r.finish_reason);
    if (log && r.error.empty())
      std::fprintf(stderr,
                   "lmx serve: INFO: job: prompt %zu tokens (%zu cached), %.3f tokens-per-sec; "
                   "generation %d tokens, %.3f tokens-per-sec; %s\n",
                   job->prompt.size(), r.cached_tokens, r.stats.prompt_tps(),
                   r.stats.generation_tokens, r.stats.generation_tps(), r.finish_reason.c_str());
    job->finish(JobResult{
        r.stats, r.cached_tokens, r.finish_reason == "error" ? "" : r.finish_reason, r.error, {}});
  };
  try {
    job->id = scheduler_->submit(std::move(req));
  } catch (const QueueFullError& e) {
    throw ApiError(429, e.what(), "", "rate_limit_error", "queue_full");
  } catch (const MemoryAdmissionError& e) {
    throw ApiError(400, e.what(), "", "memory_admission", "memory_admission");
  } catch (const lmx::Error& e) {
    throw ApiError(400, e.what());
  }
}

void Engine::run_embed(Job& job) {
  JobResult r;
  try {
    for (const auto& ids : job.embed) {
      if (job.cancelled.load()) {
        r.finish_reason = "cancelled";
        break;
      }
      mx::array e = embed_sequence(*model_.impl().loaded.model, ids);
      mx::eval(e);
      r.embeddings.emplace_back(e.data<float>(), e.data<float>() + e.size());
    }
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  job.finish(std::move(r));
}

}  // namespace lmx::server
