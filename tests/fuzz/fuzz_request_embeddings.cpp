// POST /v1/embeddings: the raw body through parse_body and parse_embedding_request. Only ApiError
// (a 400 naming the field, or a 404) may come out: anything else would be a 500 or a crash.
#include "fuzz_util.h"
#include "server/api_error.h"
#include "server/requests.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lmx::server;
  const std::string body(reinterpret_cast<const char*>(data), size);
  lmx::fuzz::expect_only<ApiError>("request_embeddings",
                                   [&] { parse_embedding_request(parse_body(body)); });
  return 0;
}
