#!/usr/bin/env python3
"""Trains a DFlash block drafter (z-lab layout, scripts/dflash_reference.py) for an MLX target
by self-distillation, with mlx.

    train_dflash.py TARGET_DIR OUT_DIR [--text FILE] [--layers 1] [--block 8] [--mask ID]
                    [--sequences 64] [--prompt-len 32] [--length 96] [--steps 400]

Data: prompts (windows of --text tokenized by the target's tokenizer, or random ids without
--text) continued greedily by the target, so that the drafter learns the target's own outputs
(the paper trains on target-generated responses too). The target is frozen: its hidden states at
the tapped layers are computed once per sequence. Each step takes one anchor position a in the
generated part for a batch of sequences: the context is the states of positions < a, the block
[token a, mask x (block - 1)], the labels tokens a + 1 .. a + block - 1, weighted
exp(-(k - 1) / decay) for block position k (early positions matter most: a miss ends the round). The states come from the
generating forwards themselves (the target's tap), so the target runs once over the data.
"""

import argparse
import math
import sys
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dflash_reference as ref  # noqa: E402


def greedy_continue(target, prompts, n, ids):
    """prompts (N, P) -> (N, P + n) each row continued greedily by the target, and the tapped
    states of all but the last token (N, P + n - 1, taps * hidden), from the same forwards."""
    cache = make_prompt_cache(target)
    logits, st = ref.tapped_forward(target, prompts, cache, ids)
    out, states = [prompts], [st]
    y = mx.argmax(logits[:, -1:], axis=-1)
    for i in range(n):
        out.append(y)
        if i == n - 1:
            break
        logits, st = ref.tapped_forward(target, y, cache, ids)
        states.append(st)
        y = mx.argmax(logits[:, -1:], axis=-1)
        mx.eval(y, st)
    return mx.concatenate(out, axis=1), mx.concatenate(states, axis=1)


def make_sequences(target, vocab, sequences, prompt_len, length, seed, ids, text=None,
                   tokenizer=None):
    key = mx.random.key(seed)
    if text is None:
        prompts = mx.random.randint(0, vocab - 1, (sequences, prompt_len), key=key)
    else:
        tok = tokenizer.encode(text)
        starts = mx.random.randint(0, len(tok) - prompt_len, (sequences,), key=key).tolist()
        prompts = mx.array([tok[s: s + prompt_len] for s in starts])
    seqs, states = [], []
    for i in range(0, sequences, 16):
        s, st = greedy_continue(target, prompts[i: i + 16], length - prompt_len, ids)
        seqs.append(s)
        states.append(st.astype(mx.float32))
    return mx.concatenate(seqs, axis=0), mx.concatenate(states, axis=0)


def train(target_dir, out_dir, layers=1, block=8, mask=None, sequences=64, prompt_len=16,
          length=48, steps=400, batch=16, lr=3e-3, decay=4.0, seed=0, text=None, quiet=False):
    target, config = load_model(Path(target_dir))
    target.freeze()
    vocab = config["vocab_size"]
    mask = vocab - 1 if mask is None else mask
    tokenizer = None
    if text is not None:
        from mlx_lm.tokenizer_utils import load as load_tokenizer

        tokenizer = load_tokenizer(Path(target_dir))
    t0 = time.time()
    c = ref.drafter_config(config, layers, block, mask)
    ids = c["dflash_config"]["target_layer_ids"]
    seqs, states = make_sequences(target, vocab, sequences, prompt_len, length, seed, ids, text,
                                  tokenizer)
    mx.eval(seqs, states)
    if not quiet:
        print(f"data: {sequences} sequences of {length} tokens, taps {ids}, "
              f"{time.time() - t0:.1f}s", flush=True)

    mx.random.seed(seed)
    drafter = ref.Drafter(c)
    drafter.set_dtype(mx.float32)
    weights = mx.exp(-mx.arange(block - 1, dtype=mx.float32) / decay)

    def loss_fn(model, ctx, blk, labels):
        logits, _ = model(target, blk, ctx)
        ce = nn.losses.cross_entropy(logits[:, 1:].astype(mx.float32), labels, reduction="none")
        return (ce * weights).sum() / (weights.sum() * labels.shape[0])

    opt = optim.AdamW(learning_rate=optim.cosine_decay(lr, steps), weight_decay=0.0)
    step_fn = nn.value_and_grad(drafter, loss_fn)
    rng = mx.random.key(seed + 1)
    N = seqs.shape[0]
    for step in range(steps):
        rng, k1, k2 = mx.random.split(rng, 3)
        a = int(mx.random.randint(prompt_len - 1, length - block + 1, (), key=k1).item())
        rows = mx.random.permutation(N, key=k2)[:batch]
        s = seqs[rows]
        blk = mx.concatenate([s[:, a: a + 1], mx.full((s.shape[0], block - 1), mask)], axis=1)
        loss, grads = step_fn(drafter, states[rows, :a], blk, s[:, a + 1: a + block])
        opt.update(drafter, grads)
        mx.eval(drafter.parameters(), opt.state, loss)
        if not quiet and (step % 50 == 0 or step == steps - 1):
            print(f"step {step}: loss {loss.item():.3f}", flush=True)
    ref.save_drafter(drafter, out_dir)
    if not quiet:
        print(f"saved {out_dir} ({time.time() - t0:.1f}s)")
    return drafter


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--text", type=Path, help="training text (else random prompts)")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--mask", type=int, help="mask token id (default vocab_size - 1)")
    ap.add_argument("--sequences", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--length", type=int, default=96)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    text = a.text.read_text() if a.text else None
    train(a.target, a.out, a.layers, a.block, a.mask, a.sequences, a.prompt_len, a.length,
          a.steps, a.batch, a.lr, seed=a.seed, text=text)


if __name__ == "__main__":
    main()
