// A GGUF file: gguf::File (header, typed metadata with nested arrays, tensor infos, alignment,
// data section against the file size), every typed getter on every key, the first rows of each
// tensor dequantized, and, when the file names a tokenizer, the tokenizer.json lmx convert would
// build from its metadata loaded and run. Only lmx::Error may come out.
#include <algorithm>
#include <vector>

#include "convert/gguf_tokenizer.h"
#include "core/error.h"
#include "fuzz_util.h"
#include "io/gguf.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lmx;
  const auto path = fuzz::write_scratch("model.gguf", {reinterpret_cast<const char*>(data), size});
  fuzz::expect_only<Error>("gguf", [&] {
    const gguf::File f(path);
    // A getter of the wrong type throws lmx::Error; each is tried on every key.
    auto quiet = [](auto&& get) {
      try {
        get();
      } catch (const Error&) {
      }
    };
    for (const auto& entry : f.metadata()) {
      const std::string& key = entry.first;
      quiet([&] { (void)f.opt_string(key); });
      quiet([&] { (void)f.opt_int(key); });
      quiet([&] { (void)f.opt_float(key); });
      quiet([&] { (void)f.opt_bool(key); });
      quiet([&] { (void)f.get_array(key); });
    }
    std::vector<float> row;
    for (const auto& t : f.tensors()) {
      if (!gguf::can_dequantize(t.type) || t.dims.empty()) continue;
      const int64_t n = std::min<int64_t>(t.row_length(), 4096);
      const auto layout = gguf::block_layout(static_cast<uint32_t>(t.type));
      if (!layout || n % layout->block_size != 0) continue;
      row.resize(n);
      gguf::dequantize_row(t.type, f.data(t), row.data(), n);
    }
    if (f.has("tokenizer.ggml.model")) {
      const auto arch = f.opt_string("general.architecture").value_or("llama");
      const auto tok = convert::build_gguf_tokenizer(f, arch, 2048);
      const auto json_path = fuzz::write_scratch("tokenizer.json", tok.tokenizer_json);
      const Tokenizer t = Tokenizer::from_file(json_path);
      t.decode(t.encode("Hello world, <s> 123 ünïcode"));
    }
  });
  return 0;
}
