#include "tier_gate.h"

#include <algorithm>
#include <random>

#include "generate/generate.h"

namespace lmx::test {

namespace {

TeacherForced compare(const mx::array& lp, const mx::array& lq, int positions) {
  mx::array kl = mx::sum(mx::multiply(mx::exp(lp), mx::subtract(lp, lq)), -1);
  mx::array agree = mx::equal(mx::argmax(lp, -1), mx::argmax(lq, -1));
  TeacherForced r;
  r.positions = positions;
  r.mean_kl = mx::mean(kl).item<float>();
  r.top1_agree = mx::mean(mx::astype(agree, mx::float32)).item<float>();
  r.max_abs_diff = mx::max(mx::abs(mx::subtract(lp, lq))).item<float>();
  return r;
}

mx::array log_softmax(const mx::array& logits) {
  mx::array l = mx::astype(logits, mx::float32);
  return mx::subtract(l, mx::logsumexp(l, -1, true));
}

}  // namespace

mx::array teacher_forced_logprobs(Model& model, const std::vector<int>& tokens) {
  const mx::array ids(tokens.data(), {1, static_cast<int>(tokens.size())}, mx::int32);
  Cache cache = model.make_cache();
  mx::array lp = log_softmax(model(ids, cache));
  mx::eval(lp);
  return lp;
}

mx::array stepped_logprobs(Model& model, const std::vector<int>& tokens, int max_step) {
  const int L = static_cast<int>(tokens.size());
  Cache cache = model.make_cache();
  std::vector<mx::array> parts;
  for (int at = 0, step = 1; at < L; at += step, step = step % max_step + 1) {
    const int n = std::min(step, L - at);
    const mx::array chunk(tokens.data() + at, {1, n}, mx::int32);
    parts.push_back(log_softmax(model(chunk, cache)));
    mx::eval(parts.back());
  }
  return mx::concatenate(parts, 1);
}

TeacherForced compare_logprobs(const mx::array& exact, const mx::array& fast) {
  return compare(exact, fast, exact.shape(1));
}

TeacherForced compare_teacher_forced(Model& exact, Model& fast, const std::vector<int>& tokens) {
  return compare(teacher_forced_logprobs(exact, tokens), teacher_forced_logprobs(fast, tokens),
                 static_cast<int>(tokens.size()));
}

TeacherForced compare_teacher_forced_steps(Model& exact, Model& fast,
                                           const std::vector<int>& tokens, int max_step) {
  return compare(teacher_forced_logprobs(exact, tokens), stepped_logprobs(fast, tokens, max_step),
                 static_cast<int>(tokens.size()));
}

std::vector<int> greedy(Model& model, const std::vector<int>& prompt, int max_tokens) {
  GenerateOptions opt;
  opt.max_tokens = max_tokens;
  Cache cache = model.make_cache();
  TokenGenerator gen(model, cache, prompt, opt);
  std::vector<int> out;
  while (auto s = gen.next()) out.push_back(s->token);
  return out;
}

std::vector<int> random_tokens(int n, int vocab, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(0, vocab - 1);
  std::vector<int> out(n);
  for (int& t : out) t = dist(rng);
  return out;
}

}  // namespace lmx::test
