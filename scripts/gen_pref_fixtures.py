#!/usr/bin/env python3
"""References for `lmx lora --train --train-mode dpo|orpo`: DPO and ORPO written here from the
papers' formulas, with mlx and mlx-lm for the model forward, the LoRA layers and the optimizer.

    gen_pref_fixtures.py OUT_DIR

DPO (Rafailov et al. 2023, "Direct Preference Optimization", eq. 7, the sigmoid loss): with
pi_w, pi_l the policy's summed log-probabilities of the chosen / rejected answer given the prompt
and ref_w, ref_l the reference model's (here: the model without the adapter),
    loss = -log sigmoid(beta * ((pi_w - pi_l) - (ref_w - ref_l))),
rewards beta * (pi - ref); the reward margin is mean chosen reward - mean rejected reward.

ORPO (Hong et al. 2024, "ORPO: Monolithic Preference Optimization without Reference Model",
eq. 2-7): with p_w, p_l the per-token mean log-probabilities of the answers (log P(y|x), length
normalized) and odds(y|x) = P / (1 - P),
    log OR = (p_w - p_l) - (log(1 - e^p_w) - log(1 - e^p_l)),
    loss = -p_w + lambda * -log sigmoid(log OR),
rewards lambda * p. log(1 - e^p) is taken as log(-expm1(p)) above -ln 2 and log1p(-e^p) below,
with p capped at -1e-7 (an answer of probability 1 has no odds).

Batches are lmx's (the rows sorted by their number of JSON keys, cut into full batches, visited
in a numpy permutation per pass with np.random.seed(seed), as mlx-lm's iterate_batches), chosen
and rejected sequences in one forward of 2B rows, padded to 1 + 32 * ceil(max / 32); an answer is
rendered as the assistant turn after the user prompt with the model's chat template (as mlx-lm's
CompletionsDataset renders a completion) and only its tokens count. The loss per batch is the
mean over its rows; validation loss is the mean over batches.

For every row of ROWS, OUT_DIR/<row>/: model/ (the tiny llama of gen_train_fixtures.py), data/,
reference.json (args; every train report: loss, reward margin, learning rate, trained tokens; val
reports), adapters.safetensors (the trained LoRA weights).
"""

import argparse
import json
import random
import shutil
import sys
import types
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.tuner.utils import linear_to_lora_layers
from mlx_lm.utils import load

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_train_fixtures as gtf  # noqa: E402

COMMON = dict(num_layers=2, batch_size=2, steps_per_report=1, steps_per_eval=5, val_batches=2,
              save_every=1000, test=False, max_seq_length=2048,
              lora_parameters=dict(rank=8, dropout=0.0, scale=20.0))

ROWS = [
    dict(name="dpo_lora", task="random",
         args=dict(COMMON, train_mode="dpo", beta=0.1, learning_rate=1e-3, iters=20, seed=2)),
    dict(name="orpo_lora", task="random",
         args=dict(COMMON, train_mode="orpo", **{"lambda": 0.5}, learning_rate=1e-3, iters=20,
                   seed=4)),
    # A learnable preference: the chosen answer repeats the prompt's words, the rejected one is
    # other words. 200 steps: the loss falls well below log 2 and the margin turns positive.
    dict(name="dpo_toy", task="copy",
         args=dict(COMMON, train_mode="dpo", beta=0.1, learning_rate=2e-3, iters=200, seed=6,
                   steps_per_report=20, steps_per_eval=100, batch_size=4)),
]


