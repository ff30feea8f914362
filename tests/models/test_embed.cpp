// Qwen3-Embedding embeddings against mlx-lm's qwen3 model body on tiny random checkpoints
// (scripts/gen_embed_fixtures.py writes $LMX_TEST_DATA/embed): bit-identical vectors, batched
// and one by one, through the library and through `lmx embed`.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "core/error.h"
#include "core/json.h"
#include "io/safetensors.h"
#include "lmx/lmx.h"
#include "test_util.h"

namespace lmx {
namespace {

namespace fs = std::filesystem;

struct EmbedRow {
  fs::path dir;
  std::vector<std::string> texts;
  std::vector<std::vector<int>> ids;
  std::vector<std::vector<float>> expected;
};

std::vector<EmbedRow> load_rows() {
  std::vector<EmbedRow> rows;
  const fs::path root = test::data_path("embed");
  json index = read_json_file(root / "index.json");
  for (const auto& name : index.at("rows")) {
    EmbedRow r;
    r.dir = root / name.get<std::string>();
    json meta = read_json_file(r.dir / "reference.json");
    r.texts = meta.at("texts").get<std::vector<std::string>>();
    r.ids = meta.at("ids").get<std::vector<std::vector<int>>>();
    Weights arrays = load_safetensors(r.dir / "reference.safetensors");
    for (size_t i = 0; i < r.texts.size(); ++i) {
      mx::array e = arrays.at("embedding_" + std::to_string(i));
      mx::eval(e);
      r.expected.emplace_back(e.data<float>(), e.data<float>() + e.size());
    }
    rows.push_back(std::move(r));
  }
  check(!rows.empty(), (root / "index.json").string(), "no rows, expected at least 1");
  return rows;
}

// Bit-identical: the same float32 bit patterns, element by element.
void expect_identical(const std::vector<float>& got, const std::vector<float>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t differ = 0;
  for (size_t j = 0; j < got.size(); ++j) differ += std::memcmp(&got[j], &want[j], 4) != 0;
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << got.size() << " values differ";
}

TEST(Embed, BitIdenticalToMlxBatchedAndAlone) {
  const std::vector<EmbedRow> rows = load_rows();
  ASSERT_EQ(rows.size(), 4u);
  for (const EmbedRow& r : rows) {
    LanguageModel model = LanguageModel::load(r.dir, {.exact = true});
    for (size_t i = 0; i < r.texts.size(); ++i)
      EXPECT_EQ(model.embedding_tokens(r.texts[i]), r.ids[i]) << r.dir << " text " << i;
    const auto batched = model.embed_texts(r.texts);
    ASSERT_EQ(batched.size(), r.texts.size());
    for (size_t i = 0; i < r.texts.size(); ++i) {
      const std::string what = r.dir.filename().string() + " text " + std::to_string(i);
      expect_identical(batched[i], r.expected[i], what + " (batched)");
      expect_identical(model.embed({r.ids[i]})[0], r.expected[i], what + " (alone)");
    }
  }
}

std::vector<std::vector<float>> parse_cli_output(const std::string& out) {
  json j = json::parse(out);
  std::vector<std::vector<float>> vecs;
  for (const auto& d : j.at("data")) {
    std::vector<float> v;
    for (const auto& x : d.at("embedding")) v.push_back(x.get<float>());
    vecs.push_back(v);
  }
  return vecs;
}

TEST(Embed, CliPrintsTheSameVectors) {
  const EmbedRow r = load_rows().at(0);
  const fs::path file = fs::temp_directory_path() / "lmx_embed_texts.txt";
  std::ofstream(file) << r.texts[2] << "\n\n" << r.texts[0] << "\n";
  test::RunResult res = test::run_lmx("embed --exact --model " + r.dir.string() + " --text '" +
                                      r.texts[1] + "' --file " + file.string());
  fs::remove(file);
  ASSERT_EQ(res.exit_code, 0) << res.err;
  const auto vecs = parse_cli_output(res.out);
  ASSERT_EQ(vecs.size(), 3u);
  expect_identical(vecs[0], r.expected[1], "--text");
  expect_identical(vecs[1], r.expected[2], "--file line 1");
  expect_identical(vecs[2], r.expected[0], "--file line 3");
  json j = json::parse(res.out);
  EXPECT_EQ(j["usage"]["prompt_tokens"].get<size_t>(),
            r.ids[0].size() + r.ids[1].size() + r.ids[2].size());
}

TEST(Embed, BadInputIsAnError) {
  const EmbedRow r = load_rows().at(0);
  LanguageModel model = LanguageModel::load(r.dir, {.exact = true});
  EXPECT_THROW(model.embed({{}}), Error);
  EXPECT_THROW(model.embed({{1, model.vocab_size()}}), Error);
  test::RunResult res = test::run_lmx("embed --exact --model " + r.dir.string());
  EXPECT_EQ(res.exit_code, 1);
  EXPECT_NE(res.err.find("nothing to embed"), std::string::npos) << res.err;
}

}  // namespace
}  // namespace lmx
