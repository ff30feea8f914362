// Speculative decoding for one stream (docs/speculative.md): a proposer (a draft model of the
// same vocabulary, or prompt lookup) offers up to K tokens, the target verifies all of them and
// the token after them in one forward of K + 1 positions, and both caches are trimmed back to
// what was accepted. Greedy: the longest prefix agreeing with the target's argmax (mlx-lm's
// speculative_generate_step). Temperature > 0: rejection sampling (Leviathan et al. 2023), so
// every emitted token is distributed as the target's sampler would draw it.
#pragma once

#include <deque>

#include "generate/generate.h"

namespace lmx {

class DFlashDrafter;

// Where proposals come from: a draft model, a DFlash block drafter on the target's hidden
// states, or prompt lookup when both are null.
struct Drafter {
  Model* model = nullptr;  // same vocabulary as the target; its cache is the generator's own
  int prompt_lookup = 0;   // without a model: the longest n-gram matched (> 0)
  const DFlashDrafter* dflash = nullptr;  // made for this target (generate/dflash.h)
  // Back off when proposals stop being accepted: after kDryRounds rounds in a row that kept no
  // proposal, decode plainly for a pause that starts at kFirstPause tokens and doubles with each
  // further back-off, run as pipelined plain steps; after a pause one dry round of a draft model
  // or DFlash drafter (the probe) backs off again; a round that keeps a proposal resets it; past kMaxPause the stream decodes plainly
  // to its end. A draft model or DFlash drafter that has kept under 1/kUselessRatio of its
  // proposals by its second back-off is dropped for the stream: each probe costs its drafting and
  // its catch-up on the paused tokens. Off: every round drafts (mlx-lm's
  // speculative_generate_step, whose acceptance counts the tests compare).
  bool backoff = true;
  static constexpr int kDryRounds = 2, kFirstPause = 16, kMaxPause = 256, kUselessRatio = 10;
};

// Up to `k` tokens that followed the latest earlier occurrence of the last n-gram of `tokens`,
// trying n = max_ngram down to 1; empty when no such n-gram occurs earlier.
std::vector<int> prompt_lookup(const std::vector<int>& tokens, int max_ngram, int k);

// Rejection sampling over N drafted positions: p, q (N, V) the target's and the proposer's
// sampling distributions, draft (N,) the proposed tokens.
// min(1, p(d) / q(d)) per position, (N,): the chance each proposal is kept.
mx::array acceptance_probability(const mx::array& p, const mx::array& q, const mx::array& draft);
// norm(max(0, p - q)) per row, (N, V): what a rejected position draws from. A row where p <= q
// everywhere (p == q up to rounding, where rejection has probability ~0) falls back to p.
mx::array residual_distribution(const mx::array& p, const mx::array& q);

// One verification at temperature > 0, on the device: p (N + 1, V) (the last row is the bonus
// position after every proposal), q (N, V), draft (N,). accept (N,) bool: u < min(1, p/q) with
// fresh uniforms; resampled (N,): a draw from each residual; bonus (): a draw from p's last row.
struct SampledVerdict {
  mx::array accept, resampled, bonus;
};
SampledVerdict verify_sampled(const mx::array& p, const mx::array& q, const mx::array& draft);

// Checks the speculative options (K >= 1, one proposer, no processors or constraint) and that
// every cache layer can be rolled back. Throws lmx::Error.
void validate_speculative(const GenerateOptions& options, const Cache& cache, const char* which);

class SpeculativeGenerator {
 public:
  // `cache` may already hold `context`, the tokens before `prompt` (a chat's earlier turns); the
  // draft model, if any, prefills context + prompt into a cache of its own.
  SpeculativeGenerator(Model& model, Cache& cache, const std::vector<int>& context,
                       std::vector<int> prompt, GenerateOptions options, Drafter drafter);
  ~SpeculativeGenerator();
  SpeculativeGenerator(const SpeculativeGenerator&) = delete;
  SpeculativeGenerator& operator=(const SpeculativeGenerator&) = delete;
  // Next token, or nullopt after max_tokens. A round runs when the tokens of the last are used.
  std::optional<Step> next();
  // Tokens of the last round not yet taken by next() (the scheduler takes a round at a time).
  bool has_ready() const { return !ready_.empty(); }
  const GenerationStats& stats() const { return stats_; }

 private:
  void round();
  // Backed off: a few plain steps, each fed the previous one's lazy token, read at once.
  void plain_steps();
  mx::array log_probs(const Model& m, const mx::array& logits) const;
  void rollback_draft(int fed, int trim, const std::vector<int>& accepted);
  // DFlash: the target forward with the tap set; the fused tapped states (1, L, taps * hidden)
  // go to *states.
  mx::array tapped_forward(const mx::array& tokens, mx::array* states);

  Model& model_;
  Cache& cache_;
  GenerateOptions opt_, draft_opt_;
  Drafter drafter_;
  Cache draft_cache_;
  std::vector<int> history_;               // context + prompt + emitted tokens (prompt lookup)
  int y_ = 0;                              // the target's next input: the last token, not yet fed
  std::vector<int> draft_pending_;         // tokens the draft has not yet been fed
  HiddenTap tap_;                          // DFlash: the target layers the drafter reads
  std::vector<mx::array> dflash_context_;  // DFlash: committed states not yet in its cache
  std::deque<Step> ready_;
  int dry_ = 0;                            // back-off: rounds in a row that kept no proposal
  int pause_ = 0;                          // back-off: plain rounds left
  int next_pause_ = Drafter::kFirstPause;  // back-off: the next pause's length
  int backoffs_ = 0;                       // back-off: pauses begun
  int n_ = 0;
  bool started_ = false;
  GenerationStats stats_;
  std::chrono::steady_clock::time_point start_, first_token_;
};

// generate() with speculation: streams tokens to `on_token` until max_tokens, an EOS id, or
// on_token returning false.
GenerationStats speculative_generate(Model& model, Cache& cache, const std::vector<int>& context,
                                     const std::vector<int>& prompt, const GenerateOptions& options,
                                     Drafter drafter, const std::vector<int>& eos_ids,
                                     const std::function<bool(const Step&)>& on_token);

}  // namespace lmx
