// POST /v1/responses (OpenAI's Responses API) over the chat path: input items, instructions,
// function tools and their call / output items, text.format, the streaming event sequence, and
// previous_response_id from an in-memory store with a TTL and a byte cap.
#pragma once

#include <chrono>
#include <cstddef>
#include <list>
#include <mutex>
#include <optional>
#include <string>

#include "server/requests.h"

namespace lmx::server {

class ResponseStore {
 public:
  ResponseStore(std::chrono::seconds ttl, size_t max_bytes) : ttl_(ttl), max_bytes_(max_bytes) {}
  struct Entry {
    ojson response;  // what GET /v1/responses/{id} answers
    ojson messages;  // the conversation up to and including this response (chat form)
  };
  // Drops the oldest entries past the byte cap; an entry larger than the cap is not kept.
  void put(const std::string& id, Entry e);
  std::optional<Entry> get(const std::string& id);
  bool erase(const std::string& id);
  size_t bytes() const;

 private:
  struct Item {
    std::string id;
    Entry entry;
    size_t bytes;
    std::chrono::steady_clock::time_point expires;
  };
  void expire();  // with mu_ held
  mutable std::mutex mu_;
  std::list<Item> items_;  // oldest first
  size_t bytes_ = 0;
  std::chrono::seconds ttl_;
  size_t max_bytes_;
};

// The Responses request as a chat-completions body (messages, tools, tool_choice,
// response_format, max_completion_tokens...), with the previous response's conversation first.
// ApiError 400 naming the field for what cannot be served (non-function tools, images), 404 for
// an unknown previous_response_id.
ojson responses_to_chat(const ojson& body, ResponseStore& store);

}  // namespace lmx::server
