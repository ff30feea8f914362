#!/usr/bin/env python3
"""Checks the tokenizers and loadability of GGUF conversions made by `lmx convert`.

usage: check_convert_tokenizer.py LMX_BINARY DATA_DIR [--work DIR] [--no-mlx-lm]

DATA_DIR is gen_convert_fixtures.py's output. For each real GGUF (SmolLM2 Q4_1, Gemma 3 Q4_K_M):
1. runs `lmx convert` into a temporary directory;
2. loads the produced tokenizer.json with the `tokenizers` library and requires the ids of the
   corpus, with and without special tokens, and their decodes, to equal those of transformers'
   own GGUF tokenizer conversion (precomputed by the generator);
3. loads the directory with transformers' AutoTokenizer (what mlx-lm does) and checks the ids again;
4. loads it with mlx_lm.load, runs one forward pass and checks the logits are finite and the model
   predicts something sensible for a trivial prompt (a smoke check that config.json is right).
Exits 1 with a description of every mismatch.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

MODELS = {
    # name: (gguf file, prompt, a word the greedy continuation should contain, or None)
    "smollm2": ("smollm2.gguf",
                "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
                "Paris"),
    "gemma3": ("gemma3.gguf", "The quick brown fox jumps over the lazy", "dog"),
}


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def check_ids(label, corpus, got, want, errors):
    for text, g, w in zip(corpus, got, want):
        if g != w:
            i = first_diff(g, w)
            errors.append(f"{label}: {text!r}: ids differ at {i}: got {g[max(0, i - 3):i + 5]} "
                          f"expected {w[max(0, i - 3):i + 5]} (lengths {len(g)} vs {len(w)})")


def check_model(lmx, data, name, work, use_mlx_lm, errors):
    gguf_file, prompt, word = MODELS[name]
    ref = json.loads((data / "tokenizer" / f"{name}.json").read_text())
    out = work / name
    r = subprocess.run([lmx, "convert", "--hf-path", str(data / "gguf" / gguf_file), "--mlx-path",
                        str(out), "--quiet"], capture_output=True, text=True)
    if r.returncode != 0:
        errors.append(f"{name}: lmx convert failed ({r.returncode}): {r.stderr.strip()}")
        return
    corpus = ref["corpus"]

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    got = [tok.encode(s).ids for s in corpus]
    got_plain = [tok.encode(s, add_special_tokens=False).ids for s in corpus]
    check_ids(f"{name} tokenizers (special)", corpus, got, ref["ids"], errors)
    check_ids(f"{name} tokenizers (no special)", corpus, got_plain, ref["ids_no_special"], errors)
    for text, ids, want in zip(corpus, ref["ids_no_special"], ref["decoded"]):
        dec = tok.decode(ids, skip_special_tokens=False)
        if dec != want:
            errors.append(f"{name} decode of {text!r}: got {dec!r} expected {want!r}")

    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(out))
    check_ids(f"{name} AutoTokenizer", corpus, [hf.encode(s) for s in corpus], ref["ids"], errors)
    print(f"{name}: tokenizer ids match transformers on {len(corpus)} texts "
          f"({sum(len(x) for x in ref['ids'])} tokens)")

    if not use_mlx_lm:
        return
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    model, tokenizer = load(str(out))
    ids = tokenizer.encode(prompt, add_special_tokens=not prompt.startswith("<|im_start|>"))
    logits = model(mx.array([ids]))
    if not bool(mx.all(mx.isfinite(logits)).item()):
        errors.append(f"{name}: mlx-lm logits are not finite")
        return
    toks = []
    for t, _ in generate_step(mx.array(ids), model, max_tokens=12):
        toks.append(int(t))
        if t in tokenizer.eos_token_ids:
            break
    text = tokenizer.decode(toks)
    print(f"{name}: mlx-lm greedy continuation: {text!r}")
    if word and word not in text:
        errors.append(f"{name}: mlx-lm continuation {text!r} does not contain {word!r}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("lmx")
    ap.add_argument("data")
    ap.add_argument("--work")
    ap.add_argument("--no-mlx-lm", action="store_true")
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    args = ap.parse_args()
    data = Path(args.data)
    errors = []
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        for name in args.models:
            check_model(args.lmx, data, name, Path(tmp), not args.no_mlx_lm, errors)
    for e in errors:
        print("MISMATCH " + e, file=sys.stderr)
    if errors:
        sys.exit(1)
    print("check_convert_tokenizer: OK")


if __name__ == "__main__":
    main()
