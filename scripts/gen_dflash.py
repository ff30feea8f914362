#!/usr/bin/env python3
"""A tiny Qwen3 target and DFlash drafters in the z-lab checkpoint layout, with the reference
forward's logits and greedy DFlash tokens, for lmx's DFlash tests (tests/models/test_dflash.cpp).

    gen_dflash.py OUT_DIR

OUT_DIR/dflash/: target/ (a 6-layer Qwen3, mlx-lm layout), random/ (a 2-layer drafter, random
weights, block 8, taps at target layers 1 and 3), trained/ (the same shape trained briefly with
scripts/train_dflash.py on the target's own samples, so that proposals are accepted), golden.json
and golden.safetensors (scripts/dflash_reference.py's logits for two chained drafter calls, and
its greedy DFlash tokens and accepted counts per round). Fixed seeds throughout.
"""

import argparse
import importlib
import json
import sys
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model, save_config, save_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dflash_reference as ref  # noqa: E402
from gen_tiny_models import QWEN3, init_weights, seed_of  # noqa: E402

TARGET = dict(QWEN3, num_hidden_layers=6, tie_word_embeddings=False)
BLOCK = 8
MASK = TARGET["vocab_size"] - 1
MAX_TOKENS = 32
GREEDY = [("random", 7, 12), ("random", 3, 20), ("trained", 7, 16), ("trained", 4, 9)]


def make_target(out):
    arch = importlib.import_module("mlx_lm.models.qwen3")
    model = arch.Model(arch.ModelArgs.from_dict(TARGET))
    mx.random.seed(seed_of("dflash_target"))
    init_weights(model)
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    out.mkdir(parents=True, exist_ok=True)
    save_model(out, model)
    save_config(dict(TARGET, torch_dtype="float32"), out / "config.json")


def make_random_drafter(out):
    d = ref.Drafter(ref.drafter_config(TARGET, 2, BLOCK, MASK))
    mx.random.seed(seed_of("dflash_random"))
    init_weights(d)
    ref.save_drafter(d, out)


def prompt_of(name, n):
    key = mx.random.key(seed_of(f"dflash_prompt_{name}_{n}"))
    return mx.random.randint(0, MASK, (n,), key=key).tolist()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    out = ap.parse_args().out / "dflash"
    make_target(out / "target")
    make_random_drafter(out / "random")
    import train_dflash

    train_dflash.train(out / "target", out / "trained", layers=2, block=BLOCK, mask=MASK,
                       sequences=64, length=48, steps=300, seed=seed_of("dflash_trained"),
                       quiet=True)

    target, _ = load_model(out / "target")
    drafter = ref.load_drafter(out / "random")
    ids = drafter.config["dflash_config"]["target_layer_ids"]
    # Two chained drafter calls: context rows [0, 5) with block [p5, mask x 7], then rows
    # [5, 11) on top of the first call's cache with block [p11, mask x 7].
    prompt = prompt_of("forward", 12)
    _, states = ref.tapped_forward(target, mx.array([prompt]), make_prompt_cache(target), ids)
    b1 = mx.array([[prompt[5]] + [MASK] * (BLOCK - 1)])
    b2 = mx.array([[prompt[11]] + [MASK] * (BLOCK - 1)])
    l1, cache = drafter(target, b1, states[:, :5])
    l2, _ = drafter(target, b2, states[:, 5:11], cache)
    mx.save_safetensors(str(out / "golden.safetensors"),
                        {"states": states, "logits1": l1, "logits2": l2})

    rows = []
    for name, k, n in GREEDY:
        d = ref.load_drafter(out / name)
        p = prompt_of(name, n)
        tokens, accepted = ref.greedy_generate(target, d, p, k, MAX_TOKENS)
        rows.append(dict(drafter=name, num_draft_tokens=k, prompt=p, max_tokens=MAX_TOKENS,
                         tokens=tokens, accepted=accepted))
        print(f"{name} K={k}: {sum(accepted)} of {k * len(accepted)} proposals accepted, "
              f"{(sum(accepted) + len(accepted)) / len(accepted):.2f} tokens per round")
    golden = dict(mlx_version=mx.__version__, forward_prompt=prompt, split=[5, 11], rows=rows)
    (out / "golden.json").write_text(json.dumps(golden, indent=1) + "\n")


if __name__ == "__main__":
    main()
