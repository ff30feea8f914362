// One rank of a tensor-parallel replay, for tests/models/test_tensor_parallel.cpp:
//   lmx_tp_replay ROW_DIR OUT_FILE [--fail-rank R] [--stall-rank R] [--ranks N] [--broadcast S]
// Run by lmx::launch_ranks (or, given --ranks N outside a launch, launching N copies of itself):
// joins the group, loads ROW_DIR's model sharded, replays the "tp" calls of its reference.json
// (mlx-lm's sharded run) with the recorded tokens, evaluating the cache after prefill chunks as
// generate_step does; rank 0 writes call_NNN.logits to OUT_FILE.
// --fail-rank R: rank R exits 3 before joining; --stall-rank R: rank R never reports ready;
// --broadcast S: afterwards rank 0 broadcasts S, and every rank r writes what it got to
// OUT_FILE.rank<r>.txt.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>

#include "core/json.h"
#include "engine/tensor_parallel.h"
#include "io/safetensors.h"
#include "lmx/lmx.h"
#include "models/model.h"

int main(int argc, char** argv) {
  using namespace lmx;
  if (argc < 3 || argc % 2 == 0) {
    std::fprintf(stderr,
                 "usage: lmx_tp_replay ROW_DIR OUT_FILE [--fail-rank R] [--stall-rank R] "
                 "[--ranks N] [--broadcast S]\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1], out = argv[2];
  std::map<std::string, std::string> flags;
  for (int i = 3; i + 1 < argc; i += 2) flags[argv[i]] = argv[i + 1];
  auto number = [&](const char* flag) {
    return flags.count(flag) ? std::atoi(flags[flag].c_str()) : -1;
  };
  const int fail_rank = number("--fail-rank"), stall_rank = number("--stall-rank");
  const int ranks = number("--ranks");
  try {
    if (ranks > 0 && !tensor_parallel_rank()) {
      launch_ranks({"/proc/self/exe", argv[1], argv[2]}, {ranks, 600});
      return 0;
    }
    const int rank = tensor_parallel_rank().value_or(-1);
    const int size = std::atoi(std::getenv("LMX_TP_SIZE") ? std::getenv("LMX_TP_SIZE") : "0");
    if (rank == fail_rank) return 3;
    ShardSpec spec = join_tensor_parallel_group(size);
    LoadedWeights loaded = load_model(dir, {.exact = true}, spec);
    if (rank == stall_rank) pause();
    notify_rank_ready();
    const json ref = read_json_file(dir / "reference.json");
    const Weights arrays = load_safetensors(dir / "reference.safetensors");
    Cache cache = loaded.model->make_cache();
    Weights logits;
    for (const auto& call : ref.at("tp").at("calls")) {
      const std::string key = call.at("key").get<std::string>();
      mx::array y = (*loaded.model)(arrays.at("tp." + key + ".tokens"), cache);
      std::vector<mx::array> outputs{y};
      if (call.at("eval_cache").get<bool>())
        for (auto& c : cache)
          for (auto& a : c->state()) outputs.push_back(a);
      mx::eval(outputs);
      logits.insert_or_assign(key + ".logits", y);
    }
    if (rank == 0) save_safetensors(out, logits);
    if (flags.count("--broadcast")) {
      const std::string mine = rank == 0 ? flags["--broadcast"] : "rank " + std::to_string(rank);
      std::ofstream(out.string() + ".rank" + std::to_string(rank) + ".txt", std::ios::binary)
          << broadcast_from_rank0(mine, *spec.group);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lmx_tp_replay: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
