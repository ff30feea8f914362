"""A local stand-in for the Hugging Face hub, on 127.0.0.1 only, for lmx's hub tests.

It speaks the parts of the hub protocol that huggingface_hub (file_download.py, hf_api.py) and
lmx (src/hub/hub.cpp) use:

  GET  /api/models/{repo}[/revision/{rev}]   {"id", "sha", "siblings": [{"rfilename"}], ...}
  GET  /api/models/{repo}/tree/{rev}         [{"type": "file", "path", "size", "oid", "lfs"}]
  HEAD/GET /{repo}/resolve/{rev}/{file}      small files: 200, ETag = git blob sha1;
                                             *.safetensors (LFS): 302 to a second server (the
                                             "CDN", another origin) with X-Linked-Etag = sha256,
                                             X-Linked-Size; X-Repo-Commit on both
  HEAD/GET /cdn/{sha256}                     the CDN: Range requests (206), and a 400 for a request
                                             carrying Authorization (as signed storage URLs do)

A renamed repo (`aliases[old] = new`) answers every request with a 307 to the same path under
the new name (a relative Location on the same origin). Errors carry X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound) as the hub's do.
Faults for the tests: `drop_once[file] = n` sends n bytes of the next GET of that file and closes
the connection; `stall[file] = n` sends n bytes and then waits until `release` is set;
`corrupt_once` holds files whose next GET has one byte flipped. Every
request is logged (method, path, Range, Authorization).

    python hub_server.py --repo org/name=DIR ...   serves until killed, prints its URL
"""

import argparse
import hashlib
import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


