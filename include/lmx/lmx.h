// lmx public C++ API: load an MLX-format model directory, tokenize, generate with options and a
// streaming callback. Everything MLX stays behind this header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lmx {

std::string version();
class LanguageModel;
class DFlashDrafter;  // src/generate/dflash.h
// "cpu" or "cuda (<device name>)": what MLX runs on in this build.
std::string backend_description();

// mlx-lm's make_sampler arguments.
struct SamplerOptions {
  float temp = 0.0f;   // 0: greedy (argmax)
  float top_p = 0.0f;  // applied when 0 < top_p < 1
  float min_p = 0.0f;
  int min_tokens_to_keep = 1;
  int top_k = 0;
};

// mlx-lm's make_logits_processors arguments.
struct LogitsProcessorOptions {
  std::vector<std::pair<int, float>> logit_bias;
  std::optional<float> repetition_penalty;
  int repetition_context_size = 20;
  std::optional<float> presence_penalty;
  int presence_context_size = 20;
  std::optional<float> frequency_penalty;
  int frequency_context_size = 20;
  bool any() const {
    return !logit_bias.empty() || (repetition_penalty && *repetition_penalty != 0) ||
           (presence_penalty && *presence_penalty != 0) ||
           (frequency_penalty && *frequency_penalty != 0);
  }
};

// One entry of a model's kv_config.json (mlx-optiq's per-layer KV quantization): the KV cache
// of decoder layer `layer` stored at these bits and group size.
struct KVLayerBits {
  int layer = 0;
  int bits = 8;
  int group_size = 64;
  bool operator==(const KVLayerBits&) const = default;
};

// Decides which tokens may come next (JSON-schema decoding). generate() asks for the mask on the
// host before sampling each token and reports every token it sampled; one constraint serves one
// generation.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // allowed()[id] != 0: token `id` may come next (ids past its size never may).
  virtual const std::vector<uint8_t>& allowed() = 0;
  // Advances past a sampled token. Throws lmx::Error for a token that was not allowed.
  virtual void accept(int token) = 0;
  // The output so far is complete (an EOS token is allowed).
  virtual bool complete() const = 0;
};

struct GenerateOptions {
  int max_tokens = 256;
  int prefill_step_size = 2048;
  SamplerOptions sampler;
  LogitsProcessorOptions processors;
  std::optional<uint64_t> seed;
  bool ignore_eos = false;  // benchmarks: always generate max_tokens
  // mlx-lm's KV-cache quantization (--kv-bits, --kv-group-size, --quantized-kv-start): after each
  // prefill chunk and each step, caches holding >= quantized_kv_start tokens are quantized.
  std::optional<int> kv_bits;  // unset: off
  int kv_group_size = 64;
  int quantized_kv_start = 5000;
  // Per-layer KV bits (kv_config.json), applied by the same step to the listed layers once their
  // cache holds a token; kv_bits covers the others. Unset: the model directory's kv_config.json
  // when there is one (LanguageModel::generate); empty: off.
  std::optional<std::vector<KVLayerBits>> kv_config;
  // Masks the logits before sampling (after the logits processors); null: off.
  std::shared_ptr<TokenConstraint> constraint;
  // A LoRA adapter loaded with LanguageModel::load_adapter, by name; empty: the base model (with
  // LoadOptions::adapter_path's adapter, which is part of the loaded weights).
  std::string adapter;
  // Speculative decoding (docs/speculative.md): up to num_draft_tokens proposed tokens are
  // verified in one forward; greedy output is unchanged, sampled output keeps this model's
  // distribution (rejection sampling). Proposals come from draft_model (same vocabulary, loaded
  // by the caller) or, with prompt_lookup = N > 0, from the continuation of the latest earlier
  // occurrence of the last n-gram (n = N..1) of prompt + output. Not with processors or a
  // constraint.
  // A DFlash block drafter (load_dflash_drafter) made for this model proposes K tokens in one
  // forward on the model's hidden states; K <= dflash_block_size(d) - 1.
  std::shared_ptr<LanguageModel> draft_model;   // null: none
  std::shared_ptr<const DFlashDrafter> dflash;  // null: none
  int num_draft_tokens = 3;                     // K, mlx-lm's default
  int prompt_lookup = 0;                        // 0: off
  // Called after each prefill chunk with the prompt tokens prefilled so far and their total
  // (progress of long prompts, e.g. lmx generate --verbose); null: off.
  std::function<void(int done, int total)> on_prefill;
  bool speculative() const { return draft_model || dflash || prompt_lookup > 0; }
};

