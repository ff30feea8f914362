// lmx embed: Qwen3-Embedding vectors of texts, printed in the shape of an OpenAI embeddings
// response.
#include <cstdio>
#include <fstream>

#include "cli/commands.h"
#include "cli/flags.h"
#include "core/error.h"
#include "lmx/lmx.h"

namespace lmx::cli {

namespace {

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  check(in.good(), "lmx embed", "cannot read --file '", path, "'");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  return lines;
}

}  // namespace

int cmd_embed(const Args& args) {
  Flags f(
      "embed",
      "Embed texts with a Qwen3-Embedding checkpoint: end-of-text token appended, last-token "
      "pooling of the final norm's state, L2-normalized. Prints JSON to standard output.",
      {{"model", "model directory (MLX format) or Hugging Face repo id org/name[@rev]", false,
        "DIR|REPO"},
       {"text", "a text to embed (repeatable)", false, "TEXT"},
       {"file", "embed every non-empty line of this file", false, "PATH"},
       {"exact", "tier L1: stock MLX ops, bit-exact with mlx-lm (default: the fast tier L3)", true},
       offline_flag()});
  if (!f.parse(args)) {
    std::fputs(f.usage().c_str(), stdout);
    return 0;
  }
  std::vector<std::string> texts = f.all("text");
  for (const std::string& path : f.all("file"))
    for (std::string& line : read_lines(path)) texts.push_back(std::move(line));
  check(!texts.empty(), "lmx embed", "nothing to embed, expected --text or --file");
  LanguageModel model = LanguageModel::load(resolve_model_flag(f), {.exact = f.on("exact")});
  std::vector<std::vector<int>> batch;
  size_t tokens = 0;
  for (const std::string& t : texts) {
    batch.push_back(model.embedding_tokens(t));
    tokens += batch.back().size();
  }
  const std::vector<std::vector<float>> out = model.embed(batch);
  std::printf("{\"object\":\"list\",\"data\":[");
  for (size_t i = 0; i < out.size(); ++i) {
    std::printf("%s{\"object\":\"embedding\",\"index\":%zu,\"embedding\":[", i ? "," : "", i);
    // %.9g round-trips every float32.
    for (size_t j = 0; j < out[i].size(); ++j) std::printf("%s%.9g", j ? "," : "", out[i][j]);
    std::printf("]}");
  }
  std::printf("],\"usage\":{\"prompt_tokens\":%zu,\"total_tokens\":%zu}}\n", tokens, tokens);
  return 0;
}

}  // namespace lmx::cli
