#!/usr/bin/env python3
"""Server soak (issue 26): many concurrent clients against one loopback `lmx serve`, mixing every
endpoint, streaming, cancellation mid-stream, malformed and oversize bodies.

    .venv/bin/python bench/soak.py --model DIR [--clients 64] [--requests 2000] [--json OUT]

Each client sends --requests requests, cycling through the mix below from its own offset. What
counts as expected:
- a valid request: 200 with a JSON body (or an SSE stream ending in its terminator), or 429 with a
  JSON body while the queue is past --max-queue;
- a cancelled stream: the client reads its first event and closes the socket (nothing to check but
  that the server lives on);
- a malformed request (bad JSON, wrong types, unknown route, oversize body): a 4xx with a JSON
  error body.
Anything else (a 5xx, a 4xx for a valid request, a body that is not JSON, a refused or reset
connection, a stream without its terminator, the server exiting) is an unexpected error. The
server's RSS (/proc/PID/status VmRSS) is sampled every second: the report gives it after the
warm-up (the first 10% of the requests) and at the end. Exit status 1 on any unexpected error or
a server that did not live to the end.
"""
import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

MAX_BODY = 1 << 20  # --max-body-bytes of the soaked server: the oversize body is 1.5x this


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kb(pid):
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


class Mix:
    """The request kinds: (name, method, path, body bytes, kind) with kind one of valid, stream,
    cancel, bad, oversize."""

    def __init__(self, model, max_tokens):
        chat = {"model": model, "max_tokens": max_tokens, "temperature": 0.7, "seed": 1,
                "messages": [{"role": "user", "content": "Tell me about the sea."}]}
        j = lambda o: json.dumps(o).encode()  # noqa: E731
        self.kinds = [
            ("chat", "POST", "/v1/chat/completions", j(chat), "valid"),
            ("chat_stream", "POST", "/v1/chat/completions", j({**chat, "stream": True}), "stream"),
            ("chat_cancel", "POST", "/v1/chat/completions",
             j({**chat, "stream": True, "max_tokens": 64}), "cancel"),
            ("completion", "POST", "/v1/completions",
             j({"model": model, "prompt": "Once upon a time", "max_tokens": max_tokens,
                "logprobs": 2}), "valid"),
            ("completion_stream", "POST", "/v1/completions",
             j({"model": model, "prompt": "The sky", "max_tokens": max_tokens, "stream": True}),
             "stream"),
            ("messages", "POST", "/v1/messages",
             j({"model": model, "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": "Hi"}]}), "valid"),
            ("messages_stream", "POST", "/v1/messages",
             j({"model": model, "max_tokens": max_tokens, "stream": True,
                "messages": [{"role": "user", "content": "Hi"}]}), "stream"),
            ("responses", "POST", "/v1/responses",
             j({"model": model, "input": "Say hi", "max_output_tokens": max_tokens,
                "store": False}), "valid"),
            ("json_schema", "POST", "/v1/chat/completions",
             j({**chat, "max_tokens": 16, "response_format": {
                 "type": "json_schema", "json_schema": {"name": "x", "schema": {
                     "type": "object", "properties": {"a": {"type": "integer"}},
                     "required": ["a"]}}}}), "valid"),
            ("stop", "POST", "/v1/chat/completions", j({**chat, "stop": ["e", "a"]}), "valid"),
            ("count_tokens", "POST", "/v1/messages/count_tokens",
             j({"model": model, "messages": [{"role": "user", "content": "Hi there"}]}), "valid"),
            ("models", "GET", "/v1/models", None, "valid"),
            ("health", "GET", "/health", None, "valid"),
            ("metrics", "GET", "/metrics", None, "text"),
            ("bad_json", "POST", "/v1/chat/completions", b'{"model": "x", "messages": [', "bad"),
            ("bad_type", "POST", "/v1/chat/completions",
             j({**chat, "max_tokens": "many"}), "bad"),
            ("bad_messages", "POST", "/v1/chat/completions",
             j({"model": model, "messages": "hello"}), "bad"),
            ("bad_temperature", "POST", "/v1/completions",
             j({"model": model, "prompt": "x", "temperature": -1}), "bad"),
            ("bad_route", "POST", "/v1/nothing", j({}), "bad"),
            ("bad_schema", "POST", "/v1/chat/completions",
             j({**chat, "response_format": {"type": "json_schema",
                                            "json_schema": {"schema": {"type": 7}}}}), "bad"),
            ("oversize", "POST", "/v1/chat/completions", b"{" + b" " * (MAX_BODY * 3 // 2) + b"}",
             "oversize"),
        ]


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.by_kind = {}
        self.unexpected = []
        self.done = 0

    def add(self, name, outcome, detail=None):
        with self.lock:
            self.by_kind.setdefault(name, {}).setdefault(outcome, 0)
            self.by_kind[name][outcome] += 1
            self.done += 1
            if detail is not None and len(self.unexpected) < 200:
                self.unexpected.append(f"{name}: {detail}")


def is_json(raw):
    try:
        json.loads(raw)
        return True
    except ValueError:
        return False


