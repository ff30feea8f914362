// A prompt-cache file (mlx-lm's save_prompt_cache layout: per-layer state arrays, class names and
// scalar / none entries in the metadata): load_prompt_cache, then each layer's state and offset
// read back. Only lmx::Error may come out.
#include "cache/prompt_cache.h"
#include "core/error.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path =
      lmx::fuzz::write_scratch("cache.safetensors", {reinterpret_cast<const char*>(data), size});
  lmx::fuzz::expect_only<lmx::Error>("prompt_cache", [&] {
    auto pc = lmx::load_prompt_cache(path);
    for (auto& layer : pc.cache) {
      (void)layer->offset();
      (void)layer->nbytes();
      for (auto& a : layer->state())
        if (a.size() <= (1u << 20)) mlx::core::eval(a);
    }
  });
  return 0;
}
