// The server's side of the library's scheduler (lmx::Scheduler, engine/scheduler.cpp): HTTP
// threads submit jobs (token ids and options) and read the job's token events; the scheduler
// batches the running jobs and owns the model's thread, the prompt cache and every MLX array.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "constrain/token_constraint.h"
#include "lmx/lmx.h"
#include "models/model.h"
#include "server/metrics.h"
#include "tokenizer/tokenizer.h"

namespace lmx::server {

struct TokenEvent {
  int token = -1;    // -1: the detokenizer's final flush
  std::string text;  // text completed by this token (whole UTF-8 sequences only)
  float logprob = 0;
  std::vector<std::pair<int, float>> top;  // top_logprobs alternatives, best first
};

struct JobResult {
  GenerationStats stats;
  size_t cached_tokens = 0;
  std::string finish_reason;                   // "stop" (EOS), "length", "cancelled"
  std::string error;                           // set when generation failed
  std::vector<std::vector<float>> embeddings;  // an embeddings job's vectors, one per input
};

// One request's generation, shared between the HTTP thread that waits on it and the engine.
class Job {
 public:
  std::vector<int> prompt;
  GenerateOptions options;
  // Not empty: an embeddings job (no generation): each sequence's pooled, normalized state.
  std::vector<std::vector<int>> embed;
  int top_logprobs = -1;  // -1: no logprobs; 0: the sampled token's only; n: also the n best
  std::atomic<bool> cancelled{false};
  std::atomic<uint64_t> id{0};  // the scheduler's, once submitted
  // --request-timeout: past it the HTTP side cancels the job and answers 408.
  std::optional<std::chrono::steady_clock::time_point> deadline;
  int timeout_seconds = 0;

  // Engine side.
  void push(TokenEvent ev);
  void finish(JobResult r);
  // HTTP side: waits for events, at most `wait`; returns false once the job has finished and all
  // were taken (out may be empty on true: nothing came within `wait`).
  bool pop(std::vector<TokenEvent>& out,
           std::chrono::milliseconds wait = std::chrono::milliseconds::max());
  const JobResult& result() const { return result_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TokenEvent> events_;
  bool done_ = false;
  JobResult result_;
};

struct EngineOptions {
  std::filesystem::path model;
  bool exact = false;  // tier L1 (stock MLX ops) instead of the fast tier
  std::optional<std::filesystem::path> adapter_path;  // a LoRA adapter (lora/lora.h)
  // --adapter NAME=DIR: LoRA adapters loaded at start, chosen per request by name.
  std::vector<std::pair<std::string, std::filesystem::path>> adapters;
  std::optional<std::filesystem::path> draft_model;  // speculative decoding's draft
  SchedulerOptions scheduler;  // batch size, queue, prefill chunks, prompt cache
  bool log_stats = false;      // one line per job on standard error: tokens and speeds
  Metrics* metrics = nullptr;  // the server's counters (TTFT, inter-token latency, tokens)
  std::string name;            // the model's id in the metrics
};

class Engine {
 public:
  explicit Engine(const EngineOptions& options);  // loads the model on the calling thread
  ~Engine();
  void start();
  // Queues a job (once; a second call does nothing); its events and result come back through
  // the job itself. Throws ApiError 429 past --max-queue, 400 for what the library refuses.
  void submit(const std::shared_ptr<Job>& job);
  // Ends a job at once, queued or running (its client went away); any thread.
  void cancel(Job& job);
  // Cancels queued and running jobs and joins the scheduler's thread.
  void stop();

  const LanguageModel& model() const { return model_; }
  // Per-request adapters (LanguageModel::load_adapter), loaded and unloaded between two steps
  // of the scheduler. Throw lmx::Error as the library does.
  void load_adapter(const std::string& name, const std::filesystem::path& dir);
  void unload_adapter(const std::string& name);
  std::vector<AdapterInfo> adapters() const { return model_.adapters(); }
  bool has_adapter(const std::string& name) const { return model_.has_adapter(name); }
  // The draft model of --draft-model (null without one).
  const std::shared_ptr<LanguageModel>& draft_model() const { return draft_; }
  // The DFlash drafter of --draft-model when that directory holds one (null otherwise).
  const std::shared_ptr<const DFlashDrafter>& dflash() const { return dflash_; }
  // The name of the adapter loaded from `dir` (the same directory), if one is.
  std::optional<std::string> adapter_at(const std::filesystem::path& dir) const;
  const Tokenizer& tokenizer() const;
  const ModelInfo& info() const;
  const std::vector<int>& eos_ids() const;
  int vocab_size() const;
  int hidden_size() const;  // the length of an embedding
  size_t queued() const;
  SchedulerStats stats() const;  // zeros before start() and after stop()
  // Token bytes and their trie for constrained decoding; built on first use (any thread).
  std::shared_ptr<const constrain::TokenTable> token_table() const;

 private:
  void run_embed(Job& job);

  EngineOptions options_;
  LanguageModel model_;
  std::shared_ptr<const DFlashDrafter> dflash_;
  std::shared_ptr<LanguageModel> draft_;
  std::unique_ptr<Scheduler> scheduler_;
  mutable std::mutex mu_;  // scheduler_ against stop()
};

}  // namespace lmx::server