def one(port, req, timeout):
    """Sends one request; returns (outcome, detail): detail is None when the outcome was
    expected."""
    name, method, path, body, kind = req
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        if kind == "cancel":
            if r.status == 200:
                r.fp.readline()  # the first event's line: then close mid-stream
                return "cancelled", None
            raw = r.read()
            return ("429", None) if r.status == 429 and is_json(raw) else \
                (str(r.status), f"status {r.status}: {raw[:200]!r}")
        raw = r.read()
        if kind in ("valid", "stream", "text"):
            if r.status == 429 and is_json(raw):
                return "429", None
            if r.status != 200:
                return str(r.status), f"status {r.status}: {raw[:200]!r}"
            if kind == "valid" and not is_json(raw):
                return "not_json", f"200 body is not JSON: {raw[:200]!r}"
            if kind == "stream":
                text = raw.decode(errors="replace")
                ended = "data: [DONE]" in text or "event: message_stop" in text
                if not ended:
                    return "unterminated", f"stream without its terminator: {text[-200:]!r}"
            return "ok", None
        expected = range(400, 500)
        if r.status in expected and is_json(raw):
            return f"{r.status}", None
        return str(r.status), f"expected a 4xx with a JSON body, got {r.status}: {raw[:200]!r}"
    except (OSError, http.client.HTTPException) as e:
        if kind == "oversize" and isinstance(e, (BrokenPipeError, ConnectionResetError)):
            # The server may answer 413 and close before the whole body is sent; the answer
            # itself is then lost to the client. Counted apart, not as an error.
            return "reset_during_upload", None
        return "connection", f"{type(e).__name__}: {e}"
    finally:
        conn.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--binary", default=os.environ.get("LMX_BINARY", "build/lmx"))
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=2000, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--max-queue", type=int, default=256)
    ap.add_argument("--timeout", type=float, default=600, help="seconds a request may take")
    ap.add_argument("--server-flag", action="append", default=[],
                    help="extra flag for lmx serve (repeatable), e.g. --server-flag=--exact")
    ap.add_argument("--chat-template", help="lmx serve --chat-template (for a model without one)")
    ap.add_argument("--json", help="write the report here as JSON")
    a = ap.parse_args()

    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="soak-server-", suffix=".log", delete=False)
    cmd = [a.binary, "serve", "--model", a.model, "--port", str(port), "--max-queue",
           str(a.max_queue), "--max-body-bytes", str(MAX_BODY), *a.server_flag]
    if a.chat_template:
        cmd += ["--chat-template", a.chat_template]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.time() + 120
    while True:
        if proc.poll() is not None:
            sys.exit(f"soak: lmx serve exited ({proc.returncode}); log {log.name}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                break
        except OSError:
            pass
        if time.time() > deadline:
            proc.kill()
            sys.exit("soak: lmx serve did not come up")
        time.sleep(0.2)
    model_id = None
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/v1/models")
    model_id = json.loads(c.getresponse().read())["data"][0]["id"]

    mix = Mix(model_id, a.max_tokens).kinds
    tally = Tally()
    total = a.clients * a.requests
    samples = []  # (seconds, requests done, RSS KiB)
    stop = threading.Event()

    def sampler():
        t0 = time.time()
        while not stop.is_set():
            samples.append((round(time.time() - t0, 1), tally.done, rss_kb(proc.pid)))
            stop.wait(1.0)

    def client(i):
        for k in range(a.requests):
            if proc.poll() is not None:
                tally.add("server", "exited", f"lmx serve exited ({proc.returncode})")
                return
            req = mix[(i + k) % len(mix)]
            outcome, detail = one(port, req, a.timeout)
            tally.add(req[0], outcome, detail)

    t0 = time.time()
    threading.Thread(target=sampler, daemon=True).start()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.time() - t0
    alive = proc.poll() is None
    final_rss = rss_kb(proc.pid)
    stop.set()
    samples.append((round(wall, 1), tally.done, final_rss))
    if alive:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            alive = False
            tally.unexpected.append("server: did not exit within 60 s of SIGTERM")

    warm = next((s for s in samples if s[1] >= total // 10 and s[2]), samples[0])
    rss_series = [s[2] for s in samples if s[2]]
    report = {
        "clients": a.clients, "requests_per_client": a.requests, "requests": tally.done,
        "wall_s": round(wall, 1), "requests_per_s": round(tally.done / wall, 1),
        "unexpected": len(tally.unexpected) if alive else len(tally.unexpected) + 1,
        "server_alive": alive, "server_exit": proc.returncode,
        "rss_mb_after_warmup": round(warm[2] / 1024, 1) if warm[2] else None,
        "rss_mb_end": round(final_rss / 1024, 1) if final_rss else None,
        "rss_mb_max": round(max(rss_series) / 1024, 1) if rss_series else None,
        "by_kind": tally.by_kind, "first_unexpected": tally.unexpected[:20],
        "rss_curve": samples[:: max(1, len(samples) // 40)], "server_log": log.name,
        "command": cmd,
    }
    print(json.dumps({k: v for k, v in report.items() if k != "rss_curve"}, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
    sys.exit(0 if alive and not tally.unexpected else 1)


if __name__ == "__main__":
    main()
