// A LoRA adapter directory's adapter_config.json (read_adapter_config: fine_tune_type,
// num_layers, lora_parameters rank / scale / dropout / keys). Only lmx::Error may come out.
#include "core/error.h"
#include "fuzz_util.h"
#include "lora/lora.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path =
      lmx::fuzz::write_scratch("adapter_config.json", {reinterpret_cast<const char*>(data), size});
  lmx::fuzz::expect_only<lmx::Error>("adapter_config",
                                     [&] { lmx::lora::read_adapter_config(path.parent_path()); });
  return 0;
}