// DFlash drafters (docs/speculative.md): whether `dir` holds one (config.json's dflash_config),
// loading it (named errors for a checkpoint of another layout), and its block size (the drafter
// proposes up to block size - 1 tokens per round).
bool is_dflash_drafter(const std::filesystem::path& dir);
std::shared_ptr<const DFlashDrafter> load_dflash_drafter(const std::filesystem::path& dir);
int dflash_block_size(const DFlashDrafter& drafter);
int dflash_block_size(const std::filesystem::path& dir);  // from config.json, before loading

// Speculative decoding's counts: a round is one verifying forward of the target.
struct SpeculativeStats {
  int rounds = 0;
  int drafted = 0;   // tokens proposed
  int accepted = 0;  // proposed tokens the target kept
  double acceptance_rate() const {
    return drafted > 0 ? static_cast<double>(accepted) / drafted : 0;
  }
  // Tokens per target forward: accepted proposals plus the one the target adds (>= 1).
  double mean_accepted_length() const {
    return rounds > 0 ? static_cast<double>(accepted + rounds) / rounds : 0;
  }
};

struct GenerationStats {
  int prompt_tokens = 0;
  double prompt_seconds = 0;  // until the first token is ready
  int generation_tokens = 0;
  double generation_seconds = 0;  // from the first token to the last
  size_t peak_memory = 0;         // bytes, MLX's peak
  size_t kv_bytes = 0;            // the KV cache at the end, allocated bytes
  double kv_bytes_per_token = 0;  // what one more cached token costs, all layers together
  SpeculativeStats speculative;   // zeros without speculation
  double prompt_tps() const { return prompt_seconds > 0 ? prompt_tokens / prompt_seconds : 0; }
  // mlx-lm's convention: tokens over the time since the first token was ready.
  double generation_tps() const {
    return generation_seconds > 0 ? generation_tokens / generation_seconds : 0;
  }
};

// One generated token and the text it completed (may be empty while a UTF-8 sequence or a
// multi-token character is still open). A last call with token -1 flushes held-back text.
struct TokenOutput {
  int token;
  std::string_view text;
};

// How a model is loaded and which implementation runs it.
struct LoadOptions {
  // Tier L1: stock MLX ops only, logits bit-identical to mlx-lm. Off (the default, tier L3):
  // on the CPU, quantized matmuls run lmx's SIMD kernels (float32 accumulation; docs/cpu.md).
  bool exact = false;
  // Tensor parallelism over the processes of one host (docs/distributed.md). > 1: this process is
  // one rank of a launch_ranks group of that size and loads its shard (attention heads and MLP
  // columns split as mlx-lm's Model.shard). llama, mistral, qwen2, qwen3.
  int tensor_parallel = 1;
  // An mlx-lm adapter directory (adapter_config.json + adapters.safetensors: LoRA, DoRA or a
  // full fine-tune), applied as mlx_lm.utils.load(path, adapter_path=...) does (docs/lora.md).
  std::optional<std::filesystem::path> adapter_path = std::nullopt;
  // On the CPU, MLX's buffer cache keeps each freed buffer for reuse by one of the same size; the
  // KV cache's replaced buffers and a prefill's intermediates rarely see that size again and
  // would stay resident (docs/memory.md). When set and the default device is the CPU, load calls
  // mx::set_cache_limit with it (a process-wide setting); nullopt leaves MLX's limit alone.
  std::optional<size_t> cpu_buffer_cache_limit = 0;
};

// A LoRA adapter loaded by name for GenerateOptions::adapter (LanguageModel::load_adapter).
struct AdapterInfo {
  std::string name;
  std::filesystem::path path;
  int rank = 0;
  float scale = 0;
  int modules = 0;  // the model's linear and embedding modules it changes
};

struct LaunchOptions {
  int ranks = 2;
  double startup_timeout_s = 600;  // every rank must call notify_rank_ready() within it
};

// Runs argv (argv[0]: the executable's path) as `ranks` processes on 127.0.0.1 with MLX
// distributed's environment (ring backend on CPU, NCCL on CUDA, NCCL_NVLS_ENABLE=0 always).
// Rank 0's standard output passes through, the others' is dropped; standard error passes
// through. Returns when every rank exited 0; throws lmx::Error naming the first rank that failed
// or was not ready in time, after stopping the others.
void launch_ranks(const std::vector<std::string>& argv, const LaunchOptions& options);
// In a process started by launch_ranks: its rank; nullopt elsewhere.
std::optional<int> tensor_parallel_rank();
// Tells the launcher this rank finished starting (call after LanguageModel::load).
void notify_rank_ready();

// What a model loaded with these options runs on, e.g. "L3 (lmx CPU kernels: avx512, 2 threads)"
// or "L1 (exact: stock MLX ops)".
std::string tier_description(const LoadOptions& options = {});

