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

}  // namespace lmx
