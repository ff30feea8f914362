// The gates a fast tier (L3) must pass against the exact tier (L1) on the same weights
// (docs/cpu.md): next-token distributions over a teacher-forced text, and greedy outputs.
#pragma once

#include <string>
#include <vector>

#include "kernels/cpu/qmm.h"
#include "models/model.h"

namespace lmx::test {

struct TeacherForced {
  double mean_kl = 0;     // mean over positions of KL(p_exact || p_fast), nats
  double top1_agree = 0;  // fraction of positions with the same argmax
  int positions = 0;
  double max_abs_diff = 0;  // of the log-probabilities: 0 means both ran the same ops
};

// One forward of `tokens` (1, L) through each model from an empty cache.
TeacherForced compare_teacher_forced(Model& exact, Model& fast, const std::vector<int>& tokens);

// The same gate with `fast` fed the tokens in steps of 1, 2, ..., max_step, 1, 2, ... tokens
// through one cache (decode-sized calls: the kernels' small-M paths), `exact` in one forward.
TeacherForced compare_teacher_forced_steps(Model& exact, Model& fast,
                                           const std::vector<int>& tokens, int max_step);

// The pieces of the two gates above, for a caller that compares one exact forward with several
// fast ones: log-probabilities (1, L, V) float32 of one forward of `tokens` from an empty cache,
// of the same tokens fed in steps of 1, 2, ..., max_step through one cache, and the comparison.
mx::array teacher_forced_logprobs(Model& model, const std::vector<int>& tokens);
mx::array stepped_logprobs(Model& model, const std::vector<int>& tokens, int max_step);
TeacherForced compare_logprobs(const mx::array& exact, const mx::array& fast);

// Within its scope the CPU kernels keep MLX's weight layout (kernels::cpu::set_packing) and
// calls of more than kInt8MaxRows rows take the float32 kernel, as on CPUs without the packed
// int8 kernel (on AVX2, whose int8 tiles take every row count by default, the int8 path is off).
class MlxLayoutScope {
 public:
  MlxLayoutScope()
      : was_(kernels::cpu::packing()),
        int8_off_(kernels::cpu::int8_kernel_name(kernels::cpu::active_isa()) == "avx2") {
    kernels::cpu::set_packing(false);
    if (int8_off_) kernels::cpu::set_int8_mode(kernels::cpu::Int8Mode::off);
  }
  ~MlxLayoutScope() {
    kernels::cpu::set_packing(was_);
    if (int8_off_) kernels::cpu::set_int8_mode(std::nullopt);
  }
  MlxLayoutScope(const MlxLayoutScope&) = delete;
  MlxLayoutScope& operator=(const MlxLayoutScope&) = delete;

 private:
  bool was_, int8_off_;
};

// Greedy continuation of `prompt` (prefill, then one token per step), ignoring EOS.
std::vector<int> greedy(Model& model, const std::vector<int>& prompt, int max_tokens);

// Deterministic pseudo-random ids in [0, vocab).
std::vector<int> random_tokens(int n, int vocab, unsigned seed);

}  // namespace lmx::test