class LanguageModel {
 public:
  // Loads config.json, model*.safetensors, tokenizer.json from `dir`, or from a Hugging Face repo
  // id `org/name[@revision]` in the local cache, downloaded when missing unless HF_HUB_OFFLINE=1
  // (docs/hub.md). Throws lmx::Error.
  static LanguageModel load(const std::filesystem::path& dir, const LoadOptions& options = {});
  ~LanguageModel();
  LanguageModel(LanguageModel&&) noexcept;
  LanguageModel& operator=(LanguageModel&&) noexcept;

  const std::string& model_type() const;
  std::optional<int> context_length() const;
  std::vector<int> eos_token_ids() const;
  int vocab_size() const;
  // The model directory's kv_config.json as read at load (empty without one).
  const std::vector<KVLayerBits>& kv_config() const;
  // Reads and checks a kv_config.json against this model's layers. Throws lmx::Error naming the
  // file and the bad entry.
  std::vector<KVLayerBits> read_kv_config(const std::filesystem::path& file) const;
  // The tier this model runs (tier_description).
  std::string tier() const;

  // LoRA adapters chosen per request (docs/lora.md): loads an mlx-lm LoRA adapter directory
  // (fine_tune_type lora) under `name`; a generation takes it with GenerateOptions::adapter, and
  // generations with different adapters batch together (Scheduler). Throws lmx::Error for a name
  // already loaded, a bad adapter, DoRA or full fine-tunes (load those with
  // LoadOptions::adapter_path), adapters on MoE experts, or a tensor-parallel model. Not safe
  // while a generation runs on another thread: with a Scheduler, call it through
  // Scheduler::run.
  void load_adapter(const std::string& name, const std::filesystem::path& dir);
  // Throws lmx::Error for an unknown name or an adapter a running generation uses.
  void unload_adapter(const std::string& name);
  std::vector<AdapterInfo> adapters() const;
  bool has_adapter(const std::string& name) const;  // any thread

  std::vector<int> encode(std::string_view text, bool add_special_tokens = true) const;
  std::string decode(const std::vector<int>& ids) const;

  // Streams tokens until max_tokens, an EOS token, or `on_token` returning false. Throws
  // lmx::Error for a prompt longer than the context or invalid options.
  GenerationStats generate(const std::vector<int>& prompt, const GenerateOptions& options,
                           const std::function<bool(const TokenOutput&)>& on_token);

  // Tensor-parallel loads: rank 0's payload on every rank (a collective: all ranks call it, e.g.
  // with each request rank 0 receives, before all of them generate). Otherwise the payload.
  std::string broadcast_from_rank0(const std::string& payload) const;

  // A constraint for GenerateOptions::constraint: the output is one JSON value valid
  // against `schema` (JSON Schema text; keywords in docs/json-schema.md), then EOS. Throws
  // lmx::Error("[json-schema] ...") naming an unsupported keyword or a bad value.
  std::shared_ptr<TokenConstraint> json_schema_constraint(std::string_view schema) const;
  // Any JSON object (response_format json_object).
  std::shared_ptr<TokenConstraint> json_object_constraint() const;

  // Embeddings (Qwen3-Embedding): `text`'s tokens with the end-of-text token (<|endoftext|>, else
  // the tokenizer's eos token) appended unless the tokenizer already ended with it.
  std::vector<int> embedding_tokens(std::string_view text) const;
  // One L2-normalized float vector per sequence: the final norm's hidden state at the last token.
  // Sequences run one at a time, so batching never changes a result. Throws lmx::Error for an
  // empty sequence, an id outside the vocabulary or a sequence longer than the context.
  std::vector<std::vector<float>> embed(const std::vector<std::vector<int>>& batch);
  // embed() of embedding_tokens(text) for each text.
  std::vector<std::vector<float>> embed_texts(const std::vector<std::string>& texts);

  struct Impl;
  // The loaded state, for the library's own modules (Impl is defined in src/engine).
  Impl& impl() const { return *impl_; }

 private:
  friend class Session;
  explicit LanguageModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Generation that keeps its KV cache between calls, for multi-turn chat: each call reuses the
// longest prefix its prompt shares with the tokens already cached (the earlier turns and the
// answers generated to them) and prefills only the rest.
class Session {
 public:
  explicit Session(LanguageModel& model);
  ~Session();
  Session(Session&&) noexcept;
  Session& operator=(Session&&) noexcept;

