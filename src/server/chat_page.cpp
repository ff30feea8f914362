#include "server/chat_page.h"

#include <httplib.h>

#include "server/web_assets.h"

namespace lmx::server {
namespace {

void route(httplib::Server& http, const char* path, std::string_view body, const char* type) {
  http.Get(path, [body, type](const httplib::Request&, httplib::Response& res) {
    res.set_content(body.data(), body.size(), type);
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Content-Type-Options", "nosniff");
  });
}

}  // namespace

bool is_chat_page(const std::string& path) {
  return path == "/" || path == "/index.html" || path == "/assets/chat.css" ||
         path == "/assets/chat.js";
}

void add_chat_page(httplib::Server& http) {
  route(http, "/", kWeb_index_html, "text/html; charset=utf-8");
  route(http, "/index.html", kWeb_index_html, "text/html; charset=utf-8");
  route(http, "/assets/chat.css", kWeb_chat_css, "text/css; charset=utf-8");
  route(http, "/assets/chat.js", kWeb_chat_js, "text/javascript; charset=utf-8");
}

}  // namespace lmx::server
