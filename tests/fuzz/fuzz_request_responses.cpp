// POST /v1/responses: the raw body through parse_body and responses_to_chat (with one stored
// response, id "resp_seed", for previous_response_id), then parse_chat_request. Only ApiError (a
// 400 naming the field, or a 404) may come out: anything else would be a 500 or a crash.
#include "fuzz_util.h"
#include "server/api_error.h"
#include "server/requests.h"
#include "server/responses.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lmx::server;
  static ResponseStore& store = *[] {
    auto* s = new ResponseStore(std::chrono::seconds(3600), 1 << 20);
    s->put("resp_seed",
           {ojson{{"id", "resp_seed"}, {"object", "response"}},
            ojson::parse(
                R"([{"role":"user","content":"hi"},{"role":"assistant","content":"hello"}])")});
    return s;
  }();
  const std::string body(reinterpret_cast<const char*>(data), size);
  lmx::fuzz::expect_only<ApiError>("request_responses", [&] {
    parse_chat_request(responses_to_chat(parse_body(body), store), SamplingDefaults{});
  });
  return 0;
}