  // Like LanguageModel::generate; `prompt` is the whole context (e.g. the rendered conversation).
  GenerationStats generate(const std::vector<int>& prompt, const GenerateOptions& options,
                           const std::function<bool(const TokenOutput&)>& on_token);
  int cached_tokens() const;  // tokens whose keys and values the cache holds now
  int reused_tokens() const;  // prompt tokens the last generate() took from the cache
  void reset();               // drop the cache

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// One token of a scheduled request.
struct StreamToken {
  int token;  // -1: a last call flushing held-back text
  std::string_view text;
  float logprob = 0;                       // with StreamRequest::top_logprobs >= 0
  std::vector<std::pair<int, float>> top;  // the top_logprobs best alternatives, best first
};

struct StreamResult {
  std::string finish_reason;  // "stop" (EOS), "length", "cancelled" or "error"
  std::string error;          // what failed, with "error"
  GenerationStats stats;
  size_t cached_tokens = 0;  // prompt tokens taken from the prompt cache
};

struct StreamRequest {
  std::vector<int> prompt;
  GenerateOptions options;  // per row: sampler and seed, processors, constraint, max_tokens...
  int top_logprobs = -1;    // >= 0: the sampled token's log-probability and this many best
  // Both are called on the scheduler's thread. on_token returning false ends the request
  // ("cancelled"); on_done is called exactly once, last.
  std::function<bool(const StreamToken&)> on_token;
  std::function<void(const StreamResult&)> on_done;
};

// Schedulers of several models in one process (lmx serve with several --model) take turns: one
// runs an iteration (admission, a prefill chunk, a decode step) while the others wait, in the
// order they asked; a model loading takes a turn too. A ticket lock, so no model starves.
class TurnLock {
 public:
  void lock();
  void unlock();

 private:
  struct State;
  std::shared_ptr<State> s_ = make_state();
  static std::shared_ptr<State> make_state();
};

struct SchedulerOptions {
  int max_batch = 0;            // rows decoded together; 0: 16 on the CPU, 64 on a GPU
  int prompt_concurrency = 1;   // joining prompts prefilled per step
  int prefill_step_size = 512;  // prompt tokens a joining row prefills per step
  int max_queue = 0;            // waiting requests past which submit refuses; 0: no limit
  size_t prompt_cache_entries = 10;
  std::optional<size_t> prompt_cache_bytes = std::nullopt;
  std::string cache_key = {};  // names the weights in the prompt cache (model and adapter)
  // Memory admission (docs/memory.md), in bytes: submit() refuses a request whose KV cache at
  // prompt + max_tokens tokens, beside the weights, the KV reserved by the queued and running
  // requests and one prefill chunk's transient memory, would pass it. Unset: no check.
  std::optional<size_t> memory_budget = std::nullopt;
  std::shared_ptr<TurnLock> turns = nullptr;  // shared with other models' schedulers
};

// What a scheduler holds and has done, for metrics; updated once per iteration.
struct SchedulerStats {
  int waiting = 0;                   // queued, not yet admitted
  int active = 0;                    // rows prefilling or decoding
  uint64_t steps = 0;                // decode steps run (each over all ready rows)
  uint64_t prompt_cache_hits = 0;    // requests that reused a cached prefix
  uint64_t prompt_cache_misses = 0;  // requests that found none
  uint64_t cached_tokens = 0;        // prompt tokens those hits reused
  size_t prompt_cache_entries = 0;
  size_t prompt_cache_bytes = 0;
  size_t kv_bytes = 0;  // the running rows' KV caches
};

// submit() past SchedulerOptions::max_queue.
class QueueFullError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// submit() past SchedulerOptions::memory_budget; the message gives needed and available bytes.
class MemoryAdmissionError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Continuous batching (docs/batching.md): requests join and leave between decode steps; a
// joiner's prompt is prefilled in chunks between the running rows' steps; every row keeps its
// own KV cache (any cache type) and sampler, and a step decodes all rows in one forward. A row
// computes exactly what it computes alone in tier L1. One thread owns the model while the
// scheduler lives: run other MLX work on it through run().
class Scheduler {
 public:
  explicit Scheduler(LanguageModel& model, SchedulerOptions options = {});
  ~Scheduler();  // ends every request ("cancelled") and joins the thread
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request and returns its id. Throws lmx::Error for an invalid request (as
  // LanguageModel::generate) and QueueFullError past max_queue.
  uint64_t submit(StreamRequest request);
  // Ends a queued or running request ("cancelled") before its next token; any thread.
  void cancel(uint64_t id);
  // Runs fn on the scheduler's thread between two steps and waits for it; rethrows its error.
  void run(const std::function<void()>& fn);
  int waiting() const;  // queued, not yet admitted
  int active() const;   // rows prefilling or decoding
  int max_batch() const;
  SchedulerStats stats() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace lmx
