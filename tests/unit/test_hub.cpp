// Model references without a network: repo id parsing, the file allow list, the cache layout
// huggingface_hub writes (refs, snapshots, blobs) resolved offline, and the offline errors.
// The downloads themselves are tested against a local hub in tests/hub/test_hub.py.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "core/error.h"
#include "hub/hub.h"
#include "lmx/lmx.h"

namespace lmx {
namespace {

namespace fs = std::filesystem;

TEST(Hub, ParsesRepoIds) {
  auto r = hub::parse_repo_ref("mlx-community/SmolLM2-135M-Instruct-4bit");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->repo_id, "mlx-community/SmolLM2-135M-Instruct-4bit");
  EXPECT_EQ(r->revision, "main");
  r = hub::parse_repo_ref("org/name@v1.0");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->repo_id, "org/name");
  EXPECT_EQ(r->revision, "v1.0");
  r = hub::parse_repo_ref("org/name@refs/pr/3");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->revision, "refs/pr/3");
  for (const char* bad :
       {"name", "a/b/c", "/abs/path", "./rel/x", "org/na--me", "org/..x", "-org/name", "org/name.",
        "org/", "/name", "org/name@", "org/na me", "org/name@a b", "org/name@../x", "~/models/x"})
    EXPECT_FALSE(hub::parse_repo_ref(bad)) << bad;
  EXPECT_FALSE(hub::parse_repo_ref("org/" + std::string(95, 'x')));
}

TEST(Hub, KeepsOnlyModelFiles) {
  for (const char* yes :
       {"config.json", "generation_config.json", "model.safetensors",
        "model-00001-of-00002.safetensors", "model.safetensors.index.json", "tokenizer.json",
        "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "kv_config.json",
        "adapter_config.json", "adapters.safetensors", "tokenizer.model", "merges.txt"})
    EXPECT_TRUE(hub::wanted_file(yes)) << yes;
  for (const char* no :
       {"README.md", ".gitattributes", "pytorch_model.bin", "consolidated.safetensors",
        "modeling_x.py", "onnx/config.json", "model.gguf", ""})
    EXPECT_FALSE(hub::wanted_file(no)) << no;
}

class HubCache : public ::testing::Test {
 protected:
  void SetUp() override {
    cache_ = fs::temp_directory_path() /
             ("lmx_hub_" + std::to_string(::getpid()) + "_" +
              ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(cache_);
    fs::create_directories(cache_);
  }
  void TearDown() override { fs::remove_all(cache_); }

  // models--org--name with refs/main -> commit, one blob per file, snapshot symlinks.
  fs::path make_repo(const std::string& commit, const std::vector<std::string>& files) {
    const fs::path folder = cache_ / "models--org--name";
    fs::create_directories(folder / "refs");
    std::ofstream(folder / "refs" / "main") << commit;
    const fs::path snap = folder / "snapshots" / commit;
    fs::create_directories(snap);
    fs::create_directories(folder / "blobs");
    int i = 0;
    for (const auto& f : files) {
      const std::string etag = "etag" + std::to_string(i++);
      std::ofstream(folder / "blobs" / etag)
          << (f == "config.json" ? R"({"model_type":"llama"})" : "x");
      fs::create_symlink(fs::path("../../blobs") / etag, snap / f);
    }
    return snap;
  }

  std::string error_of(const std::string& ref, bool offline = true) {
    try {
      hub::resolve_model(
          ref, {.offline = offline, .cache_dir = cache_, .endpoint = "http://127.0.0.1:9"});
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  fs::path cache_;
};

const std::string kCommit = "0123456789abcdef0123456789abcdef01234567";

TEST_F(HubCache, ResolvesRefsAndCommitsOffline) {
  const fs::path snap = make_repo(kCommit, {"config.json", "model.safetensors", "tokenizer.json"});
  const hub::HubOptions o{.offline = true, .cache_dir = cache_};
  EXPECT_EQ(hub::resolve_model("org/name", o), snap);
  EXPECT_EQ(hub::resolve_model("org/name@" + kCommit, o), snap);
  EXPECT_EQ(hub::repo_folder(cache_, "org/name"), cache_ / "models--org--name");
  // An existing directory is taken as it is, whatever it looks like.
  EXPECT_EQ(hub::resolve_model(snap.string(), o), snap);
}

TEST_F(HubCache, OfflineErrorsSayWhatIsMissing) {
  EXPECT_NE(error_of("org/name").find("is not in the cache"), std::string::npos);
  make_repo(kCommit, {"config.json", "tokenizer.json"});
  EXPECT_NE(error_of("org/name").find("incomplete in the cache"), std::string::npos);
  EXPECT_NE(error_of("org/name@v2").find("(revision 'v2') is not in the cache"), std::string::npos);
  // Neither a path nor a repo id: returned as it is, for the loader's "does not exist".
  EXPECT_EQ(hub::resolve_model("/no/such/dir", {.offline = true, .cache_dir = cache_}),
            fs::path("/no/such/dir"));
  // Online with nothing listening: the hub is unreachable and the cache cannot stand in.
  const std::string e = error_of("org/other", false);
  EXPECT_NE(e.find("cannot reach the hub at http://127.0.0.1:9"), std::string::npos) << e;
}

TEST_F(HubCache, ShardedSnapshotNeedsEveryShard) {
  const fs::path snap = make_repo(kCommit, {"config.json", "model-00001-of-00002.safetensors"});
  std::ofstream(snap.parent_path().parent_path() / "blobs" / "index")
      << R"({"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}})";
  fs::create_symlink("../../blobs/index", snap / "model.safetensors.index.json");
  const std::string e = error_of("org/name");
  EXPECT_NE(e.find("missing model-00002-of-00002.safetensors"), std::string::npos) << e;
}

TEST_F(HubCache, LanguageModelLoadTakesRepoIds) {
  ::setenv("HF_HUB_CACHE", cache_.c_str(), 1);
  ::setenv("HF_HUB_OFFLINE", "1", 1);
  try {
    LanguageModel::load("org/name");
    ADD_FAILURE() << "loaded a model that is not in the cache";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is not in the cache (" + cache_.string()),
              std::string::npos)
        << e.what();
  }
  ::unsetenv("HF_HUB_OFFLINE");
  ::unsetenv("HF_HUB_CACHE");
}

TEST_F(HubCache, ListsAndRemoves) {
  make_repo(kCommit, {"config.json", "model.safetensors"});
  const auto models = hub::list_cached(cache_);
  ASSERT_EQ(models.size(), 1u);
  EXPECT_EQ(models[0].repo_id, "org/name");
  EXPECT_EQ(models[0].model_type, "llama");
  EXPECT_EQ(models[0].refs, std::vector<std::string>{"main"});
  EXPECT_EQ(models[0].size_bytes, fs::file_size(cache_ / "models--org--name/blobs/etag0") + 1);
  EXPECT_TRUE(hub::remove_cached(cache_, "org/name"));
  EXPECT_FALSE(fs::exists(cache_ / "models--org--name"));
  EXPECT_FALSE(hub::remove_cached(cache_, "org/name"));
}

}  // namespace
}  // namespace lmx
