#!/usr/bin/env python3
"""Model references from the Hugging Face hub, end to end and without the internet: a local hub
(tests/tools/hub_server.py, 127.0.0.1 only) serves a tiny random llama made here with mlx-lm, and

  - the real huggingface_hub client (HF_ENDPOINT at that server) fills a cache that lmx then
    generates from offline, with the same output as from the model's directory;
  - what `lmx get` downloads is what huggingface_hub.snapshot_download(local_files_only=True)
    returns (same layout: refs/, blobs/ named by etag, relative snapshot symlinks), byte-equal
    to the source, only the files a model needs, the token never sent to the CDN;
  - a connection dropped mid-file resumes with Range in the same run; a killed download leaves
    no file under snapshots/ and resumes from its .incomplete blob next time;
  - errors: not found on the hub, unknown revision, not in the cache offline (no request made),
    a disk-full write naming the path;
  - lmx ls (architecture, quantization, supported) and lmx rm.

    LMX_BINARY=build/lmx .venv/bin/python tests/hub/test_hub.py
"""
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from hub_server import Hub, git_blob_sha1  # noqa: E402

LMX = os.environ.get("LMX_BINARY", "build/lmx")
PY = sys.executable
REPO = "lmx-test/tiny-llama"
REPO_4BIT = "lmx-test/tiny-llama-4bit"
PROMPT = "hello hub"
# Files a hub repo has that a model does not need: lmx must not download them.
EXTRA = {"README.md": b"# tiny\n", ".gitattributes": b"*.safetensors filter=lfs\n",
         "pytorch_model.bin": b"\0" * 1000}


def make_tiny_model(out, bits=None):
    """A random llama (float32, or quantized as mlx_lm.convert -q does) with a byte-level BPE
    tokenizer of its 256 tokens."""
    import mlx.core as mx
    from mlx_lm.models import llama
    from mlx_lm.utils import quantize_model, save_config, save_model
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    config = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=64,
                  num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=256,
                  max_position_embeddings=128, rope_theta=10000.0, tie_word_embeddings=True,
                  torch_dtype="float32")
    mx.random.seed(7)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    if bits:
        model, config = quantize_model(model, config, 64, bits)
    mx.eval(model.parameters())
    out.mkdir(parents=True)
    save_model(out, model)
    save_config(config, out / "config.json")
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast"}\n')


class HubTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = Path(tempfile.mkdtemp(prefix="lmx-hub-test-"))
        cls.model = cls.tmp / "model"
        cls.model4 = cls.tmp / "model4"
        make_tiny_model(cls.model)
        make_tiny_model(cls.model4, bits=4)
        cls.weights = (cls.model / "model.safetensors").read_bytes()
        cls.baseline = cls.generate_from(str(cls.model), {})

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        self.hub = Hub()
        self.repo = self.hub.add_dir(REPO, self.model, EXTRA)
        self.hub.add_dir(REPO_4BIT, self.model4)
        self.cache = Path(tempfile.mkdtemp(prefix="cache-", dir=self.tmp))
        self.folder = self.cache / ("models--" + REPO.replace("/", "--"))

    def tearDown(self):
        self.hub.close()

    # ---- helpers ------------------------------------------------------------------------

    def env(self, **extra):
        e = {k: v for k, v in os.environ.items()
             if not k.startswith(("HF_", "HUGGINGFACE_")) and k != "TRANSFORMERS_OFFLINE"}
        e.update(HF_ENDPOINT=self.hub.url, HF_HUB_CACHE=str(self.cache),
                 HF_HOME=str(self.tmp / "hf-home"), HF_HUB_DISABLE_TELEMETRY="1",
                 HF_HUB_DISABLE_XET="1")
        e.update(extra)
        return e

    def lmx(self, *args, env=None, ok=True):
        p = subprocess.run([LMX, *args], capture_output=True, env=env or self.env(), timeout=120)
        if ok:
            self.assertEqual(p.returncode, 0, p.stderr.decode(errors="replace"))
        else:
            self.assertNotEqual(p.returncode, 0, p.stdout.decode(errors="replace"))
        return p

    @classmethod
    def generate_from(cls, model, env):
        p = subprocess.run([LMX, "generate", "--model", model, "--prompt", PROMPT, "--max-tokens",
                            "12", "--exact"], capture_output=True, env=env or None, timeout=120)
        assert p.returncode == 0, p.stderr.decode(errors="replace")
        return p.stdout

    def hf(self, code, *args, env=None):
        p = subprocess.run([PY, "-c", code, *args], capture_output=True, env=env or self.env(),
                           timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr.decode(errors="replace"))
        return p.stdout.decode().strip()

    def snapshot(self):
        return self.folder / "snapshots" / self.repo.commit

    def check_lmx_layout(self, revision="main"):
        snap = self.snapshot()
        self.assertEqual((self.folder / "refs" / revision).read_text(), self.repo.commit)
        names = sorted(p.name for p in snap.iterdir())
        self.assertEqual(names, sorted(n for n in self.repo.files if n not in EXTRA))
        for name in names:
            link = snap / name
            self.assertTrue(link.is_symlink(), name)
            target = os.readlink(link)
            self.assertFalse(os.path.isabs(target), target)
            data = self.repo.files[name]
            etag = self.repo.sha256(name) if name.endswith(".safetensors") else git_blob_sha1(data)
            self.assertEqual(target, "../../blobs/" + etag)
            self.assertEqual(link.read_bytes(), data, name)
        self.assertEqual(list(self.folder.glob("blobs/*.incomplete")), [])

    # ---- both ways ----------------------------------------------------------------------

    def test_hf_client_fills_cache_lmx_reads_offline(self):
        got = self.hf("import sys\nfrom huggingface_hub import snapshot_download\n"
                      "print(snapshot_download(sys.argv[1]))", REPO)
        self.assertEqual(Path(got), self.snapshot())
        self.hub.clear_log()
        # --offline, HF_HUB_OFFLINE=1, and a pinned commit: no request reaches the hub.
        out = self.lmx("generate", "--model", REPO, "--offline", "--prompt", PROMPT,
                       "--max-tokens", "12", "--exact").stdout
        self.assertEqual(out, self.baseline)
        out = self.generate_from(REPO + "@" + self.repo.commit, self.env(HF_HUB_OFFLINE="1"))
        self.assertEqual(out, self.baseline)
        self.assertEqual(self.hub.requests(), [])
        # Online, the complete cached snapshot is used after one API call: nothing downloaded.
        self.assertEqual(self.generate_from(REPO, self.env()), self.baseline)
        self.assertEqual([r["path"] for r in self.hub.requests()],
                         [f"/api/models/{REPO}/revision/main"])

    def test_lmx_download_read_by_hf(self):
        # A private repo: the hub wants the token, the CDN must not get it.
        self.hub.token = "hf_secret"
        env = self.env(HF_TOKEN="hf_secret")
        p = self.lmx("get", REPO, env=env)
        self.assertEqual(Path(p.stdout.decode().strip()), self.snapshot())
        self.assertIn(b"model.safetensors", p.stderr)  # the progress lines
        self.check_lmx_layout()
        reqs = self.hub.requests()
        self.assertTrue(all(r["authorization"] == "Bearer hf_secret"
                            for r in reqs if r["server"] == "hub"), reqs)
        cdn = [r for r in reqs if r["server"] == "cdn"]
        self.assertEqual([(r["method"], r["authorization"]) for r in cdn], [("GET", None)])
        fetched = {r["path"].split("/")[-1] for r in reqs if "/resolve/" in r["path"]}
        self.assertEqual(fetched & set(EXTRA), set())
        code = ("import sys\nfrom huggingface_hub import snapshot_download, hf_hub_download\n"
                "print(snapshot_download(sys.argv[1], local_files_only=True))\n"
                "print(hf_hub_download(sys.argv[1], 'model.safetensors', local_files_only=True))")
        snap, weights = self.hf(code, REPO, env=env).splitlines()
        self.assertEqual(Path(snap), self.snapshot())
        self.assertEqual(Path(weights).read_bytes(), self.weights)
        # A tag: refs/v1 written, nothing downloaded again.
        self.hub.clear_log()
        self.lmx("get", REPO + "@v1", env=env)
        self.check_lmx_layout("v1")
        self.assertEqual([r for r in self.hub.requests() if "/resolve/" in r["path"]], [])
        self.assertEqual(self.generate_from(REPO, self.env(HF_HUB_OFFLINE="1")), self.baseline)
        # huggingface_hub's cache scanner finds nothing malformed and both refs.
        code = ("import json\nfrom huggingface_hub import scan_cache_dir\ni = scan_cache_dir()\n"
                "print(json.dumps([[str(w) for w in i.warnings], [[r.repo_id, r.size_on_disk, "
                "[sorted(v.refs) for v in r.revisions]] for r in i.repos]]))")
        warnings, repos = json.loads(self.hf(code, env=env))
        self.assertEqual(warnings, [])
        size = sum(p.stat().st_size for p in (self.folder / "blobs").iterdir())
        self.assertEqual(repos, [[REPO, size, [["main", "v1"]]]])
        # Without the token the private repo is not found.
        p = self.lmx("get", REPO, ok=False)
        self.assertIn(b"not found on the hub", p.stderr)

    def test_https_checks_the_certificate(self):
        # The hub and the CDN over TLS with a certificate for 127.0.0.1 that only SSL_CERT_FILE
        # makes trusted: lmx must verify it (and fail without it).
        cert, key = self.tmp / "cert.pem", self.tmp / "key.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                        "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                        "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
        self.hub.close()
        self.hub = Hub(tls=(str(cert), str(key)))
        self.repo = self.hub.add_dir(REPO, self.model, EXTRA)
        p = self.lmx("get", REPO, ok=False)
        self.assertIn(b"cannot reach the hub at https://127.0.0.1", p.stderr)
        self.assertEqual(self.hub.requests(), [])  # the TLS handshake failed: no request
        self.lmx("get", REPO, env=self.env(SSL_CERT_FILE=str(cert)))
        self.check_lmx_layout()
        self.assertEqual(len(self.hub.requests("cdn")), 1)

    def test_renamed_repo_follows_the_hubs_redirects(self):
        self.hub.aliases["old-org/tiny"] = REPO
        self.folder = self.cache / "models--old-org--tiny"  # stored under the name asked for
        self.lmx("get", "old-org/tiny")
        self.check_lmx_layout()
        redirected = [r["path"] for r in self.hub.requests("hub") if "old-org" in r["path"]]
        self.assertEqual(len(redirected), 1 + len(self.repo.files) - len(EXTRA))  # API + HEADs

    def test_generate_downloads_on_first_use(self):
        self.assertEqual(self.generate_from(REPO, self.env()), self.baseline)
        self.check_lmx_layout()

    def test_serve_answers_to_the_repo_id(self):
        # lmx serve --model org/name: the model's id is the repo id, not the snapshot path.
        import http.client
        import socket
        import time
        self.lmx("get", REPO, "--quiet")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = subprocess.Popen([LMX, "serve", "--model", REPO, "--offline", "--port", str(port),
                                 "--exact"], env=self.env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            def ask(path, body=None):
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                c.request("POST" if body else "GET", path,
                          json.dumps(body) if body else None, {"Content-Type": "application/json"})
                r = c.getresponse()
                return r.status, json.loads(r.read())
            for _ in range(300):
                try:
                    if ask("/health")[0] == 200:
                        break
                except OSError:
                    time.sleep(0.1)
            status, models = ask("/v1/models")
            self.assertEqual([m["id"] for m in models["data"]], [REPO])
            status, out = ask("/v1/completions", {"model": REPO, "prompt": PROMPT, "max_tokens": 2})
            self.assertEqual(status, 200, out)
            status, out = ask("/v1/completions", {"model": "other/name", "prompt": PROMPT})
            self.assertEqual(status, 404, out)
        finally:
            proc.terminate()
            proc.wait(timeout=30)

    # ---- interrupted downloads ----------------------------------------------------------

    def test_dropped_connection_resumes_with_range(self):
        half = len(self.weights) // 2
        self.hub.drop_once["model.safetensors"] = half
        p = self.lmx("get", REPO)
        self.assertIn(b"resuming", p.stderr)
        self.check_lmx_layout()
        ranges = [r["range"] for r in self.hub.requests("cdn")]
        self.assertEqual(len(ranges), 2, ranges)
        self.assertIsNone(ranges[0])
        start = int(ranges[1].split("=")[1].rstrip("-"))
        self.assertTrue(0 < start <= half, ranges)

    def test_killed_download_resumes_next_time(self):
        half = len(self.weights) // 2
        self.hub.stall["model.safetensors"] = half
        proc = subprocess.Popen([LMX, "get", REPO], env=self.env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        part = self.folder / "blobs" / (self.repo.sha256("model.safetensors") + ".incomplete")
        deadline = time.monotonic() + 60
        while not (part.exists() and part.stat().st_size == half):
            self.assertIsNone(proc.poll(), proc.stderr.read() if proc.poll() is not None else "")
            self.assertLess(time.monotonic(), deadline, "the partial blob never reached half")
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        self.hub.release.set()
        self.assertTrue((self.snapshot() / "config.json").exists())
        self.assertFalse(os.path.lexists(self.snapshot() / "model.safetensors"))
        p = self.lmx("generate", "--model", REPO, "--offline", "--prompt", PROMPT, ok=False)
        self.assertIn(b"incomplete in the cache", p.stderr)
        self.hub.clear_log()
        self.lmx("get", REPO)
        self.assertEqual([r["range"] for r in self.hub.requests("cdn")], [f"bytes={half}-"])
        self.check_lmx_layout()
        self.assertEqual(self.generate_from(REPO, self.env(HF_HUB_OFFLINE="1")), self.baseline)

    def test_waits_for_another_download_of_the_blob(self):
        # Another process (lmx or huggingface_hub) holds the blob's lock in .locks/ and finishes
        # the blob: lmx waits for the lock, then links that blob instead of downloading it.
        sha = self.repo.sha256("model.safetensors")
        lock = self.cache / ".locks" / self.folder.name / (sha + ".lock")
        lock.parent.mkdir(parents=True)
        with open(lock, "w") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            proc = subprocess.Popen([LMX, "get", REPO], env=self.env(), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE)
            head = f"/{REPO}/resolve/{self.repo.commit}/model.safetensors"
            deadline = time.monotonic() + 60
            while not any(r["method"] == "HEAD" and r["path"] == head for r in self.hub.requests()):
                self.assertIsNone(proc.poll())
                self.assertLess(time.monotonic(), deadline, "lmx never asked for the weights")
                time.sleep(0.05)
            blob = self.folder / "blobs" / sha
            (self.folder / "blobs" / "other-process.tmp").write_bytes(self.weights)
            os.replace(self.folder / "blobs" / "other-process.tmp", blob)
            fcntl.flock(held, fcntl.LOCK_UN)
        out, err = proc.communicate(timeout=120)
        self.assertEqual(proc.returncode, 0, err.decode(errors="replace"))
        self.assertEqual(self.hub.requests("cdn"), [])
        self.check_lmx_layout()

    # ---- errors -------------------------------------------------------------------------

    def test_corrupt_download_is_refused(self):
        # The content must hash to its etag: sha256 for LFS files, git's blob sha1 otherwise.
        for name, algo in (("config.json", "git sha1"), ("model.safetensors", "sha256")):
            self.hub.corrupt_once.add(name)
            p = self.lmx("get", REPO, ok=False)
            self.assertIn(f"'{name}' of '{REPO}' is corrupt: its {algo}".encode(), p.stderr)
            self.assertFalse(os.path.lexists(self.snapshot() / name))
            self.assertEqual(list(self.folder.glob("blobs/*.incomplete")), [])
        self.lmx("get", REPO)
        self.check_lmx_layout()

    def test_not_found_on_the_hub(self):
        p = self.lmx("get", "lmx-test/no-such-model", ok=False)
        self.assertIn(b"not found on the hub", p.stderr)
        p = self.lmx("generate", "--model", "lmx-test/no-such-model", "--prompt", "x", ok=False)
        self.assertIn(b"not found on the hub", p.stderr)
        p = self.lmx("get", REPO + "@no-such-branch", ok=False)
        self.assertIn(b"revision 'no-such-branch'", p.stderr)
        self.assertIn(b"not found on the hub", p.stderr)
        self.assertFalse(os.path.exists(self.snapshot()))

    def test_offline_not_in_the_cache(self):
        for args, env in ((["--offline"], self.env()), ([], self.env(HF_HUB_OFFLINE="1"))):
            p = self.lmx("generate", "--model", REPO, "--prompt", "x", *args, env=env, ok=False)
            self.assertIn(b"not in the cache", p.stderr)
            self.assertNotIn(b"not found on the hub", p.stderr)
        self.assertEqual(self.hub.requests(), [])

    def test_disk_full_names_the_path(self):
        blobs = self.folder / "blobs"
        blobs.mkdir(parents=True)
        part = blobs / (self.repo.sha256("model.safetensors") + ".incomplete")
        part.symlink_to("/dev/full")
        p = self.lmx("get", REPO, ok=False)
        self.assertIn(str(part).encode(), p.stderr)
        self.assertIn(b"No space left on device", p.stderr)
        self.assertFalse(os.path.lexists(self.snapshot() / "model.safetensors"))

    # ---- ls / rm ------------------------------------------------------------------------

    def test_ls_and_rm(self):
        self.lmx("get", REPO, "--quiet")
        self.hf("import sys\nfrom huggingface_hub import snapshot_download\n"
                "snapshot_download(sys.argv[1])", REPO_4BIT)
        rows = {line.split()[0]: line.split() for line in
                self.lmx("ls").stdout.decode().splitlines()[1:]}
        self.assertEqual(set(rows), {REPO, REPO_4BIT})
        self.assertEqual(rows[REPO][3:], ["LlamaForCausalLM", "float32", "yes"])
        self.assertEqual(rows[REPO_4BIT][3:], ["LlamaForCausalLM", "4-bit", "g64", "yes"])
        size = sum(p.stat().st_size for p in (self.folder / "blobs").iterdir())
        self.assertEqual(" ".join(rows[REPO][1:3]), fmt_bytes(size))
        self.lmx("rm", REPO)
        self.assertFalse(self.folder.exists())
        p = self.lmx("rm", REPO, ok=False)
        self.assertIn(b"not in the cache", p.stderr)
        self.assertEqual(self.lmx("ls").stdout.decode().split()[5:6], [REPO_4BIT])


def fmt_bytes(n):
    """src/core/progress.cpp's format_bytes."""
    if n < 1000:
        return f"{n} B"
    v, u = float(n), 0
    units = ["B", "kB", "MB", "GB", "TB"]
    while v >= 1000 and u < 4:
        v, u = v / 1000, u + 1
    return (f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 100 else f"{v:.0f}") + " " + units[u]


if __name__ == "__main__":
    unittest.main(verbosity=2)
