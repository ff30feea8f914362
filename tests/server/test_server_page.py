#!/usr/bin/env python3
"""`lmx serve` beyond the API: the chat page at / (its files compiled into the binary, served with
their content types, byte-equal to src/server/web) and memory admission (--memory-budget): a
request whose KV cache at prompt + max_tokens cannot fit is answered 400 with type
memory_admission before it starts, and the same server still answers requests that fit. The budget
comes from `lmx fit --json` (its numbers are checked against mlx-lm in tests/cli/test_fit.py).

    LMX_BINARY=build/lmx LMX_TEST_DATA=build/testdata .venv/bin/python tests/server/test_server_page.py
"""
import http.client
import json
import os
import subprocess
import sys
import unittest
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_server import BINARY, MODEL, Server  # noqa: E402

WEB = Path(__file__).resolve().parents[2] / "src" / "server" / "web"


def get(srv, path):
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    conn.request("GET", path)
    r = conn.getresponse()
    body = r.read()
    conn.close()
    return r.status, r.getheader("Content-Type"), body


class ServeSurfaceTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        fit = subprocess.run([BINARY, "fit", "--model", MODEL, "--ctx", "300", "--budget", "1000",
                              "--prefill-step-size", "512", "--json"], capture_output=True, text=True,
                             timeout=60)
        assert fit.returncode == 0, fit.stderr
        cls.fit = json.loads(fit.stdout)
        # Room for one request of up to 300 tokens (and its prefill chunk), not one of 5000.
        cls.budget_gb = cls.fit["total_bytes"] / 1e9
        cls.srv = Server("--memory-budget", f"{cls.budget_gb:.9f}", "--api-key", "sekrit")

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()

    def chat(self, max_tokens, stream=False):
        return self.srv.request("POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Name a color."}], "max_tokens": max_tokens,
            "temperature": 0, "stream": stream}, headers={"Authorization": "Bearer sekrit"})

    def test_page_and_assets_are_the_sources(self):
        for path, name, ctype in (("/", "index.html", "text/html; charset=utf-8"),
                                  ("/assets/chat.js", "chat.js", "text/javascript; charset=utf-8"),
                                  ("/assets/chat.css", "chat.css", "text/css; charset=utf-8")):
            with self.subTest(path=path):
                status, got_type, body = get(self.srv, path)  # no API key needed for the page
                self.assertEqual(status, 200)
                self.assertEqual(got_type, ctype)
                self.assertEqual(body, (WEB / name).read_bytes())
        _, _, page = get(self.srv, "/")
        for needle in (b'<script src="/assets/chat.js">', b'id="model"', b'id="system"',
                       b'id="stop"', b'id="speed"'):
            self.assertIn(needle, page)
        # Only the page's own paths are open without the key.
        status, _, _ = get(self.srv, "/assets/missing.js")
        self.assertEqual(status, 401)
        status, _, _ = get(self.srv, "/v1/models")
        self.assertEqual(status, 401)

    def test_request_that_cannot_fit_gets_400_memory_admission(self):
        for stream in (False, True):
            with self.subTest(stream=stream):
                status, body = self.chat(5000, stream)
                self.assertEqual(status, 400, body)
                err = body["error"]
                self.assertEqual(err["type"], "memory_admission")
                self.assertIn("memory admission", err["message"])
                self.assertIn("max_tokens 5000", err["message"])
                self.assertIn("expected at most the memory budget", err["message"])

    def test_request_that_fits_is_answered(self):
        status, body = self.chat(4)
        self.assertEqual(status, 200, body)
        self.assertEqual(body["usage"]["completion_tokens"], 4)
        self.assertLessEqual(body["usage"]["prompt_tokens"] + 4, 300)

    def test_bad_budget_flag(self):
        p = subprocess.run([BINARY, "serve", "--model", MODEL, "--memory-budget", "-1"],
                           capture_output=True, text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--memory-budget must be > 0 GB, got -1", p.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
