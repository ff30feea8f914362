#include "engine/embed.h"

#include <mlx/linalg.h>

#include "core/error.h"
#include "lmx/lmx.h"
#include "tokenizer/tokenizer.h"

namespace lmx {

mx::array embed_sequence(Model& model, const std::vector<int>& ids) {
  check(!ids.empty(), "embed", "a sequence is empty, expected at least one token");
  const int L = static_cast<int>(ids.size());
  Cache cache = model.make_cache();
  mx::array tokens(ids.data(), {1, L}, mx::int32);
  mx::array h = model.hidden(tokens, cache);  // (1, L, hidden)
  const int H = h.shape(2);
  h = mx::astype(mx::reshape(mx::slice(h, {0, L - 1, 0}, {1, L, H}), {H}), mx::float32);
  return mx::divide(h, mx::linalg::norm(h));
}

std::vector<int> embedding_tokens(const Tokenizer& tok, std::string_view text) {
  std::optional<int> eot = tok.token_to_id("<|endoftext|>");
  if (!eot && !tok.eos_token_ids().empty()) eot = tok.eos_token_ids().front();
  check(eot.has_value(), "embed", "the tokenizer has no <|endoftext|> or eos token to append");
  std::vector<int> ids = tok.encode(text);
  if (ids.empty() || ids.back() != *eot) ids.push_back(*eot);
  return ids;
}

}  // namespace lmx
