// The hub client speaks what huggingface_hub's file_download.py does: the file list from
// GET /api/models/{repo}/revision/{rev} (`sha`, `siblings`), per file HEAD
// /{repo}/resolve/{commit}/{file} for the etag (X-Linked-Etag over ETag), the size
// (X-Linked-Size over Content-Length) and X-Repo-Commit, stopping at a redirect to another origin
// (a CDN: the redirect response carries the metadata, and the token must not follow it); then GET
// of that location into blobs/<etag>.incomplete, resumed with Range.
#include "hub/hub.h"

// Debian's libcpp-httplib is built with OpenSSL; its pkg-config flags define
// CPPHTTPLIB_OPENSSL_SUPPORT for every translation unit that includes the header (class layouts
// depend on it). Only this one uses https.
#include <fcntl.h>
#include <httplib.h>
#include <openssl/evp.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <regex>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/json.h"
#include "core/progress.h"

namespace lmx::hub {

namespace fs = std::filesystem;

namespace {

constexpr const char* kWhere = "hub";
constexpr int kMaxRedirects = 10;
constexpr int kMaxRetries = 5;  // reconnects in a row that received no new byte

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

bool env_true(const char* name) {
  std::string v = env(name);
  std::transform(v.begin(), v.end(), v.begin(), ::tolower);
  return v == "1" || v == "on" || v == "yes" || v == "true";
}

fs::path expand_user(const std::string& p) {
  if (p.rfind('~', 0) == 0 && !env("HOME").empty()) return fs::path(env("HOME") + p.substr(1));
  return fs::path(p);
}

fs::path hf_home() {
  if (!env("HF_HOME").empty()) return expand_user(env("HF_HOME"));
  const std::string xdg = env("XDG_CACHE_HOME");
  return (xdg.empty() ? expand_user("~/.cache") : expand_user(xdg)) / "huggingface";
}

bool is_commit_hash(const std::string& s) {
  static const std::regex re("[0-9a-f]{40}");
  return std::regex_match(s, re);
}

// Percent-encoding as Python's urllib.parse.quote(s, safe).
std::string url_quote(const std::string& s, const std::string& safe) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || std::strchr("_.-~", c) ||
        safe.find(static_cast<char>(c)) != std::string::npos) {
      out += static_cast<char>(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

// ---- HTTP ----------------------------------------------------------------------------------

struct Url {
  std::string origin;  // scheme://host[:port]
  std::string target;  // /path?query
};

Url parse_url(const std::string& url) {
  const size_t scheme_end = url.find("://");
  check(scheme_end != std::string::npos, kWhere, "not an absolute URL: '", url, "'");
  const std::string scheme = url.substr(0, scheme_end);
  check(scheme == "http" || scheme == "https", kWhere, "unsupported URL scheme '", scheme, "' in '",
        url, "', expected http or https");
  const size_t path_start = url.find('/', scheme_end + 3);
  Url u;
  u.origin = url.substr(0, path_start);
  u.target = path_start == std::string::npos ? "/" : url.substr(path_start);
  check(u.origin.size() > scheme_end + 3, kWhere, "no host in URL '", url, "'");
  return u;
}

// A Location header against the URL that answered it.
std::string join_location(const std::string& base, const std::string& location) {
  if (location.find("://") != std::string::npos) return location;
  const Url b = parse_url(base);
  if (location.rfind("//", 0) == 0) return b.origin.substr(0, b.origin.find("://") + 1) + location;
  if (location.rfind('/', 0) == 0) return b.origin + location;
  std::string dir = b.target.substr(0, b.target.find('?'));
  dir = dir.substr(0, dir.rfind('/') + 1);
  return b.origin + dir + location;
}

std::unique_ptr<httplib::Client> make_client(const std::string& origin) {
  auto c = std::make_unique<httplib::Client>(origin);
  c->set_connection_timeout(10);
  c->set_read_timeout(60);
  c->set_write_timeout(60);
  c->set_follow_location(false);
  c->set_keep_alive(false);
  return c;
}

std::string describe(httplib::Error e) { return httplib::to_string(e); }

struct HubContext {
  std::string endpoint;  // no trailing slash
  std::string endpoint_origin;
  std::string token;
  fs::path cache;
  bool progress = true;

  // The token goes only to the hub's own origin, never to a CDN it redirects to.
  httplib::Headers headers(const std::string& url) const {
    httplib::Headers h{{"User-Agent", "lmx/" LMX_VERSION}};
    if (!token.empty() && parse_url(url).origin == endpoint_origin)
      h.emplace("Authorization", "Bearer " + token);
    return h;
  }
};

// The hub could not be reached at all (no answer), as opposed to an answer that says no.
struct Unreachable : Error {
  using Error::Error;
};

[[noreturn]] void unreachable(const std::string& url, const std::string& why) {
  throw Unreachable(kWhere, "cannot reach the hub at " + url + ": " + why +
                                " (set HF_HUB_OFFLINE=1 or pass --offline to use only the cache)");
}

// An HTTP status the hub answered with, as huggingface_hub's hf_raise_for_status reads it.
[[noreturn]] void http_failure(const RepoRef& ref, const std::string& url,
                               const httplib::Response& r, const std::string& file = "") {
  const std::string code = r.get_header_value("X-Error-Code");
  const std::string msg = r.get_header_value("X-Error-Message");
  const std::string detail = " (" + std::to_string(r.status) + (code.empty() ? "" : " " + code) +
                             (msg.empty() ? "" : ": " + msg) + ", " + url + ")";
  if (code == "RevisionNotFound")
    fail(kWhere, "revision '", ref.revision, "' of '", ref.repo_id, "' not found on the hub",
         detail);
  if (code == "EntryNotFound")
    fail(kWhere, "file '", file, "' of '", ref.repo_id, "' not found on the hub", detail);
  if (code == "GatedRepo" || r.status == 403)
    fail(kWhere, "'", ref.repo_id,
         "' is gated: accept its terms on the hub and set HF_TOKEN to a token with access", detail);
  if (code == "RepoNotFound" || r.status == 401 || r.status == 404)
    fail(kWhere, "'", ref.repo_id,
         "' not found on the hub; check the name, or set HF_TOKEN for a private or gated repo",
         detail);
  fail(kWhere, "the hub answered ", r.status, " for '", ref.repo_id, "'", detail);
}

// GET of a small JSON document, following redirects.
json get_json(const HubContext& ctx, const RepoRef& ref, std::string url) {
  for (int hop = 0; hop <= kMaxRedirects; ++hop) {
    const Url u = parse_url(url);
    auto c = make_client(u.origin);
    httplib::Result r = c->Get(u.target, ctx.headers(url));
    if (!r) unreachable(url, describe(r.error()));
    if (r->status >= 300 && r->status < 400 && r->has_header("Location")) {
      url = join_location(url, r->get_header_value("Location"));
      continue;
    }
    if (r->status != 200) http_failure(ref, url, *r);
    try {
      return json::parse(r->body);
    } catch (const json::exception& e) {
      fail(kWhere, "the hub's answer to ", url, " is not JSON: ", e.what());
    }
  }
  fail(kWhere, "more than ", kMaxRedirects, " redirects from ", url);
}

struct FileMeta {
  std::string etag;      // normalized: no W/ and no quotes
  std::string commit;    // X-Repo-Commit
  std::string location;  // where to GET it
  std::optional<uint64_t> size;
};

std::string normalize_etag(std::string e) {
  if (e.rfind("W/", 0) == 0) e = e.substr(2);
  if (e.size() >= 2 && e.front() == '"' && e.back() == '"') e = e.substr(1, e.size() - 2);
  return e;
}

std::optional<uint64_t> parse_size(const std::string& s) {
  if (s.empty()) return std::nullopt;
  try {
    size_t used = 0;
    const unsigned long long v = std::stoull(s, &used);
    if (used == s.size()) return static_cast<uint64_t>(v);
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

FileMeta head_file(const HubContext& ctx, const RepoRef& ref, const std::string& commit,
                   const std::string& file) {
  std::string url = ctx.endpoint + "/" + ref.repo_id + "/resolve/" + url_quote(commit, "") + "/" +
                    url_quote(file, "/");
  for (int hop = 0; hop <= kMaxRedirects; ++hop) {
    const Url u = parse_url(url);
    auto c = make_client(u.origin);
    httplib::Headers h = ctx.headers(url);
    h.emplace("Accept-Encoding", "identity");
    httplib::Result r = c->Head(u.target, h);
    if (!r) unreachable(url, describe(r.error()));
    const bool redirect = r->status >= 300 && r->status < 400 && r->has_header("Location");
    if (!redirect && r->status != 200) http_failure(ref, url, *r, file);
    FileMeta m;
    m.etag = normalize_etag(r->has_header("X-Linked-Etag") ? r->get_header_value("X-Linked-Etag")
                                                           : r->get_header_value("ETag"));
    m.commit = r->get_header_value("X-Repo-Commit");
    m.size = parse_size(r->get_header_value("X-Linked-Size"));
    if (!m.size && !redirect) m.size = parse_size(r->get_header_value("Content-Length"));
    if (redirect) {
      const std::string target = join_location(url, r->get_header_value("Location"));
      if (parse_url(target).origin == u.origin) {  // the hub's own redirects (renamed repos)
        url = target;
        continue;
      }
      m.location = target;
    } else {
      m.location = url;
    }
    check(!m.etag.empty(), kWhere, "the hub sent no ETag for '", file, "' of '", ref.repo_id, "' (",
          url, "); is HF_ENDPOINT a Hugging Face hub?");
    return m;
  }
  fail(kWhere, "more than ", kMaxRedirects, " redirects from ", url);
}

// ---- files ---------------------------------------------------------------------------------

std::string errno_text(int e) { return std::strerror(e); }

uint64_t file_size_or_zero(const fs::path& p) {
  std::error_code ec;
  const auto s = fs::file_size(p, ec);
  return ec ? 0 : static_cast<uint64_t>(s);
}

// Digest of a file: sha256 (an LFS etag, 64 hex digits) or git's blob sha1 (40 hex digits:
// sha1 of "blob <size>\0" + content).
std::string file_digest(const fs::path& p, bool git_sha1) {
  std::FILE* f = std::fopen(p.c_str(), "rb");
  check(f != nullptr, p.string(), "cannot read: ", errno_text(errno));
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> md(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  EVP_DigestInit_ex(md.get(), git_sha1 ? EVP_sha1() : EVP_sha256(), nullptr);
  if (git_sha1) {
    const std::string header = "blob " + std::to_string(file_size_or_zero(p));
    EVP_DigestUpdate(md.get(), header.c_str(), header.size() + 1);  // with its NUL
  }
  std::vector<char> buf(1 << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0)
    EVP_DigestUpdate(md.get(), buf.data(), n);
  const bool bad = std::ferror(f);
  std::fclose(f);
  check(!bad, p.string(), "read error while hashing");
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(md.get(), out, &len);
  std::string hex;
  char b[3];
  for (unsigned int i = 0; i < len; ++i) {
    std::snprintf(b, sizeof b, "%02x", out[i]);
    hex += b;
  }
  return hex;
}

bool is_hex(const std::string& s, size_t n) {
  return s.size() == n && std::all_of(s.begin(), s.end(), [](char c) {
           return std::isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'f');
         });
}

void write_atomically(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  const fs::path tmp = p.string() + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    check(out.good(), tmp.string(), "cannot write: ", errno_text(errno));
  }
  fs::rename(tmp, p);
}

// An exclusive advisory lock on .locks/models--org--name/<etag>.lock, the path huggingface_hub
// locks, so two downloads of one blob never share its .incomplete file.
class FileLock {
 public:
  explicit FileLock(const fs::path& p) {
    fs::create_directories(p.parent_path());
    fd_ = ::open(p.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    check(fd_ >= 0, p.string(), "cannot open the lock file: ", errno_text(errno));
    while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
    }
  }
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

void check_free_space(const fs::path& dir, uint64_t need) {
  struct statvfs st {};
  if (::statvfs(dir.c_str(), &st) != 0) return;
  const uint64_t avail = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  check(avail >= need, dir.string(), "not enough disk space: the download needs ",
        format_bytes(need), " more, ", format_bytes(avail), " are free");
}

// GET url into `part` (appending from its current size), following redirects, resuming with
// Range after a dropped connection. Returns the file's final size.
uint64_t fetch_to(const HubContext& ctx, std::string url, const fs::path& part,
                  const std::string& label, std::optional<uint64_t> expected) {
  uint64_t have = file_size_or_zero(part);
  if (expected && have > *expected) {  // a stale partial file of some other content
    fs::remove(part);
    have = 0;
  }
  if (expected) check_free_space(part.parent_path(), *expected - have);
  ProgressBar bar(label, expected.value_or(0), have, {.enabled = ctx.progress});
  int retries = 0;
  int hops = 0;
  while (true) {
    if (expected && have == *expected) break;
    const Url u = parse_url(url);
    auto c = make_client(u.origin);
    httplib::Headers h = ctx.headers(url);
    h.emplace("Accept-Encoding", "identity");
    if (have > 0) h.emplace("Range", "bytes=" + std::to_string(have) + "-");

    std::FILE* out = nullptr;
    int write_errno = 0;
    std::string redirect, bad_status;
    bool complete_already = false;
    const uint64_t before = have;
    auto on_response = [&](const httplib::Response& r) {
      if (r.status >= 300 && r.status < 400 && r.has_header("Location")) {
        redirect = join_location(url, r.get_header_value("Location"));
        return false;
      }
      if (r.status == 416 && have > 0) {  // nothing left past what we have
        complete_already = true;
        return false;
      }
      if (r.status != 200 && r.status != 206) {
        bad_status = std::to_string(r.status);
        return false;
      }
      if (r.status == 206) {
        // "bytes START-END/TOTAL" must start where the file ends.
        const std::string cr = r.get_header_value("Content-Range");
        unsigned long long start = 0;
        if (std::sscanf(cr.c_str(), "bytes %llu-", &start) != 1 || start != have) {
          bad_status =
              "206 with Content-Range '" + cr + "' for a resume at " + std::to_string(have);
          return false;
        }
      }
      const bool restart = r.status == 200 && have > 0;  // the server ignored the Range
      out = std::fopen(part.c_str(), restart ? "wb" : "ab");
      if (!out) {
        write_errno = errno;
        return false;
      }
      // Unbuffered: whatever arrived is on disk when the process is killed, for the next resume.
      std::setvbuf(out, nullptr, _IONBF, 0);
      if (restart) have = 0;
      return true;
    };
    auto on_data = [&](const char* data, size_t n) {
      if (std::fwrite(data, 1, n, out) != n) {
        write_errno = errno ? errno : EIO;
        return false;
      }
      have += n;
      bar.update(have);
      return true;
    };
    httplib::Result r = c->Get(u.target, h, on_response, on_data);
    if (out && std::fclose(out) != 0 && !write_errno) write_errno = errno ? errno : EIO;
    if (write_errno) fail(part.string(), "cannot write the download: ", errno_text(write_errno));
    if (!redirect.empty()) {
      check(++hops <= kMaxRedirects, kWhere, "more than ", kMaxRedirects, " redirects from ", url);
      url = redirect;
      continue;
    }
    if (complete_already) break;
    check(bad_status.empty(), kWhere, "downloading ", label, ": the server answered ", bad_status,
          " (", url, ")");
    if (r && (!expected || have == *expected)) break;
    // A dropped connection (or a body shorter than announced): resume where the file ends, as
    // long as each attempt brings new bytes.
    retries = have > before ? 0 : retries + 1;
    if (retries > kMaxRetries)
      fail(kWhere, "downloading ", label, " from ", url,
           " failed: ", r ? "the connection closed early" : describe(r.error()), " at ", have,
           " of ", expected ? std::to_string(*expected) : std::string("?"),
           " bytes; run the command again to resume");
    std::fprintf(stderr, "%s: connection lost at %s (%s), resuming\n", label.c_str(),
                 format_bytes(have).c_str(), r ? "closed early" : describe(r.error()).c_str());
  }
  bar.finish();
  return have;
}

// ---- cache ---------------------------------------------------------------------------------

void link_pointer(const fs::path& blob, const fs::path& pointer) {
  fs::create_directories(pointer.parent_path());
  const fs::path rel = blob.lexically_relative(pointer.parent_path());
  const fs::path tmp = pointer.string() + ".lnk" + std::to_string(::getpid());
  std::error_code ec;
  fs::remove(tmp, ec);
  fs::create_symlink(rel, tmp);
  fs::rename(tmp, pointer);
}

// The snapshot directory of a ref in the cache, if its commit is known there.
std::optional<fs::path> cached_snapshot(const fs::path& folder, const RepoRef& ref) {
  std::string commit;
  if (is_commit_hash(ref.revision)) {
    commit = ref.revision;
  } else {
    std::ifstream in(folder / "refs" / ref.revision);
    if (!in) return std::nullopt;
    std::getline(in, commit);
    while (!commit.empty() && std::isspace(static_cast<unsigned char>(commit.back())))
      commit.pop_back();
  }
  const fs::path snap = folder / "snapshots" / commit;
  if (commit.empty() || !fs::is_directory(snap)) return std::nullopt;
  return snap;
}

}  // namespace

std::vector<std::string> missing_model_files(const fs::path& snap) {
  std::vector<std::string> missing;
  if (!fs::exists(snap / "config.json")) missing.emplace_back("config.json");
  const fs::path index = snap / "model.safetensors.index.json";
  if (fs::exists(index)) {
    std::set<std::string> shards;
    try {
      const json j = read_json_file(index);
      if (j.contains("weight_map") && j["weight_map"].is_object())
        for (const auto& [k, v] : j["weight_map"].items())
          if (v.is_string()) shards.insert(v.get<std::string>());
    } catch (const Error&) {
      missing.emplace_back("model.safetensors.index.json (unreadable)");
    }
    for (const auto& s : shards)
      if (!fs::exists(snap / s)) missing.push_back(s);
  } else {
    bool any = false;
    for (const auto& e : fs::directory_iterator(snap))
      any |= e.path().extension() == ".safetensors" && fs::exists(e.path());
    // An adapter repository has adapter files instead of a model.
    if (!any && !fs::exists(snap / "adapter_config.json")) missing.emplace_back("*.safetensors");
  }
  return missing;
}

namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

HubContext make_context(const HubOptions& o) {
  HubContext ctx;
  ctx.endpoint = !o.endpoint.empty()           ? o.endpoint
                 : !env("HF_ENDPOINT").empty() ? env("HF_ENDPOINT")
                                               : "https://huggingface.co";
  while (!ctx.endpoint.empty() && ctx.endpoint.back() == '/') ctx.endpoint.pop_back();
  ctx.endpoint_origin = parse_url(ctx.endpoint).origin;
  if (o.token) {
    ctx.token = *o.token;
  } else if (!env("HF_TOKEN").empty()) {
    ctx.token = env("HF_TOKEN");
  } else {
    const fs::path p =
        !env("HF_TOKEN_PATH").empty() ? expand_user(env("HF_TOKEN_PATH")) : hf_home() / "token";
    std::ifstream in(p);
    if (in) std::getline(in, ctx.token);
    while (!ctx.token.empty() && std::isspace(static_cast<unsigned char>(ctx.token.back())))
      ctx.token.pop_back();
  }
  ctx.cache = o.cache_dir.empty() ? default_cache_dir() : o.cache_dir;
  ctx.progress = o.progress && !env_true("HF_HUB_DISABLE_PROGRESS_BARS");
  return ctx;
}

fs::path from_cache(const RepoRef& ref, const fs::path& cache, const std::string& why) {
  const fs::path folder = repo_folder(cache, ref.repo_id);
  const auto snap = cached_snapshot(folder, ref);
  check(snap.has_value(), kWhere, "'", ref.repo_id, "' (revision '", ref.revision,
        "') is not in the cache (", folder.string(), ")", why);
  const auto missing = missing_model_files(*snap);
  check(missing.empty(), kWhere, "'", ref.repo_id, "' is incomplete in the cache (", snap->string(),
        ": missing ", join(missing), ")", why);
  return *snap;
}

}  // namespace

// ---- public --------------------------------------------------------------------------------

std::optional<RepoRef> parse_repo_ref(std::string_view text) {
  RepoRef ref;
  std::string s(text);
  if (const size_t at = s.find('@'); at != std::string::npos) {
    ref.revision = s.substr(at + 1);
    s = s.substr(0, at);
    if (ref.revision.empty() ||
        std::any_of(ref.revision.begin(), ref.revision.end(),
                    [](char c) { return std::isspace(static_cast<unsigned char>(c)); }) ||
        ref.revision.find("..") != std::string::npos)
      return std::nullopt;
  }
  // huggingface_hub's validate_repo_id, with the namespace required.
  static const std::regex re(R"([A-Za-z0-9_.\-]+/[A-Za-z0-9_.\-]+)");
  if (s.size() > 96 || !std::regex_match(s, re) || s.find("--") != std::string::npos ||
      s.find("..") != std::string::npos)
    return std::nullopt;
  const size_t slash = s.find('/');
  for (const std::string& part : {s.substr(0, slash), s.substr(slash + 1)})
    if (part.front() == '-' || part.front() == '.' || part.back() == '-' || part.back() == '.')
      return std::nullopt;
  ref.repo_id = s;
  return ref;
}

fs::path default_cache_dir() {
  if (!env("HF_HUB_CACHE").empty()) return expand_user(env("HF_HUB_CACHE"));
  if (!env("HUGGINGFACE_HUB_CACHE").empty()) return expand_user(env("HUGGINGFACE_HUB_CACHE"));
  return hf_home() / "hub";
}

fs::path repo_folder(const fs::path& cache, const std::string& repo_id) {
  std::string name = "models";
  std::stringstream ss(repo_id);
  for (std::string part; std::getline(ss, part, '/');) name += "--" + part;
  return cache / name;
}

bool offline_from_env() { return env_true("HF_HUB_OFFLINE") || env_true("TRANSFORMERS_OFFLINE"); }

bool wanted_file(std::string_view name) {
  const std::string f(name);
  if (f.empty() || f.find('/') != std::string::npos) return false;
  auto ends = [&](std::string_view suffix) {
    return f.size() >= suffix.size() &&
           f.compare(f.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (ends(".json") || ends(".jinja") || ends(".tiktoken") || ends(".txt") || ends(".jsonl"))
    return true;
  if (f == "tokenizer.model" || f == "tiktoken.model" || f == "adapters.safetensors") return true;
  return f.rfind("model", 0) == 0 && ends(".safetensors");
}

fs::path download(const RepoRef& ref, const HubOptions& options) {
  const HubContext ctx = make_context(options);
  const bool offline = options.offline.value_or(offline_from_env());
  if (offline)
    return from_cache(ref, ctx.cache,
                      ", and downloads are off (HF_HUB_OFFLINE=1 or --offline); run `lmx get " +
                          ref.repo_id + "` online first");

  const fs::path folder = repo_folder(ctx.cache, ref.repo_id);
  const std::string api =
      ctx.endpoint + "/api/models/" + ref.repo_id + "/revision/" + url_quote(ref.revision, "");
  json info;
  try {
    info = get_json(ctx, ref, api);
  } catch (const Unreachable& e) {
    // Like huggingface_hub: when the hub cannot be reached, a complete cached snapshot will do.
    fs::path cached = from_cache(ref, ctx.cache, std::string("; ") + e.what());
    std::fprintf(stderr, "lmx: the hub is unreachable; using the cached %s\n", cached.c_str());
    return cached;
  }
  check(info.is_object() && info.contains("sha") && info["sha"].is_string(), kWhere,
        "the hub's answer to ", api, " has no commit hash ('sha')");
  const std::string commit = info["sha"].get<std::string>();
  check(is_commit_hash(commit), kWhere, "the hub's commit hash '", commit,
        "' is not 40 hex digits");
  std::vector<std::string> files;
  if (info.contains("siblings") && info["siblings"].is_array())
    for (const auto& s : info["siblings"])
      if (s.is_object() && s.contains("rfilename") && s["rfilename"].is_string() &&
          wanted_file(s["rfilename"].get<std::string>()))
        files.push_back(s["rfilename"].get<std::string>());
  check(!files.empty(), kWhere, "'", ref.repo_id, "' (revision '", ref.revision,
        "') has no model files on the hub (config.json, *.safetensors, tokenizer files)");
  // Small files first: a model's config is known before its weights arrive.
  std::stable_sort(files.begin(), files.end(), [](const std::string& a, const std::string& b) {
    return (a.find(".safetensors") != std::string::npos) <
           (b.find(".safetensors") != std::string::npos);
  });

  fs::path snap = folder / "snapshots" / commit;
  fs::create_directories(folder / "blobs");
  fs::create_directories(snap);
  if (ref.revision != commit) write_atomically(folder / "refs" / ref.revision, commit);

  for (const std::string& file : files) {
    const fs::path pointer = snap / file;
    if (fs::exists(pointer)) continue;  // follows the symlink: its blob is there
    const FileMeta meta = head_file(ctx, ref, commit, file);
    check(meta.commit.empty() || meta.commit == commit, kWhere, "'", file, "' of '", ref.repo_id,
          "' is served at commit ", meta.commit, ", expected ", commit);
    check(meta.etag.find('/') == std::string::npos && meta.etag != "." && meta.etag != "..", kWhere,
          "unusable ETag '", meta.etag, "' for '", file, "'");
    const fs::path blob = folder / "blobs" / meta.etag;
    FileLock lock(ctx.cache / ".locks" / folder.filename() / (meta.etag + ".lock"));
    if (!fs::exists(blob)) {
      const fs::path part = blob.string() + ".incomplete";
      const uint64_t got = fetch_to(ctx, meta.location, part, file, meta.size);
      check(!meta.size || got == *meta.size, part.string(), "downloaded ", got, " bytes, expected ",
            meta.size.value_or(0));
      // The etag is the content's hash: sha256 for LFS files, git's blob sha1 for the others.
      const bool sha256 = is_hex(meta.etag, 64), sha1 = is_hex(meta.etag, 40);
      if (sha256 || sha1) {
        const std::string digest = file_digest(part, sha1);
        if (digest != meta.etag) {
          fs::remove(part);
          fail(kWhere, "'", file, "' of '", ref.repo_id, "' is corrupt: its ",
               sha1 ? "git sha1" : "sha256", " is ", digest, ", expected the etag ", meta.etag,
               " (the partial download was removed; run the command again)");
        }
      }
      fs::rename(part, blob);
    } else {
      check(!meta.size || file_size_or_zero(blob) == *meta.size, blob.string(), "cached blob has ",
            file_size_or_zero(blob), " bytes, expected ", meta.size.value_or(0),
            "; remove it with `lmx rm ", ref.repo_id, "`");
    }
    link_pointer(blob, pointer);
  }
  return snap;
}

fs::path resolve_model(const std::string& ref, const HubOptions& options) {
  if (fs::exists(ref)) return fs::path(ref);  // a directory (or a .gguf file for convert)
  const auto repo = parse_repo_ref(ref);
  // Not a repo id: a path that does not exist, for the loader to report as before.
  if (!repo) return fs::path(ref);
  return download(*repo, options);
}

std::vector<CachedModel> list_cached(const fs::path& cache) {
  std::vector<CachedModel> out;
  if (!fs::is_directory(cache)) return out;
  for (const auto& e : fs::directory_iterator(cache)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || name.rfind("models--", 0) != 0) continue;
    CachedModel m;
    m.folder = e.path();
    m.repo_id = name.substr(8);
    if (const size_t sep = m.repo_id.find("--"); sep != std::string::npos)
      m.repo_id.replace(sep, 2, "/");
    std::error_code ec;
    if (fs::is_directory(m.folder / "blobs"))
      for (const auto& b : fs::directory_iterator(m.folder / "blobs", ec))
        if (b.is_regular_file()) m.size_bytes += b.file_size();
    if (fs::is_directory(m.folder / "refs"))
      for (const auto& r : fs::recursive_directory_iterator(m.folder / "refs", ec))
        if (r.is_regular_file())
          m.refs.push_back(r.path().lexically_relative(m.folder / "refs").string());
    std::sort(m.refs.begin(), m.refs.end());
    if (auto snap = cached_snapshot(m.folder, {m.repo_id, "main"})) {
      m.snapshot = *snap;
    } else if (fs::is_directory(m.folder / "snapshots")) {
      fs::file_time_type newest{};
      for (const auto& s : fs::directory_iterator(m.folder / "snapshots", ec))
        if (s.is_directory() && (m.snapshot.empty() || s.last_write_time() > newest)) {
          m.snapshot = s.path();
          newest = s.last_write_time();
        }
    }
    if (!m.snapshot.empty() && fs::exists(m.snapshot / "config.json")) {
      try {
        const json c = read_json_file(m.snapshot / "config.json");
        if (c.contains("model_type") && c["model_type"].is_string())
          m.model_type = c["model_type"].get<std::string>();
        m.architecture = m.model_type;
        if (c.contains("architectures") && c["architectures"].is_array() &&
            !c["architectures"].empty() && c["architectures"][0].is_string())
          m.architecture = c["architectures"][0].get<std::string>();
        const json* q = c.contains("quantization") ? &c["quantization"] : nullptr;
        if (q && q->is_object()) {
          std::string mode = q->value("mode", std::string("affine"));
          if (mode == "affine") {
            m.quantization = std::to_string(q->value("bits", 0)) + "-bit g" +
                             std::to_string(q->value("group_size", 0));
          } else {
            m.quantization = mode;
          }
        } else if (c.contains("quantization_config") && c["quantization_config"].is_object()) {
          m.quantization = c["quantization_config"].value("quant_method", std::string("quantized"));
        } else {
          const std::string key = c.contains("torch_dtype") ? "torch_dtype" : "dtype";
          if (c.contains(key) && c[key].is_string()) m.quantization = c[key].get<std::string>();
        }
      } catch (const Error&) {
        m.architecture = "(unreadable config.json)";
      }
    }
    out.push_back(std::move(m));
  }
  std::sort(out.begin(), out.end(),
            [](const CachedModel& a, const CachedModel& b) { return a.repo_id < b.repo_id; });
  return out;
}

bool remove_cached(const fs::path& cache, const std::string& repo_id) {
  const fs::path folder = repo_folder(cache, repo_id);
  if (!fs::exists(fs::symlink_status(folder))) return false;
  fs::remove_all(folder);
  std::error_code ec;
  fs::remove_all(cache / ".locks" / folder.filename(), ec);
  return true;
}

}  // namespace lmx::hub
