// config.json as load_model reads it before any weight: the JSON itself and the `quantization`
// block (defaults and per-module entries, false meaning "keep float": QuantConfig::from_config).
// Only lmx::Error may come out.
#include "core/error.h"
#include "core/json.h"
#include "fuzz_util.h"
#include "models/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lmx;
  const auto path = fuzz::write_scratch("config.json", {reinterpret_cast<const char*>(data), size});
  fuzz::expect_only<Error>("config", [&] {
    const json config = read_json_file(path);
    const QuantConfig q = QuantConfig::from_config(config, "config.json");
    for (const auto& [module, spec] : q.modules)
      if (spec) (void)(spec->mode.size() + spec->bits + spec->group_size);
  });
  return 0;
}
