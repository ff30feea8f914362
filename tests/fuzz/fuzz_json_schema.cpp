// JSON-schema compilation and the automaton it drives: the input is "<schema>\0<text>";
// compile_schema on the schema (unsupported keywords are lmx::Error), then the text fed byte by
// byte to the JsonAutomaton (stopping when it dies) and checked whole with matches(). The
// any-JSON grammar of response_format json_object runs over the text too.
#include "constrain/json_automaton.h"
#include "constrain/json_grammar.h"
#include "core/error.h"
#include "fuzz_util.h"

namespace {

void run(const lmx::constrain::Grammar& g, std::string_view text) {
  const lmx::constrain::JsonAutomaton a(g);
  lmx::constrain::State s = a.initial();
  for (size_t i = 0; i < text.size() && !s.dead(); ++i) {
    s = a.feed(s, static_cast<uint8_t>(text[i]));
    // The live-stack set must stay small for the mask cache to work.
    if (s.stacks.size() > 4096) {
      std::fprintf(stderr, "[json_schema] %zu live stacks after %zu bytes\n", s.stacks.size(),
                   i + 1);
      std::abort();
    }
  }
  (void)a.accepting(s);
  (void)s.key();
  (void)a.matches(text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lmx;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string_view schema_text = in.substr(0, nul);
  const std::string_view text = nul == std::string_view::npos ? "" : in.substr(nul + 1);
  const json schema = json::parse(schema_text, nullptr, false);
  if (schema.is_discarded()) {
    run(constrain::any_json_grammar(false), text);
    return 0;
  }
  fuzz::expect_only<Error>("json_schema", [&] { run(constrain::compile_schema(schema), text); });
  fuzz::expect_only<>("json_schema", [&] { run(constrain::any_json_grammar(true), text); });
  return 0;
}
