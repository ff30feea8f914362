// model.safetensors.index.json as the hub client reads it (missing_model_files: a cached snapshot
// is complete when config.json and every shard of the index's weight_map exist). Only lmx::Error
// may come out, and it may not: a garbled index reads as "unreadable", not as an exception.
#include "core/error.h"
#include "fuzz_util.h"
#include "hub/hub.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = lmx::fuzz::write_scratch("model.safetensors.index.json",
                                             {reinterpret_cast<const char*>(data), size});
  lmx::fuzz::expect_only<>("safetensors_index",
                           [&] { lmx::hub::missing_model_files(path.parent_path()); });
  return 0;
}
