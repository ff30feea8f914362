// The engine: one thread owns the model, every MLX array and the prompt cache. HTTP threads
// submit jobs (token ids and options) to a FIFO queue and read the job's token events; a job
// whose client went away is cancelled between two tokens.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "constrain/token_constraint.h"
#include "lmx/lmx.h"
#include "models/model.h"
#include "server/prompt_cache_lru.h"
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

  // Engine side.
  void push(TokenEvent ev);
  void finish(JobResult r);
  // HTTP side: waits for events; returns false once the job has finished and all were taken.
  bool pop(std::vector<TokenEvent>& out);
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
  size_t prompt_cache_entries = 10;
  std::optional<size_t> prompt_cache_bytes;
  bool log_stats = false;  // one line per job on standard error: tokens and speeds
};

class Engine {
 public:
  explicit Engine(const EngineOptions& options);  // loads the model on the calling thread
  ~Engine();
  void start();
  // Queues a job; its events and result come back through the job itself.
  void submit(std::shared_ptr<Job> job);
  // Cancels queued and running jobs and joins the thread.
  void stop();

  const Tokenizer& tokenizer() const { return tokenizer_; }
  const ModelInfo& info() const { return loaded_.info; }
  const std::vector<int>& eos_ids() const { return eos_; }
  int vocab_size() const;
  int hidden_size() const;  // the length of an embedding
  size_t queued() const;
  // Token bytes and their trie for constrained decoding; built on first use (any thread).
  std::shared_ptr<const constrain::TokenTable> token_table() const;

 private:
  void loop();
  void run(Job& job);
  void run_embed(Job& job);

  LoadedWeights loaded_;
  Tokenizer tokenizer_;
  std::vector<int> eos_;
  std::string cache_key_;
  bool log_stats_;
  PromptCacheLRU prompt_cache_;
  mutable std::once_flag token_table_once_;
  mutable std::shared_ptr<const constrain::TokenTable> token_table_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace lmx::server
