// lmx get / ls / rm: the Hugging Face cache (src/hub), and --model references for every command.
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "core/error.h"
#include "core/progress.h"
#include "hub/hub.h"
#include "models/model.h"

namespace lmx::cli {

FlagSpec offline_flag() {
  return {"offline", "use only the local Hugging Face cache, never the hub (as HF_HUB_OFFLINE=1)",
          true};
}

std::string resolve_model_flag(const Flags& f, const std::string& flag) {
  hub::HubOptions o;
  if (f.on("offline")) o.offline = true;
  return hub::resolve_model(f.required(flag), o).string();
}

namespace {

// These commands take only switches, so every argument not starting with '-' is positional.
bool parse_or_help(Flags& f, const Args& args, size_t positional, Args& rest) {
  Args flags;
  for (const auto& a : args) {
    if (a.rfind('-', 0) == 0)
      flags.push_back(a);
    else
      rest.push_back(a);
  }
  if (!f.parse(flags)) {
    std::fputs(f.usage().c_str(), stdout);
    return false;
  }
  check(rest.size() == positional, "lmx", "expected ", positional, " argument(s), got ",
        rest.size(), " (see --help)");
  return true;
}

}  // namespace

int cmd_get(const Args& args) {
  Flags f(
      "get REPO[@REVISION]",
      "Download a model from the Hugging Face hub (HF_ENDPOINT, HF_TOKEN) into the local cache\n"
      "(HF_HUB_CACHE, the layout huggingface_hub uses): only the files a model needs, partial\n"
      "files resumed. Prints the snapshot directory.",
      {offline_flag(), {"quiet", "no progress bars", true}});
  Args rest;
  if (!parse_or_help(f, args, 1, rest)) return 0;
  const auto ref = hub::parse_repo_ref(rest[0]);
  check(ref.has_value(), "lmx get", "'", rest[0],
        "' is not a Hugging Face repo id, expected org/name[@revision]");
  hub::HubOptions o;
  if (f.on("offline")) o.offline = true;
  o.progress = !f.on("quiet");
  std::printf("%s\n", hub::download(*ref, o).c_str());
  return 0;
}

int cmd_ls(const Args& args) {
  Flags f("ls", "List the models in the local Hugging Face cache (HF_HUB_CACHE).", {});
  Args rest;
  if (!parse_or_help(f, args, 0, rest)) return 0;
  const std::filesystem::path cache = hub::default_cache_dir();
  const auto models = hub::list_cached(cache);
  if (models.empty()) {
    std::fprintf(stderr, "no models in %s\n", cache.c_str());
    return 0;
  }
  const auto known = registered_architectures();
  std::printf("%-48s %10s  %-28s %-12s %s\n", "REPO", "SIZE", "ARCHITECTURE", "QUANT", "SUPPORTED");
  for (const auto& m : models) {
    const bool ok =
        std::find(known.begin(), known.end(), m.model_type) != known.end() && !m.model_type.empty();
    std::string supported = ok                     ? "yes"
                            : m.model_type.empty() ? "no (no config.json)"
                                                   : "no (" + m.model_type + ")";
    std::printf("%-48s %10s  %-28s %-12s %s\n", m.repo_id.c_str(),
                format_bytes(m.size_bytes).c_str(),
                m.architecture.empty() ? "-" : m.architecture.c_str(),
                m.quantization.empty() ? "-" : m.quantization.c_str(), supported.c_str());
  }
  return 0;
}

int cmd_rm(const Args& args) {
  Flags f("rm REPO", "Remove a model (every revision) from the local Hugging Face cache.", {});
  Args rest;
  if (!parse_or_help(f, args, 1, rest)) return 0;
  const auto ref = hub::parse_repo_ref(rest[0]);
  check(ref.has_value() && rest[0].find('@') == std::string::npos, "lmx rm", "'", rest[0],
        "' is not a Hugging Face repo id, expected org/name");
  const std::filesystem::path cache = hub::default_cache_dir();
  check(hub::remove_cached(cache, ref->repo_id), "lmx rm", "'", ref->repo_id,
        "' is not in the cache (", hub::repo_folder(cache, ref->repo_id).string(), ")");
  std::fprintf(stderr, "removed %s\n", hub::repo_folder(cache, ref->repo_id).c_str());
  return 0;
}

}  // namespace lmx::cli
