// Generates greedily from a model with the installed library only (include <lmx/lmx.h>, link
// lmx::lmx) and prints the text as `lmx generate` does: the tokens' text, then a newline.
#include <lmx/lmx.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s MODEL_DIR PROMPT MAX_TOKENS\n", argv[0]);
    return 2;
  }
  try {
    lmx::LanguageModel model = lmx::LanguageModel::load(argv[1]);
    lmx::GenerateOptions options;
    options.max_tokens = std::atoi(argv[3]);
    model.generate(model.encode(argv[2]), options, [](const lmx::TokenOutput& t) {
      std::fwrite(t.text.data(), 1, t.text.size(), stdout);
      return true;
    });
    std::fputc('\n', stdout);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
