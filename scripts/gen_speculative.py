#!/usr/bin/env python3
"""Tiny target/draft pairs of one vocabulary and mlx-lm's speculative tokens, for lmx's
speculative decoding tests (tests/models/test_speculative.cpp).

    gen_speculative.py OUT_DIR

Each pair is a random tiny model (gen_tiny_models.py's configurations and init_weights, fixed
seeds) saved as the target, and a draft made of the target's first layers (same embeddings, final
norm and head), which agrees with it only part of the time. A third model of another vocabulary
tests the mismatch error. For every golden row, mlx-lm's speculative_generate_step (greedy, the
row's K, kv_bits) and generate_step (plain greedy) run on the saved directories.

Output in OUT_DIR/speculative/: <pair>/target, <pair>/draft (MLX model directories),
vocab320/ (a model of 320 tokens) and golden.json.
"""

import argparse
import json
import sys
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten
import mlx_lm
from mlx_lm.generate import generate_step, speculative_generate_step
from mlx_lm.utils import load_model, save_config, save_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_tiny_models import GEMMA3_TEXT, LLAMA, init_weights, seed_of  # noqa: E402

PAIRS = {
    # 4 layers (head_dim 32, so KV quantization's group of 32 applies), the draft the first 2.
    "llama": (dict(LLAMA, num_hidden_layers=4, head_dim=32), 2),
    # window 8, global layers 2 and 5; the draft layers 0-2 (sliding, sliding, global).
    "gemma3": (dict(GEMMA3_TEXT), 3),
}
MAX_TOKENS = 40
# (pair, K, kv_bits, prompt length). The llama pair only: once a rotating cache passes its
# window mlx-lm's trim_prompt_cache silently trims nothing, and its speculative tokens then differ
# from its own plain decoding, so the gemma3 pair is checked against plain decoding instead.
GOLDEN = [
    ("llama", 1, None, 12),
    ("llama", 2, None, 12),
    ("llama", 4, None, 20),
    ("llama", 3, 8, 16),
]


def build(config, seed):
    import importlib

    arch = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model = arch.Model(arch.ModelArgs.from_dict(config))
    mx.random.seed(seed)
    init_weights(model)
    model.set_dtype(mx.float32)
    return arch, model


def save(model, config, out):
    out.mkdir(parents=True, exist_ok=True)
    mx.eval(model.parameters())
    save_model(out, model)
    save_config(dict(config, torch_dtype="float32"), out / "config.json")


def write_pair(name, config, draft_layers, out):
    arch, target = build(config, seed_of("speculative_" + name))
    save(target, config, out / "target")
    draft_config = dict(config, num_hidden_layers=draft_layers)
    draft = arch.Model(arch.ModelArgs.from_dict(draft_config))
    keep = []
    for key, value in tree_flatten(target.parameters()):
        parts = key.split(".")
        if "layers" in parts and int(parts[parts.index("layers") + 1]) >= draft_layers:
            continue
        keep.append((key, value))
    draft.update(tree_unflatten(keep))
    save(draft, draft_config, out / "draft")


def run(out, pair, k, kv_bits, prompt_len):
    target, _ = load_model(out / pair / "target")
    draft, _ = load_model(out / pair / "draft")
    vocab = PAIRS[pair][0]["vocab_size"]
    key = mx.random.key(seed_of(f"speculative_{pair}_{k}_{prompt_len}"))
    prompt = mx.random.randint(0, vocab, (prompt_len,), key=key).tolist()
    kw = dict(kv_bits=kv_bits, kv_group_size=32, quantized_kv_start=0) if kv_bits else {}
    spec, from_draft = [], []
    for tok, _, d in speculative_generate_step(
        mx.array(prompt), target, draft, num_draft_tokens=k, max_tokens=MAX_TOKENS, **kw
    ):
        spec.append(int(tok))
        from_draft.append(bool(d))
    plain = []
    for tok, _ in generate_step(mx.array(prompt), target, max_tokens=MAX_TOKENS, **kw):
        plain.append(int(tok))
    return dict(pair=pair, num_draft_tokens=k, kv_bits=kv_bits, kv_group_size=32,
                quantized_kv_start=0, prompt=prompt, max_tokens=MAX_TOKENS, tokens=spec,
                accepted=sum(from_draft), plain_tokens=plain)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    out = ap.parse_args().out / "speculative"
    for name, (config, layers) in PAIRS.items():
        write_pair(name, config, layers, out / name)
    _, other = build(dict(LLAMA, vocab_size=320), seed_of("speculative_vocab320"))
    save(other, dict(LLAMA, vocab_size=320), out / "vocab320")
    rows = []
    for pair, k, kv_bits, prompt_len in GOLDEN:
        try:
            rows.append(run(out, pair, k, kv_bits, prompt_len))
        except ValueError as e:  # mlx-lm: a rotating cache past its window cannot be trimmed
            print(f"{pair} K={k}: mlx-lm refused: {e}", file=sys.stderr)
    golden = dict(mlx_version=mx.__version__, mlx_lm_version=mlx_lm.__version__, rows=rows)
    (out / "golden.json").write_text(json.dumps(golden, indent=1) + "\n")
    for r in rows:
        print(f"{r['pair']} K={r['num_draft_tokens']} kv_bits={r['kv_bits']}: "
              f"{r['accepted']}/{len(r['tokens'])} from the draft, "
              f"spec == plain: {r['tokens'] == r['plain_tokens']}")


if __name__ == "__main__":
    main()
