// The chat page at / (src/server/web: index.html, chat.css, chat.js), compiled into the binary.
#pragma once

#include <string>

namespace httplib {
class Server;
}

namespace lmx::server {

// GET / and /assets/chat.{css,js}. The page calls the API from the browser (/v1/models,
// /v1/chat/completions), so the files themselves need no key.
void add_chat_page(httplib::Server& http);
// The page's own paths: open without --api-key's key (static files, no data; the page sends the
// key it is given with its API calls).
bool is_chat_page(const std::string& path);

}  // namespace lmx::server
