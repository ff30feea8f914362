// Tensor parallelism on CPU: 2 ranks on MLX's ring backend (launch_ranks), against the references
// of scripts/gen_tp_fixtures.py (mlx-lm's own Model.shard under 2 ring processes). lmx's sharded
// logits must be bit-identical to mlx-lm's sharded run, within tolerance of the single-process
// run, and bad configurations or failing ranks must end the launch with an error naming them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/json.h"
#include "io/safetensors.h"
#include "lmx/lmx.h"
#include "test_util.h"

namespace lmx {
namespace {

namespace fs = std::filesystem;

// Relative to the largest single-process logit: a 2-way split changes the order of the sums in
// o_proj / down_proj (bf16 partial products added by the all-sum), nothing else.
constexpr float kTolerance = 0.1f;

struct Row {
  std::string name;
  std::string error;  // non-empty: lmx must refuse the split with a message containing it
};

std::vector<Row> rows() {
  json index = read_json_file(test::data_path("tp/index.json"));
  std::vector<Row> out;
  for (const auto& r : index.at("rows"))
    out.push_back({r.at("name").get<std::string>(),
                   r.at("error").is_null() ? "" : r.at("error").get<std::string>()});
  check(!out.empty(), test::data_path("tp/index.json").string(), "no rows, expected at least 1");
  return out;
}

fs::path scratch_dir() {
  return fs::temp_directory_path() / ("lmx_tp_test_" + std::to_string(::getpid()));
}

fs::path scratch(const std::string& name) {
  fs::create_directories(scratch_dir());
  return scratch_dir() / name;
}

struct RemoveScratch : ::testing::Environment {
  void TearDown() override { fs::remove_all(scratch_dir()); }
};
const ::testing::Environment* const kRemoveScratch =
    ::testing::AddGlobalTestEnvironment(new RemoveScratch);

// lmx's 2-rank replay of a row (launched once per row and kept), as call key -> logits.
const Weights& lmx_logits(const std::string& row) {
  static std::map<std::string, Weights> runs;
  if (auto it = runs.find(row); it != runs.end()) return it->second;
  const fs::path out = scratch(row + ".safetensors");
  launch_ranks({LMX_TP_REPLAY, test::data_path("tp/" + row).string(), out.string()}, {2, 120});
  return runs[row] = load_safetensors(out);
}

float max_abs_diff(const mx::array& a, const mx::array& b) {
  return mx::max(mx::abs(mx::subtract(mx::astype(a, mx::float32), mx::astype(b, mx::float32))))
      .item<float>();
}

// A row with a reference run: its recorded arrays, the calls of run `run`, lmx's 2-rank logits.
struct RunRow {
  std::string name;
  Weights ref;
  json calls;
  const Weights* got;
};

std::vector<RunRow> run_rows(const std::string& run) {
  std::vector<RunRow> out;
  for (const Row& r : rows()) {
    if (!r.error.empty()) continue;
    const fs::path dir = test::data_path("tp/" + r.name);
    out.push_back({r.name, load_safetensors(dir / "reference.safetensors"),
                   read_json_file(dir / "reference.json").at(run).at("calls"),
                   &lmx_logits(r.name)});
  }
  return out;
}

TEST(TensorParallel, LogitsBitIdenticalToMlxLmSharded) {
  int compared = 0;
  for (const auto& [name, ref, calls, got_ptr] : run_rows("tp")) {
    const Weights& got = *got_ptr;
    ASSERT_EQ(got.size(), calls.size()) << name;
    for (const auto& c : calls) {
      const std::string key = c.at("key").get<std::string>();
      const mx::array& want = ref.at("tp." + key + ".logits");
      const mx::array& have = got.at(key + ".logits");
      ASSERT_EQ(have.shape(), want.shape()) << name << " " << key;
      ASSERT_EQ(have.dtype(), want.dtype()) << name << " " << key;
      EXPECT_EQ(max_abs_diff(have, want), 0.0f)
          << name << " " << key << " (" << c.at("kind").get<std::string>() << ", offset "
          << c.at("offset").get<int>() << ") differs from mlx-lm's sharded run";
      ++compared;
    }
  }
  EXPECT_GT(compared, 0) << "no tensor-parallel rows to compare";
}

TEST(TensorParallel, WithinToleranceOfSingleProcess) {
  for (const auto& [name, ref, calls, got_ptr] : run_rows("single")) {
    const Weights& got = *got_ptr;
    int same_input = 0;
    for (const auto& c : calls) {
      const std::string key = c.at("key").get<std::string>();
      // Decode steps after the two runs' greedy tokens diverge see different inputs.
      const bool same =
          mx::array_equal(ref.at("single." + key + ".tokens"), ref.at("tp." + key + ".tokens"))
              .item<bool>();
      if (!same) continue;
      const mx::array& single = ref.at("single." + key + ".logits");
      const float scale = mx::max(mx::abs(mx::astype(single, mx::float32))).item<float>();
      EXPECT_LE(max_abs_diff(got.at(key + ".logits"), single), kTolerance * scale)
          << name << " " << key;
      ++same_input;
    }
    EXPECT_GT(same_input, 0) << name;
  }
}

TEST(TensorParallel, BadConfigurationsNameTheProblem) {
  int checked = 0;
  for (const Row& r : rows()) {
    if (r.error.empty()) continue;
    const fs::path dir = test::data_path("tp/" + r.name);
    test::RunResult res = test::run_lmx(
        "generate --tp 2 --tp-timeout 60 --max-tokens 1 --prompt hi --model " + dir.string());
    EXPECT_EQ(res.exit_code, 1) << r.name;
    EXPECT_NE(res.err.find(r.error), std::string::npos) << r.name << ": " << res.err;
    EXPECT_NE(res.err.find("during start-up"), std::string::npos) << r.name << ": " << res.err;
    ++checked;
  }
  EXPECT_GT(checked, 0);
  test::RunResult zero = test::run_lmx("generate --tp 0 --prompt hi --model .");
  EXPECT_EQ(zero.exit_code, 1);
  EXPECT_NE(zero.err.find("--tp must be >= 1, got 0"), std::string::npos) << zero.err;
}

// What lmx serve --tp needs: rank 0's request bytes (not a multiple of 4, not ASCII) on every rank.
TEST(TensorParallel, BroadcastFromRank0ReachesEveryRank) {
  const std::string payload = "{\"prompt\": \"h\xc3\xa9llo\", \"max_tokens\": 7}\n\x01";
  const fs::path out = scratch("broadcast.safetensors");
  launch_ranks({LMX_TP_REPLAY, test::data_path("tp/llama_q4_g32").string(), out.string(),
                "--broadcast", payload},
               {2, 120});
  for (int r = 0; r < 2; ++r) {
    std::ifstream f(out.string() + ".rank" + std::to_string(r) + ".txt", std::ios::binary);
    const std::string got((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_EQ(got, payload) << "rank " << r;
  }
}

std::string launch_error(const std::vector<std::string>& extra, double timeout_s) {
  std::vector<std::string> argv{LMX_TP_REPLAY, test::data_path("tp/llama_q4_g32").string(),
                                scratch("failing.safetensors").string()};
  argv.insert(argv.end(), extra.begin(), extra.end());
  try {
    launch_ranks(argv, {2, timeout_s});
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Rank 1 exits before joining the ring: rank 0, blocked waiting for its peer, is stopped.
TEST(TensorParallel, RankFailingAtStartupFailsTheLaunch) {
  const std::string err = launch_error({"--fail-rank", "1"}, 120);
  EXPECT_NE(err.find("rank 1 of 2 exited with status 3 during start-up"), std::string::npos) << err;
}

TEST(TensorParallel, RankStallingAtStartupHitsTheTimeout) {
  const std::string err = launch_error({"--stall-rank", "1"}, 5);
  EXPECT_NE(err.find("rank(s) 1 not ready after 5"), std::string::npos) << err;
}

}  // namespace
}  // namespace lmx