def write_data(task, out, rng):
    out.mkdir(parents=True)
    for split, n in (("train", 16), ("valid", 8)):
        rows = []
        for i in range(n):
            if task == "copy":
                words = [rng.choice(gtf.WORDS) for _ in range(rng.randint(2, 5))]
                other = [rng.choice(gtf.WORDS) for _ in range(len(words))]
                row = {"prompt": "repeat: " + " ".join(words), "chosen": " ".join(words),
                       "rejected": " ".join(other)}
            else:
                row = {"prompt": gtf.sentence(rng, 2, 8), "chosen": gtf.sentence(rng, 2, 12),
                       "rejected": gtf.sentence(rng, 2, 12)}
            if i % 3 == 1:
                row["system"] = gtf.sentence(rng, 1, 3)  # more keys: sorted after the others
            rows.append(row)
        with open(out / f"{split}.jsonl", "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


def load_rows(path, tokenizer):
    rows = []
    for line in open(path):
        d = json.loads(line)
        prompt = ([{"role": "system", "content": d["system"]}] if "system" in d else [])
        prompt.append({"role": "user", "content": d["prompt"]})

        def answer(key):
            return tokenizer.apply_chat_template(
                prompt + [{"role": "assistant", "content": d[key]}], add_generation_prompt=False)

        offset = len(tokenizer.apply_chat_template(prompt, add_generation_prompt=True))
        rows.append(dict(chosen=answer("chosen"), rejected=answer("rejected"), offset=offset,
                         keys=len(d)))
    return rows


def batches(rows, batch_size, max_seq_length, loop):
    """lmx's BatchIterator for preference rows: (2B, width) tokens and (2B, 2) (offset, length)."""
    idx = sorted(range(len(rows)), key=lambda i: rows[i]["keys"])
    cut = [idx[i:i + batch_size] for i in range(0, len(idx) - batch_size + 1, batch_size)]
    while True:
        for b in np.random.permutation(len(cut)):
            seqs = [(rows[j]["chosen"], rows[j]["offset"]) for j in cut[b]]
            seqs += [(rows[j]["rejected"], rows[j]["offset"]) for j in cut[b]]
            longest = max(len(s) for s, _ in seqs)
            width = min(1 + 32 * ((longest + 31) // 32), max_seq_length)
            tokens = np.zeros((len(seqs), width), np.int32)
            lengths = []
            for k, (s, off) in enumerate(seqs):
                n = min(len(s), max_seq_length)
                tokens[k, :n] = s[:n]
                lengths.append([off, n])
            yield mx.array(tokens), mx.array(np.array(lengths, np.int32))
        if not loop:
            return


def answer_logps(model, tokens, lengths):
    """Per row: the summed log-probabilities of the answer tokens and their count."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    logits = model(inputs).astype(mx.float32)
    logp = -nn.losses.cross_entropy(logits, targets)
    steps = mx.arange(1, targets.shape[1] + 1)
    mask = mx.logical_and(steps >= lengths[:, 0:1], steps < lengths[:, 1:]).astype(mx.float32)
    return (logp * mask).sum(-1), mask.sum(-1)


def neg_log_sigmoid(z):
    return mx.logaddexp(-z, mx.array(0.0))


def log1mexp(x):
    y = mx.minimum(x, mx.array(-1e-7))
    return mx.where(y > mx.array(-0.6931471805599453, mx.float32), mx.log(-mx.expm1(y)),
                    mx.log1p(-mx.exp(y)))


def preference_loss(a, sums, counts, ref):
    """(loss, answer tokens, reward margin) of one batch."""
    B = sums.shape[0] // 2
    ntoks = counts.sum().astype(mx.int32)
    if a.train_mode == "dpo":
        beta = mx.array(a.beta, mx.float32)
        chosen = sums[:B] - ref[:B]
        rejected = sums[B:] - ref[B:]
        z = (sums[:B] - sums[B:]) - (ref[:B] - ref[B:])
        loss = neg_log_sigmoid(beta * z).mean()
        margin = beta * chosen.mean() - beta * rejected.mean()
        return loss, ntoks, mx.stop_gradient(margin)
    lam = mx.array(getattr(a, "lambda"), mx.float32)
    avg = sums / mx.maximum(counts, mx.array(1.0))
    w, l = avg[:B], avg[B:]
    r = (w - l) - (log1mexp(w) - log1mexp(l))
    loss = (-w + lam * neg_log_sigmoid(r)).mean()
    margin = lam * w.mean() - lam * l.mean()
    return loss, ntoks, mx.stop_gradient(margin)


def run_row(r, out):
    model_dir, data_dir = out / "model", out / "data"
    gtf.write_model(dict(name=r["name"], quant=None), model_dir)
    write_data(r["task"], data_dir, random.Random(gtf.tiny.seed_of(r["name"])))
    a = types.SimpleNamespace(**r["args"])
    np.random.seed(a.seed)
    model, tokenizer = load(str(model_dir))
    reference, _ = load(str(model_dir))  # the model without the adapter
    train_rows = load_rows(data_dir / "train.jsonl", tokenizer)
    valid_rows = load_rows(data_dir / "valid.jsonl", tokenizer)
    mx.random.seed(a.seed)
    model.freeze()
    linear_to_lora_layers(model, a.num_layers, a.lora_parameters)
    opt = optim.Adam(learning_rate=a.learning_rate)

    def batch_loss(tokens, lengths, ref):
        sums, counts = answer_logps(model, tokens, lengths)
        return preference_loss(a, sums, counts, ref)

    def ref_logps(tokens, lengths):
        if a.train_mode != "dpo":
            return None
        sums = answer_logps(reference, tokens, lengths)[0]
        mx.eval(sums)
        return sums

    def evaluate():
        total, margins, n = mx.array(0.0), mx.array(0.0), 0
        for i, (tokens, lengths) in enumerate(batches(valid_rows, a.batch_size,
                                                      a.max_seq_length, False)):
            if a.val_batches != -1 and i >= a.val_batches:
                break
            loss, _, margin = batch_loss(tokens, lengths, ref_logps(tokens, lengths))
            total, margins, n = total + loss, margins + margin, n + 1
            mx.eval(total, margins)
        return (total / mx.array(float(n))).item(), (margins / mx.array(float(n))).item()

    loss_and_grad = nn.value_and_grad(model, lambda *x: batch_loss(*x))
    reports = []
    it_train = batches(train_rows, a.batch_size, a.max_seq_length, True)
    losses = ntok = margins = None
    steps = trained = 0
    for it in range(1, a.iters + 1):
        tokens, lengths = next(it_train)
        if it == 1 or it % a.steps_per_eval == 0 or it == a.iters:
            val_loss, val_margin = evaluate()
            reports.append(dict(iteration=it - 1, val_loss=val_loss, reward_margin=val_margin))
        (loss, n, margin), grads = loss_and_grad(tokens, lengths, ref_logps(tokens, lengths))
        opt.update(model, grads)
        losses = loss if losses is None else losses + loss
        ntok = n if ntok is None else ntok + n
        margins = margin if margins is None else margins + margin
        steps += 1
        mx.eval(model.parameters(), opt.state, losses, ntok, margins)
        if it % a.steps_per_report == 0 or it == a.iters:
            trained += ntok.item()
            reports.append(dict(iteration=it, train_loss=losses.item() / steps,
                                reward_margin=margins.item() / steps,
                                learning_rate=opt.learning_rate.item(), trained_tokens=trained))
            losses = ntok = margins = None
            steps = 0
    mx.save_safetensors(str(out / "adapters.safetensors"),
                        dict(tree_flatten(model.trainable_parameters())))
    (out / "reference.json").write_text(
        json.dumps(dict(args=r["args"], reports=reports), indent=1) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir", type=Path)
    root = ap.parse_args().out_dir
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    for r in ROWS:
        run_row(r, root / r["name"])
    (root / "index.json").write_text(json.dumps({"rows": [r["name"] for r in ROWS]}, indent=1))


if __name__ == "__main__":
    main()
