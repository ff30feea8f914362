#!/usr/bin/env python3
"""Tensor-parallel references: mlx-lm's own Model.shard(group) under 2 ring-backend processes.

    gen_tp_fixtures.py OUT_DIR

For every row of ROWS this writes a tiny random model exactly as gen_tiny_models.py does (same
configs, weight draws, casts and mlx-lm quantization), replays generate_step's calls (prefill
chunks with the cache evaluated after each, the last prompt token, greedy decode steps) once in
this process on the whole model ("single") and once under MLX's ring backend with 2 processes on
127.0.0.1, each holding its shard after mlx-lm's `model.shard(group)` ("tp", recorded by rank 0;
every rank ends with the same logits after the all-sums). Rows marked `error` are models lmx must
refuse to shard (no reference run).

Output, per row, OUT_DIR/tp/<row>/: config.json, model.safetensors, reference.json (prompt,
calls, both runs' greedy tokens) and reference.safetensors ({single,tp}.call_NNN.tokens (1, L)
int32 / .logits (1, L, V)); OUT_DIR/tp/index.json lists the rows.

    gen_tp_fixtures.py OUT_DIR --model MODEL_DIR --ranks N [--prompt-len 40]

does the same for an existing model directory (linked, not copied) into OUT_DIR/tp-model/<name>/
(a manual check on real models; docs/distributed.md).

    gen_tp_fixtures.py --worker ROW_DIR...   (internal: one rank of the sharded replay)
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx
import mlx_lm
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_tiny_models import (  # noqa: E402
    LLAMA, QWEN2, QWEN3, STARCODER2, drive, greedy, q, row, seed_of, write_model)

RANKS = 2
DECODE_STEPS = 8
WORKER_TIMEOUT_S = 300

ROWS = [
    # bf16 with every bias mlx-lm shards: q/k/v/gate/up split, o_proj/down_proj bias after the sum
    dict(row("llama_bias_bf16", LLAMA, 19, 8, attention_bias=True, mlp_bias=True,
             tie_word_embeddings=False)),
    dict(row("llama_gqa_bf16", LLAMA, 13, 2048, num_attention_heads=8, num_key_value_heads=4)),
    dict(row("qwen2_bf16", QWEN2, 17, 8)),
    dict(row("qwen3_bf16", QWEN3, 12, 2048, tie_word_embeddings=False)),
    # 4-bit: packed weights, scales and zero points split; o_proj of 64 inputs needs group 32
    dict(row("llama_q4_g32", LLAMA, 21, 8, quant=q(4, 32))),
    dict(row("qwen2_q4_g32", QWEN2, 15, 2048, quant=q(4, 32), tie_word_embeddings=False)),
    dict(row("qwen3_q4_g64", QWEN3, 23, 8, quant=q(4))),
    # configurations a 2-way split cannot take
    dict(row("bad_kv_heads", LLAMA, 4, 8, num_key_value_heads=1), error="num_key_value_heads 1"),
    dict(row("bad_heads", LLAMA, 4, 8, num_attention_heads=1, num_key_value_heads=1),
         error="num_attention_heads 1"),
    dict(row("bad_quant_groups", LLAMA, 4, 8, quant=q(4)), error="o_proj.scales"),
    dict(row("bad_arch", STARCODER2, 4, 8), error="does not support tensor parallelism"),
]


def replay(model, r, prefix, arrays):
    """generate_step's calls on `model`; returns the call list and the greedy tokens."""
    key = mx.random.key(seed_of(r["name"]) + 1)
    prompt = mx.random.randint(0, r["config"]["vocab_size"], (r["prompt_len"],), key=key).tolist()
    cache = make_prompt_cache(model)
    calls = []

    def call(tokens, kind):
        k = f"call_{len(calls):03d}"
        ids = mx.array([tokens], dtype=mx.int32)
        offset = cache[0].offset
        logits = model(ids, cache=cache)
        entry = dict(key=k, kind=kind, offset=offset, length=len(tokens))
        if kind == "prefill":
            mx.eval(logits, [c.state for c in cache])
        else:
            token = greedy(logits)
            mx.eval(logits, token)
            entry["next_token"] = token.item()
        entry["eval_cache"] = kind == "prefill"
        arrays[f"{prefix}.{k}.tokens"] = ids
        arrays[f"{prefix}.{k}.logits"] = logits
        calls.append(entry)
        return entry.get("next_token")

    return prompt, calls, drive(prompt, r["prefill_step"], DECODE_STEPS, call)


