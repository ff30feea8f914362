// POST /v1/embeddings: OpenAI's request and response shapes over Qwen3-Embedding pooling (the
// final norm's state at the last token, L2-normalized; src/engine/embed.h), run on the engine
// thread like a generation.
#include <cstring>

#include "engine/embed.h"
#include "server/api_error.h"
#include "server/context.h"

namespace lmx::server {

namespace {

// The vector's float32 bytes (little-endian, as the host stores them) in standard base64.
std::string base64_floats(const std::vector<float>& v) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string bytes(v.size() * sizeof(float), '\0');
  if (!v.empty()) std::memcpy(bytes.data(), v.data(), bytes.size());
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t x = 0;
    for (size_t k = 0; k < 3; ++k) x = x << 8 | (k < n ? static_cast<uint8_t>(bytes[i + k]) : 0u);
    for (size_t k = 0; k < 4; ++k) out.push_back(k <= n ? kAlphabet[x >> (18 - 6 * k) & 63] : '=');
  }
  return out;
}

}  // namespace

void handle_embeddings(const Context& ctx, const httplib::Request& req, httplib::Response& res) {
  const EmbeddingRequest r = parse_embedding_request(parse_body(req.body));
  check_model(ctx, r.model);
  const int dims = ctx.engine->hidden_size();
  if (r.dimensions && dims > 0 && *r.dimensions != dims)
    bad_field("dimensions", "must be this model's embedding size " + std::to_string(dims) +
                                " (other sizes are not supported), got " +
                                std::to_string(*r.dimensions));
  auto job = std::make_shared<Job>();
  for (const std::string& t : r.texts)
    job->embed.push_back(embedding_tokens(ctx.engine->tokenizer(), t));
  for (const auto& ids : r.token_ids) job->embed.push_back(ids);
  const int vocab = ctx.engine->vocab_size();
  const auto limit = ctx.engine->info().max_position_embeddings;
  size_t tokens = 0;
  for (size_t i = 0; i < job->embed.size(); ++i) {
    const std::string at = job->embed.size() == 1 ? "input" : "input[" + std::to_string(i) + "]";
    const auto& ids = job->embed[i];
    for (int t : ids)
      if (t < 0 || t >= vocab)
        bad_field(at, "has token id " + std::to_string(t) + " outside the vocabulary of " +
                          std::to_string(vocab));
    if (limit && static_cast<long>(ids.size()) > *limit)
      throw ApiError(400,
                     "'" + at + "' has " + std::to_string(ids.size()) +
                         " tokens; this model's maximum context length is " +
                         std::to_string(*limit),
                     at, "invalid_request_error", "context_length_exceeded");
    tokens += ids.size();
  }
  ctx.engine->submit(job);
  std::vector<TokenEvent> none;
  while (job->pop(none)) {
  }
  const JobResult& out = job->result();
  if (!out.error.empty()) throw ApiError(500, out.error, "", "server_error");
  if (out.embeddings.size() != job->embed.size())
    throw ApiError(503, "the server is shutting down", "", "server_error");
  if (r.dimensions && static_cast<size_t>(*r.dimensions) != out.embeddings[0].size())
    bad_field("dimensions", "must be this model's embedding size " +
                                std::to_string(out.embeddings[0].size()) + ", got " +
                                std::to_string(*r.dimensions));
  ojson data = ojson::array();
  for (size_t i = 0; i < out.embeddings.size(); ++i) {
    ojson e = {{"object", "embedding"}, {"index", i}};
    if (r.base64) {
      e["embedding"] = base64_floats(out.embeddings[i]);
    } else {
      ojson v = ojson::array();
      for (float x : out.embeddings[i]) v.push_back(x);
      e["embedding"] = std::move(v);
    }
    data.push_back(std::move(e));
  }
  send_json(res, {{"object", "list"},
                  {"data", std::move(data)},
                  {"model", ctx.model_id},
                  {"usage", {{"prompt_tokens", tokens}, {"total_tokens", tokens}}}});
}

}  // namespace lmx::server