def git_blob_sha1(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def is_lfs(name):
    return name.endswith(".safetensors")


class Repo:
    def __init__(self, repo_id, files, tags=("v1",)):
        self.repo_id = repo_id
        self.files = dict(sorted(files.items()))
        listing = "".join(f"{n} {git_blob_sha1(d)}\n" for n, d in self.files.items())
        self.commit = hashlib.sha1(listing.encode()).hexdigest()
        self.revisions = {"main", self.commit, *tags}

    def sha256(self, name):
        return hashlib.sha256(self.files[name]).hexdigest()


class Hub:
    def __init__(self, token=None, tls=None):
        """tls: (certfile, keyfile) to serve https on both servers."""
        self.tls = tls
        self.repos = {}
        self.aliases = {}  # renamed repos: old id -> new id, answered with a 307 as the hub does
        self.token = token
        self.log = []
        self.drop_once = {}
        self.stall = {}
        self.corrupt_once = set()
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.blobs = {}  # sha256 -> bytes, what the CDN serves
        self.hub = self._server(self._hub_handler())
        self.cdn = self._server(self._cdn_handler())

    @property
    def scheme(self):
        return "https" if self.tls else "http"

    @property
    def url(self):
        return "%s://127.0.0.1:%d" % (self.scheme, self.hub.server_address[1])

    @property
    def cdn_url(self):
        return "%s://127.0.0.1:%d" % (self.scheme, self.cdn.server_address[1])

    def add_repo(self, repo_id, files, tags=("v1",)):
        repo = Repo(repo_id, files, tags)
        self.repos[repo_id] = repo
        for name, data in repo.files.items():
            if is_lfs(name):
                self.blobs[repo.sha256(name)] = data
        return repo

    def add_dir(self, repo_id, directory, extra=None):
        files = {p.name: p.read_bytes() for p in sorted(Path(directory).iterdir()) if p.is_file()}
        files.update(extra or {})
        return self.add_repo(repo_id, files)

    def requests(self, server=None):
        with self.lock:
            return [r for r in self.log if server is None or r["server"] == server]

    def clear_log(self):
        with self.lock:
            self.log.clear()

    def close(self):
        self.release.set()
        for s in (self.hub, self.cdn):
            s.shutdown()
            s.server_close()

    # ---- plumbing -------------------------------------------------------------------------

    def _server(self, handler):
        srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        srv.daemon_threads = True
        if self.tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*self.tls)
            srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        return srv

    def _record(self, server, h):
        with self.lock:
            self.log.append(
                {
                    "server": server,
                    "method": h.command,
                    "path": h.path,
                    "range": h.headers.get("Range"),
                    "authorization": h.headers.get("Authorization"),
                }
            )

    def _send_bytes(self, h, data, headers, fault_key=None):
        """200 or 206 (Range: bytes=N- or N-M), HEAD without a body; faults for GETs."""
        start, end, status = 0, len(data), 200
        rng = h.headers.get("Range")
        if rng:
            spec = rng.split("=", 1)[1]
            a, _, b = spec.partition("-")
            start = int(a)
            end = int(b) + 1 if b else len(data)
            if start >= len(data):
                h.send_response(416)
                h.send_header("Content-Range", "bytes */%d" % len(data))
                h.send_header("Content-Length", "0")
                h.end_headers()
                return
            status = 206
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("Content-Length", str(end - start))
        if status == 206:
            h.send_header("Content-Range", "bytes %d-%d/%d" % (start, end - 1, len(data)))
        h.end_headers()
        if h.command == "HEAD":
            return
        body = data[start:end]
        with self.lock:
            drop = self.drop_once.pop(fault_key, None)
            stall = self.stall.pop(fault_key, None)
            corrupt = fault_key in self.corrupt_once
            self.corrupt_once.discard(fault_key)
        if corrupt:
            body = bytes([body[0] ^ 0xFF]) + body[1:]
        if drop is not None:
            h.wfile.write(body[:drop])
            h.wfile.flush()
            h.close_connection = True
            h.connection.shutdown(2)
            return
        if stall is not None:
            h.wfile.write(body[:stall])
            h.wfile.flush()
            self.release.wait(120)
            h.close_connection = True
            return
        h.wfile.write(body)

    def _error(self, h, status, code, message):
        body = json.dumps({"error": message}).encode()
        h.send_response(status)
        if code:
            h.send_header("X-Error-Code", code)
        h.send_header("X-Error-Message", message)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(body)

    def _json(self, h, obj):
        body = json.dumps(obj).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _find_repo(self, h, parts):
        """(repo, rest of the path) for /org/name/..., or None after answering the error."""
        if len(parts) < 2:
            self._error(h, 404, "RepoNotFound", "Repository not found")
            return None, None
        if self.token is not None and h.headers.get("Authorization") != "Bearer " + self.token:
            # What the hub answers for a private repo without a valid token.
            self._error(h, 401, "RepoNotFound", "Invalid username or password.")
            return None, None
        repo = self.repos.get(parts[0] + "/" + parts[1])
        if repo is None:
            self._error(h, 404, "RepoNotFound", "Repository not found")
            return None, None
        return repo, parts[2:]

    def _api(self, h, parts):
        repo, rest = self._find_repo(h, parts)
        if repo is None:
            return
        rev = "main"
        kind = "info"
        if rest and rest[0] in ("revision", "tree"):
            kind = rest[0]
            rev = "/".join(rest[1:]) if len(rest) > 1 else "main"
        if rev not in repo.revisions:
            self._error(h, 404, "RevisionNotFound", "Invalid rev id: " + rev)
            return
        if kind == "tree":
            entries = []
            for name, data in repo.files.items():
                e = {"type": "file", "path": name, "size": len(data), "oid": git_blob_sha1(data)}
                if is_lfs(name):
                    e["lfs"] = {"oid": repo.sha256(name), "size": len(data), "pointerSize": 134}
                entries.append(e)
            self._json(h, entries)
            return
        self._json(
            h,
            {
                "_id": "0" * 24,
                "id": repo.repo_id,
                "modelId": repo.repo_id,
                "sha": repo.commit,
                "private": self.token is not None,
                "disabled": False,
                "gated": False,
                "tags": [],
                "siblings": [{"rfilename": n} for n in repo.files],
            },
        )

    def _resolve(self, h, parts):
        repo, rest = self._find_repo(h, parts)
        if repo is None:
            return
        if len(rest) < 3 or rest[0] != "resolve":
            self._error(h, 404, None, "Not found")
            return
        rev, name = rest[1], "/".join(rest[2:])
        if rev not in repo.revisions:
            self._error(h, 404, "RevisionNotFound", "Invalid rev id: " + rev)
            return
        if name not in repo.files:
            h.send_response(404)
            h.send_header("X-Error-Code", "EntryNotFound")
            h.send_header("X-Repo-Commit", repo.commit)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        data = repo.files[name]
        if is_lfs(name):
            sha = repo.sha256(name)
            h.send_response(302)
            h.send_header("Location", "%s/cdn/%s?X-Amz-Signature=test" % (self.cdn_url, sha))
            h.send_header("X-Repo-Commit", repo.commit)
            h.send_header("X-Linked-Etag", '"%s"' % sha)
            h.send_header("X-Linked-Size", str(len(data)))
            h.send_header("ETag", '"%s"' % git_blob_sha1(b"pointer " + sha.encode()))
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        self._send_bytes(
            h,
            data,
            {"ETag": '"%s"' % git_blob_sha1(data), "X-Repo-Commit": repo.commit},
            fault_key=name,
        )

    def _hub_handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _route(self):
                hub._record("hub", self)
                path = unquote(urlsplit(self.path).path)
                parts = [p for p in path.split("/") if p]
                at = 2 if parts[:2] == ["api", "models"] else 0
                new = hub.aliases.get("/".join(parts[at:at + 2]))
                if new is not None:
                    self.send_response(307)
                    self.send_header("Location", "/" + "/".join(parts[:at] + [new] + parts[at + 2:]))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if parts[:2] == ["api", "models"]:
                    hub._api(self, parts[2:])
                else:
                    hub._resolve(self, parts)

            do_GET = _route
            do_HEAD = _route

        return Handler

    def _cdn_handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _route(self):
                hub._record("cdn", self)
                parts = [p for p in urlsplit(self.path).path.split("/") if p]
                if self.headers.get("Authorization"):
                    hub._error(self, 400, None, "Only one auth mechanism allowed")
                    return
                if len(parts) != 2 or parts[0] != "cdn" or parts[1] not in hub.blobs:
                    hub._error(self, 404, None, "NoSuchKey")
                    return
                sha = parts[1]
                name = next(
                    n for r in hub.repos.values() for n in r.files if is_lfs(n) and r.sha256(n) == sha
                )
                hub._send_bytes(self, hub.blobs[sha], {"ETag": '"%s"' % sha}, fault_key=name)

            do_GET = _route
            do_HEAD = _route

        return Handler


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repo", action="append", default=[], help="org/name=DIR")
    ap.add_argument("--token", help="require 'Authorization: Bearer TOKEN' on the hub")
    args = ap.parse_args()
    hub = Hub(token=args.token)
    for spec in args.repo:
        repo_id, directory = spec.split("=", 1)
        r = hub.add_dir(repo_id, directory)
        print(f"{repo_id} at {r.commit}", flush=True)
    print(f"HF_ENDPOINT={hub.url}", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