def worker(dirs):
    group = mx.distributed.init(strict=True, backend="ring")
    for d in map(Path, dirs):
        r = json.loads((d / "row.json").read_text())
        model, _ = load_model(d)
        model.shard(group)
        arrays = {}
        _, calls, generated = replay(model, r, "tp", arrays)
        if group.rank() == 0:
            mx.save_safetensors(str(d / "tp.safetensors"), arrays)
            (d / "tp.json").write_text(json.dumps(dict(calls=calls, generated=generated)))


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def launch_workers(dirs, ranks):
    """`ranks` copies of this script in --worker mode with the ring backend's environment."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump([[f"127.0.0.1:{p}"] for p in free_ports(ranks)], f)
        hostfile = f.name
    procs = []
    try:
        for rank in range(ranks):
            env = dict(os.environ, MLX_RANK=str(rank), MLX_HOSTFILE=hostfile, NCCL_NVLS_ENABLE="0")
            cmd = [sys.executable, __file__, "--worker", *map(str, dirs)]
            procs.append(subprocess.Popen(cmd, env=env))
        deadline = time.time() + WORKER_TIMEOUT_S
        while any(p.poll() is None for p in procs):
            failed = [i for i, p in enumerate(procs) if p.poll() not in (None, 0)]
            if failed or time.time() > deadline:
                raise RuntimeError(f"sharded mlx-lm run: ranks {failed or 'all'} failed or timed out")
            time.sleep(0.05)
        if any(p.returncode != 0 for p in procs):
            raise RuntimeError("sharded mlx-lm run failed")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        os.unlink(hostfile)


def record(rows_and_dirs, ranks):
    """The single-process run here, the sharded one in `ranks` workers; writes the references."""
    runs = []
    for r, out in rows_and_dirs:
        (out / "row.json").write_text(json.dumps(r))
        model, _ = load_model(out)
        arrays = {}
        prompt, calls, generated = replay(model, r, "single", arrays)
        runs.append((out, prompt, calls, generated, arrays))
    launch_workers([out for out, *_ in runs], ranks)
    for out, prompt, calls, generated, arrays in runs:
        tp = json.loads((out / "tp.json").read_text())
        arrays.update(mx.load(str(out / "tp.safetensors")))
        mx.save_safetensors(str(out / "reference.safetensors"), arrays, metadata={"format": "mlx"})
        ref = dict(prompt=prompt, ranks=ranks, single=dict(calls=calls, generated=generated), tp=tp)
        (out / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
        for f in ("tp.json", "tp.safetensors", "row.json"):
            (out / f).unlink()


def existing_model(model_dir, out_root, ranks, prompt_len):
    out = out_root / "tp-model" / model_dir.resolve().name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for f in model_dir.iterdir():
        if f.suffix in (".json", ".safetensors") and f.name != "reference.json":
            (out / f.name).symlink_to(f.resolve())
    config = json.loads((model_dir / "config.json").read_text())
    r = dict(name=out.name, config=config, prompt_len=prompt_len, prefill_step=16)
    record([(r, out)], ranks)
    print(f"gen_tp_fixtures: {out} ({ranks} ranks)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path, nargs="?")
    ap.add_argument("--worker", nargs="+", metavar="ROW_DIR")
    ap.add_argument("--model", type=Path, help="an existing model directory instead of ROWS")
    ap.add_argument("--ranks", type=int, default=RANKS)
    ap.add_argument("--prompt-len", type=int, default=40)
    args = ap.parse_args()
    mx.set_default_device(mx.cpu)
    if args.worker:
        return worker(args.worker)
    if args.model:
        return existing_model(args.model, args.out_dir, args.ranks, args.prompt_len)

    start = time.time()
    root = args.out_dir / "tp"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    index, runs = [], []
    for r in ROWS:
        out = root / r["name"]
        out.mkdir()
        mx.random.seed(seed_of(r["name"]))
        write_model(r, out)
        index.append(dict(name=r["name"], model_type=r["config"]["model_type"], dtype=r["dtype"],
                          quantization=r["quant"], ranks=RANKS, error=r.get("error")))
        if not r.get("error"):
            runs.append((r, out))
    record(runs, RANKS)
    meta = dict(mlx_version=mx.__version__, mlx_lm_version=mlx_lm.__version__, rows=index)
    (root / "index.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"gen_tp_fixtures: {len(index)} rows in {root} ({time.time() - start:.1f}s)")


if __name__ == "__main__":
    sys.exit(main())
