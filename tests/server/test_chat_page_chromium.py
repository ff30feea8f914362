#!/usr/bin/env python3
"""The chat page in a real browser: headless Chromium (Debian's package), driven over the DevTools
protocol on a pipe (--remote-debugging-pipe, no extra Python package), loads `lmx serve`'s page,
types a message and presses Enter; the streamed answer must be the server's own greedy answer to
the same conversation (a plain non-streamed request), and the page must show tokens per second.
Then the stop button ends a long answer, a system prompt reaches the model, and the page's markdown
renderer turns a sample into the expected HTML (escaping what is not markdown).

Without chromium on PATH it prints SKIPPED and exits 77 (ctest reports the test as skipped).
LMX_CHAT_SCREENSHOT=path.png saves a screenshot of the answered page.

    LMX_BINARY=build/lmx LMX_TEST_DATA=build/testdata .venv/bin/python tests/server/test_chat_page_chromium.py
"""
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_server import Server  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

MARKDOWN = ("# Title\n\nSome **bold** and *it* and `a<b>`.\n\n```python\nprint('<x>')\n```\n\n"
            "- one\n- two\n\n1. first\n2. second\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n> quote\n\n"
            "[link](https://example.com) <script>alert(1)</script>\n\n```js\nlet open = 1")
MARKDOWN_HTML = (
    "<h1>Title</h1><p>Some <strong>bold</strong> and <em>it</em> and <code>a&lt;b&gt;</code>.</p>"
    "<pre><span class=\"lang\">python</span><code>print(&#39;&lt;x&gt;&#39;)</code></pre>"
    "<ul><li>one</li><li>two</li></ul><ol><li>first</li><li>second</li></ol>"
    "<table><thead><tr><th>a</th><th>b</th></tr></thead><tbody><tr><td>1</td><td>2</td></tr>"
    "</tbody></table><blockquote><p>quote</p></blockquote>"
    "<p><a href=\"https://example.com\" target=\"_blank\" rel=\"noopener noreferrer\">link</a> "
    "&lt;script&gt;alert(1)&lt;/script&gt;</p>"
    "<pre><span class=\"lang\">js</span><code>let open = 1</code></pre>")


