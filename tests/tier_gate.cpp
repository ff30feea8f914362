#include "tier_gate.h"

#include <random>

#include "generate/generate.h"

namespace lmx::test {

TeacherForced compare_teacher_forced(Model& exact, Model& fast, const std::vector<int>& tokens) {
  const mx::array ids(tokens.data(), {1, static_cast<int>(tokens.size())}, mx::int32);
  auto logprobs = [&](Model& m) {
    Cache cache = m.make_cache();
    mx::array logits = mx::astype(m(ids, cache), mx::float32);
    return mx::subtract(logits, mx::logsumexp(logits, -1, true));
  };
  mx::array lp = logprobs(exact), lq = logprobs(fast);
  mx::array kl = mx::sum(mx::multiply(mx::exp(lp), mx::subtract(lp, lq)), -1);
  mx::array agree = mx::equal(mx::argmax(lp, -1), mx::argmax(lq, -1));
  TeacherForced r;
  r.positions = static_cast<int>(tokens.size());
  r.mean_kl = mx::mean(kl).item<float>();
  r.top1_agree = mx::mean(mx::astype(agree, mx::float32)).item<float>();
  r.max_abs_diff = mx::max(mx::abs(mx::subtract(lp, lq))).item<float>();
  return r;
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
