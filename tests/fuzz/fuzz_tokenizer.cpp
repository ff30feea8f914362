// tokenizer.json loading and use. The input is "<tokenizer.json>\0<text>": Tokenizer::from_file
// on the first part, then the text encoded with and without special tokens, decoded, and streamed
// token by token through StreamingDetokenizer, whose concatenated output must equal decode().
// Only lmx::Error may come out (invalid UTF-8 text is one).
#include <cstring>

#include "core/error.h"
#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lmx;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string_view json = in.substr(0, nul);
  const std::string_view text = nul == std::string_view::npos ? "" : in.substr(nul + 1);
  const auto path = fuzz::write_scratch("tokenizer.json", json);
  fuzz::expect_only<Error>("tokenizer", [&] {
    const Tokenizer tok = Tokenizer::from_file(path);
    for (bool special : {true, false}) {
      std::vector<int> ids = tok.encode(text, special);
      const std::string whole = tok.decode(ids);
      (void)tok.decode(ids, true);
      StreamingDetokenizer stream(tok);
      std::string streamed;
      for (int id : ids) streamed += stream.add(id);
      streamed += stream.finalize();
      if (streamed != whole) {
        std::fprintf(stderr, "[tokenizer] streamed %zu bytes, decode %zu bytes\n", streamed.size(),
                     whole.size());
        std::abort();
      }
      for (int id : ids) (void)tok.id_to_token(id);
    }
    // Ids outside the vocabulary: decode skips them, id_to_token throws lmx::Error.
    (void)tok.decode({-1, tok.vocab_size(), 1 << 30});
  });
  return 0;
}