class Browser:
    """Chromium with the DevTools protocol on fds 3 (commands in) and 4 (replies out)."""

    def __init__(self):
        self.profile = tempfile.mkdtemp(prefix="lmx_chromium_")
        cmd_r, self.cmd_w = os.pipe()
        self.out_r, out_w = os.pipe()
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--no-first-run", "--no-default-browser-check", "--window-size=1100,760",
                 f"--user-data-dir={self.profile}", "--remote-debugging-pipe", "about:blank"]
        self.proc = subprocess.Popen(
            ["bash", "-c", f'exec "$0" "$@" 3<&{cmd_r} 4>&{out_w}', CHROMIUM, *flags],
            pass_fds=(cmd_r, out_w), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(cmd_r)
        os.close(out_w)
        self.buf = b""
        self.next_id = 0
        self.session = None

    def call(self, method, timeout=60, **params):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params}
        if self.session and not method.startswith("Target."):
            msg["sessionId"] = self.session
        os.write(self.cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.time() + timeout
        while time.time() < deadline:
            while b"\0" not in self.buf:
                chunk = os.read(self.out_r, 1 << 16)
                if not chunk:
                    raise RuntimeError("chromium closed the DevTools pipe")
                self.buf += chunk
            raw, self.buf = self.buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
        raise TimeoutError(method)

    def open(self, url):
        target = self.call("Target.createTarget", url=url)["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]

    def js(self, expression):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait_for(self, expression, timeout=180):
        deadline = time.time() + timeout
        while time.time() < deadline:
            # The page may still be loading: an error there counts as not yet.
            value = self.js(f"(() => {{ try {{ return {expression}; }} catch (e) {{ return null; }} }})()")
            if value:
                return value
            time.sleep(0.2)
        raise TimeoutError(f"waited {timeout} s for {expression}")

    def type_and_enter(self, text):
        self.js("document.getElementById('input').focus()")
        self.call("Input.insertText", text=text)
        for kind in ("keyDown", "keyUp"):
            self.call("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter",
                      windowsVirtualKeyCode=13, nativeVirtualKeyCode=13)

    def close(self):
        try:
            self.call("Browser.close", timeout=10)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.cmd_w)
        os.close(self.out_r)
        shutil.rmtree(self.profile, ignore_errors=True)


LAST = "document.querySelector('.msg.assistant:last-of-type')"


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok:", what)


def main():
    if not CHROMIUM:
        print("SKIPPED: chromium not found on PATH; the chat page was not tested in a browser "
              "(apt-get install chromium)")
        return 77
    srv = Server()
    browser = Browser()
    try:
        browser.open(srv.url + "/")
        models = browser.wait_for("document.getElementById('model').options.length", 60)
        check(models >= 1, f"the model picker lists /v1/models ({models})")
        browser.js("document.getElementById('temperature').value = '0';"
                   "document.getElementById('max_tokens').value = '8'")

        # 1. Typed message, streamed answer = the server's greedy answer to the same messages.
        question = "What is the capital of France?"
        browser.type_and_enter(question)
        browser.wait_for(f"{LAST} && {LAST}.dataset.state === 'done'")
        got = browser.js(f"{LAST}.querySelector('.body').dataset.raw")
        status, want = srv.request("POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": question}], "temperature": 0, "max_tokens": 8})
        assert status == 200, want
        want_text = want["choices"][0]["message"]["content"]
        check(got == want_text, f"streamed answer {got!r} == server's answer {want_text!r}")
        shown = browser.js(f"{LAST}.querySelector('.body').innerText")
        check(shown.strip() != "" and shown.split()[0] in want_text, f"the answer is shown ({shown!r})")
        speed = browser.js("document.getElementById('speed').textContent")
        check(speed.endswith("tokens/s") and float(speed.split()[0]) > 0, f"tokens per second ({speed})")
        if os.environ.get("LMX_CHAT_SCREENSHOT"):
            png = base64.b64decode(browser.call("Page.captureScreenshot", format="png")["data"])
            with open(os.environ["LMX_CHAT_SCREENSHOT"], "wb") as f:
                f.write(png)
            print("screenshot:", os.environ["LMX_CHAT_SCREENSHOT"])

        # 2. The stop button ends a long answer mid-stream.
        browser.js("document.getElementById('clear').click();"
                   "document.getElementById('max_tokens').value = '400'")
        browser.type_and_enter("Write a long story about a dragon.")
        browser.wait_for(f"{LAST} && ({LAST}.querySelector('.body').dataset.raw || '').length > 0")
        browser.js("document.getElementById('stop').click()")
        state = browser.wait_for(f"{LAST}.dataset.state !== 'streaming' && {LAST}.dataset.state", 60)
        check(state == "stopped", f"stop ends the answer (state {state})")
        check(browser.js("document.getElementById('send').disabled") is False, "send is enabled again")

        # 3. A system prompt is sent first: the answer equals the server's to the same messages.
        system = "You are a pirate. Answer in one short sentence."
        browser.js("document.getElementById('clear').click();"
                   "document.getElementById('max_tokens').value = '8';"
                   f"document.getElementById('system').value = {json.dumps(system)}")
        browser.type_and_enter("Hello")
        browser.wait_for(f"{LAST} && {LAST}.dataset.state === 'done'")
        got = browser.js(f"{LAST}.querySelector('.body').dataset.raw")
        status, want = srv.request("POST", "/v1/chat/completions", {
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Hello"}],
            "temperature": 0, "max_tokens": 8})
        check(got == want["choices"][0]["message"]["content"], f"system prompt used ({got!r})")

        # 4. The markdown renderer, in the browser.
        html = browser.js(f"window.lmxRenderMarkdown({json.dumps(MARKDOWN)})")
        check(html == MARKDOWN_HTML, "markdown renders to the expected HTML" +
              ("" if html == MARKDOWN_HTML else f": got\n{html}\nexpected\n{MARKDOWN_HTML}"))
    finally:
        browser.close()
        srv.stop()
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
