// Model references: a local directory, or a Hugging Face repo id `org/name[@revision]` resolved
// through the cache layout huggingface_hub writes (docs/hub.md):
//   <cache>/models--org--name/refs/<revision>            the commit hash a branch or tag points at
//   <cache>/models--org--name/blobs/<etag>               file contents, named by their etag
//   <cache>/models--org--name/snapshots/<commit>/<file>  relative symlinks into blobs/
// What is missing is downloaded from the hub (HF_ENDPOINT), only the files a model needs.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lmx::hub {

struct RepoRef {
  std::string repo_id;            // "org/name"
  std::string revision = "main";  // branch, tag or commit hash
};

struct HubOptions {
  // Never contact the hub: HF_HUB_OFFLINE=1 (or TRANSFORMERS_OFFLINE=1) unless set here.
  std::optional<bool> offline = std::nullopt;
  std::filesystem::path cache_dir = {};  // empty: default_cache_dir()
  std::string endpoint = {};             // empty: HF_ENDPOINT, else https://huggingface.co
  std::optional<std::string> token = std::nullopt;  // nullopt: HF_TOKEN, else $HF_HOME/token
  bool progress = true;                             // a progress bar per file on stderr
};

// `org/name` or `org/name@revision` with huggingface_hub's repo id rules; nullopt otherwise.
std::optional<RepoRef> parse_repo_ref(std::string_view ref);

// HF_HUB_CACHE, else HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
// ~/.cache/huggingface/hub.
std::filesystem::path default_cache_dir();
// <cache>/models--org--name
std::filesystem::path repo_folder(const std::filesystem::path& cache, const std::string& repo_id);
bool offline_from_env();

// The directory of a model reference: an existing path as it is; a repo id resolved from the
// cache, downloading what is missing unless offline; anything else unchanged (the loader then
// reports the missing directory). Errors say which of "not found on the hub", "not in the
// cache" (offline) or an I/O failure happened.
std::filesystem::path resolve_model(const std::string& ref, const HubOptions& options = {});

// Downloads (or verifies in the cache) the model files of a repo; returns the snapshot
// directory.
std::filesystem::path download(const RepoRef& ref, const HubOptions& options = {});

// Whether huggingface_hub-style filename selection keeps this repo file (lmx's allow list:
// *.json, model*.safetensors, adapters.safetensors, *.jinja, tokenizer.model, *.tiktoken, *.txt,
// *.jsonl; top-level files only).
bool wanted_file(std::string_view filename);

struct CachedModel {
  std::string repo_id;
  std::filesystem::path folder;  // models--org--name
  std::filesystem::path
      snapshot;                   // the snapshot shown (refs/main's, else the newest); may be empty
  std::vector<std::string> refs;  // "main", tags...
  uint64_t size_bytes = 0;        // blobs/ on disk
  std::string model_type;         // config.json's model_type ("" if none)
  std::string architecture;       // config.json's architectures[0], else model_type
  std::string quantization;       // "4-bit g64", "mxfp4", "bf16" ...
};

// What a loadable snapshot directory lacks: config.json and its weights (every shard of
// model.safetensors.index.json's weight_map, else some *.safetensors); empty when complete. A
// garbled index is reported as missing ("... (unreadable)"), never thrown.
std::vector<std::string> missing_model_files(const std::filesystem::path& snap);

// Every models--*--* folder of the cache, sorted by repo id.
std::vector<CachedModel> list_cached(const std::filesystem::path& cache);

// Removes a repo's folder (and its download locks) from the cache; false if it was not there.
bool remove_cached(const std::filesystem::path& cache, const std::string& repo_id);

}  // namespace lmx::hub
