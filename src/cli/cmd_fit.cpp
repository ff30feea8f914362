// lmx fit: whether a model and a context fit in memory, from config.json and the safetensors
// headers only (src/engine/memory.h); nothing is loaded.
#include <algorithm>
#include <cstdio>

#include "cli/commands.h"
#include "cli/flags.h"
#include "core/error.h"
#include "core/json.h"
#include "core/progress.h"
#include "engine/memory.h"

namespace lmx::cli {
namespace {

struct Fit {
  size_t weights, kv, transient;
  size_t total() const { return weights + kv + transient; }
};

Fit fit_at(const ModelMemory& m, long long ctx, int chunk, const KVQuant& q) {
  return {m.weight_bytes, kv_bytes(m, ctx, q),
          transient_bytes(m, std::min<long long>(chunk, ctx), ctx)};
}

// The largest context whose total fits `budget` (total grows with the context), capped at `cap`;
// 0 when not even one token fits.
long long largest_context(const ModelMemory& m, int chunk, const KVQuant& q, size_t budget,
                          long long cap) {
  if (fit_at(m, 1, chunk, q).total() > budget) return 0;
  long long lo = 1, hi = cap;
  if (fit_at(m, hi, chunk, q).total() <= budget) return hi;
  while (hi - lo > 1) {
    const long long mid = lo + (hi - lo) / 2;
    (fit_at(m, mid, chunk, q).total() <= budget ? lo : hi) = mid;
  }
  return lo;
}

double gb(size_t b) { return static_cast<double>(b) / 1e9; }

}  // namespace

int cmd_fit(const Args& args) {
  Flags f("fit",
          "Whether a model fits in memory with a context: weights (from the safetensors headers),\n"
          "KV cache per token for the model's cache layout, a transient estimate for one prefill\n"
          "chunk, and the largest context that fits the budget. Nothing is loaded. Exit status\n"
          "0: fits, 3: does not fit. See docs/memory.md.",
          {
              {"model", "model directory (MLX format) or Hugging Face repo id org/name[@rev]",
               false, "DIR|REPO"},
              {"ctx", "context length to check (prompt + generated tokens)", false, "N",
               "the model's max_position_embeddings, else 4096"},
              {"budget", "memory budget in GB (1e9 bytes)", false, "GB",
               "available memory (MemAvailable)"},
              {"kv-bits", "quantized KV cache bits (2-6, 8)", false, "B", "off"},
              {"kv-group-size", "group size of the KV quantization", false, "N", "64"},
              {"prefill-step-size", "prompt tokens per prefill chunk (transient memory)", false,
               "N", "2048"},
              {"json", "print the numbers as JSON", true},
              offline_flag(),
          });
  if (!f.parse(args)) {
    std::fputs(f.usage().c_str(), stdout);
    return 0;
  }
  const std::string dir = resolve_model_flag(f);
  const ModelMemory m = model_memory(dir);
  KVQuant q;
  if (auto bits = f.opt_integer("kv-bits")) {
    check(*bits >= 2 && (*bits <= 6 || *bits == 8), "lmx fit", "--kv-bits must be 2-6 or 8, got ",
          *bits);
    q.bits = *bits;
    q.group_size = f.integer("kv-group-size", 64);
    check(q.group_size == 32 || q.group_size == 64 || q.group_size == 128, "lmx fit",
          "--kv-group-size must be 32, 64 or 128, got ", q.group_size);
  }
  const int chunk = f.integer("prefill-step-size", 2048);
  check(chunk > 0, "lmx fit", "--prefill-step-size must be > 0, got ", chunk);
  const long long ctx = f.integer("ctx", m.max_context.value_or(4096));
  check(ctx > 0, "lmx fit", "--ctx must be > 0, got ", ctx);
  size_t budget = 0;
  std::string budget_source;
  if (auto b = f.opt_number("budget")) {
    check(*b > 0, "lmx fit", "--budget must be > 0 GB, got ", *b);
    budget = static_cast<size_t>(static_cast<double>(*b) * 1e9);
    budget_source = "--budget";
  } else {
    budget = available_memory_bytes();
    check(budget > 0, "lmx fit", "cannot read MemAvailable from /proc/meminfo: pass --budget GB");
    budget_source = "available memory";
  }
  const Fit at = fit_at(m, ctx, chunk, q);
  const long long cap = std::max<long long>(ctx, m.max_context.value_or(ctx));
  const long long largest = largest_context(m, chunk, q, budget, cap);
  const bool fits = at.total() <= budget;
  const double per_token = kv_bytes_per_token(m, 0, q);
  int windowed = 0;
  for (const auto& l : m.kv) windowed += l.window > 0;

  if (f.on("json")) {
    json layers = json::array();
    for (const auto& l : m.kv)
      layers.push_back({{"layer", l.layer},
                        {"kv_heads", l.kv_heads},
                        {"k_dim", l.k_dim},
                        {"v_dim", l.v_dim},
                        {"window", l.window}});
    json out = {{"model", dir},
                {"model_type", m.model_type},
                {"num_layers", m.num_layers},
                {"weights_bytes", m.weight_bytes},
                {"kv_dtype", m.kv_dtype},
                {"kv_bits", q.bits},
                {"kv_group_size", q.group_size},
                {"kv_layers", layers},
                {"kv_bytes_per_token", per_token},
                {"ctx", ctx},
                {"kv_bytes", at.kv},
                {"transient_bytes", at.transient},
                {"prefill_step_size", chunk},
                {"total_bytes", at.total()},
                {"budget_bytes", budget},
                {"budget_source", budget_source},
                {"max_context", m.max_context ? json(*m.max_context) : json(nullptr)},
                {"largest_context", largest},
                {"fits", fits}};
    std::printf("%s\n", out.dump(2).c_str());
    return fits ? 0 : 3;
  }
  std::printf("model:      %s (%s, %d layers, %zu with a KV cache, %d of them windowed)\n",
              dir.c_str(), m.model_type.c_str(), m.num_layers, m.kv.size(), windowed);
  std::printf("weights:    %s (safetensors headers)\n", format_bytes(m.weight_bytes).c_str());
  if (q.bits)
    std::printf("kv cache:   %d-bit (group %d, scales in %s), %.1f bytes per token\n", q.bits,
                q.group_size, m.kv_dtype.c_str(), per_token);
  else
    std::printf("kv cache:   %s, %.1f bytes per token\n", m.kv_dtype.c_str(), per_token);
  if (m.kv_dtype == "float32" && !q.bits)
    std::printf(
        "            (mlx-lm's and tier L1's layout; tier L3 on the CPU keeps K/V of float32\n"
        "            activations as float16 in its fused decoder layers: down to half)\n");
  std::printf("context:    %lld tokens -> kv %s\n", ctx, format_bytes(at.kv).c_str());
  std::printf("transient:  %s (a %lld-token prefill chunk over the context: scores, MLP, logits)\n",
              format_bytes(at.transient).c_str(), std::min<long long>(chunk, ctx));
  std::printf("total:      %s of %s (%s)\n", format_bytes(at.total()).c_str(),
              format_bytes(budget).c_str(), budget_source.c_str());
  std::printf(
      "largest context that fits: %lld tokens%s\n", largest,
      m.max_context ? (" (model maximum " + std::to_string(*m.max_context) + ")").c_str() : "");
  if (fits)
    std::printf("verdict:    fits (%.3f GB needed, %.3f GB budget)\n", gb(at.total()), gb(budget));
  else
    std::printf("verdict:    does not fit: needs %.3f GB, budget %.3f GB; largest context %lld\n",
                gb(at.total()), gb(budget), largest);
  return fits ? 0 : 3;
}

}  // namespace lmx::cli
