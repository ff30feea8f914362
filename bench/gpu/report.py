#!/usr/bin/env python3
"""Markdown tables from bench/gpu/run.sh's results.jsonl: tok/s per runtime, model and format,
ratios to the peers, and the fraction of the memory-bandwidth roofline (weights + KV bytes read
per decoded token over the copy bandwidth measured in the same call).

usage: report.py RESULTS.jsonl WORKDIR
"""
import json
import struct
import sys
from collections import defaultdict
from pathlib import Path

DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "U32": 4, "I32": 4, "U8": 1}


def safetensors_bytes(d: Path):
    total, embed = 0, 0
    for f in sorted(d.glob("*.safetensors")):
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
        for k, v in header.items():
            if k == "__metadata__":
                continue
            b = v["data_offsets"][1] - v["data_offsets"][0]
            total += b
            if "embed_tokens" in k:
                embed += b
    return total, embed


def gguf_bytes(path: Path, llama_dir: Path):
    sys.path.insert(0, str(llama_dir / "gguf-py"))
    from gguf import GGUFReader  # noqa: PLC0415

    r = GGUFReader(str(path))
    sizes = {t.name: int(t.n_bytes) for t in r.tensors}
    return sum(sizes.values()), sizes.get("token_embd.weight", 0), "output.weight" in sizes


def model_info(workdir: Path, name: str, fmt: str):
    cfg = json.loads((workdir / "hf" / name / "config.json").read_text())
    kv_per_token = (2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"]
                    * 2)
    if fmt.startswith("gguf-"):
        total, embed, untied = gguf_bytes(workdir / "gguf" / f"{name}-{fmt[5:]}.gguf",
                                          workdir / "llama.cpp")
    else:
        d = workdir / "hf" / name if fmt == "mlx-bf16" else workdir / "mlx" / f"{name}-{fmt[4:]}"
        total, embed = safetensors_bytes(d)
        untied = not cfg.get("tie_word_embeddings", False)
    # An untied model reads one embedding row per token; a tied one reads the whole matrix as head.
    weights = total - embed if untied else total
    return weights, kv_per_token


def main():
    res, workdir = Path(sys.argv[1]), Path(sys.argv[2])
    rows = [json.loads(l) for l in res.read_text().splitlines() if l.strip()]
    bw = [r for r in rows if r.get("kind") == "bandwidth"]
    bw_gbs = bw[-1]["gb_per_s"] if bw else None
    table = defaultdict(dict)  # (name, format, runtime) -> metric -> tok/s
    for r in rows:
        rt = r.get("runtime")
        if rt in ("lmx", "mlx-lm"):
            key = (r["name"], r["format"], rt)
            p, g, b = r["prompt_tokens"], r["gen_tokens"], r.get("batch", 1)
            if b > 1:
                table[key][f"batch{b}"] = r["generation_tps"]
            elif g > 1:
                table[key][f"tg@{0 if p <= 16 else p}"] = r["generation_tps"]
            else:
                table[key][f"pp{p}"] = r["prompt_tps"]
        elif rt == "llama.cpp":
            key = (r["name"], r["format"], rt)
            if r.get("n_gen", 0) > 0:
                table[key][f"tg@{r.get('n_depth', 0)}"] = r["avg_ts"]
            elif r.get("n_depth", 0) == 0:
                table[key][f"pp{r['n_prompt']}"] = r["avg_ts"]
    cols = ["tg@0", "tg@4096", "pp512", "pp2048", "batch4", "batch16"]
    out = []
    if bw_gbs:
        out.append(f"Copy bandwidth measured in this run: {bw_gbs:.0f} GB/s "
                   f"(read + write, {bw[-1]['gpu']}).\n")
    out.append("| model | format | runtime | decode ctx 0 | decode ctx 4096 | prefill 512 | "
               "prefill 2048 | batch 4 (sum) | batch 16 (sum) | roofline ctx 0 | "
               "roofline ctx 4096 |")
    out.append("|" + "---|" * 11)
    fmt_cell = lambda v: f"{v:.1f}" if v is not None else "—"  # noqa: E731
    for key in sorted(table):
        name, fmt, rt = key
        t = table[key]
        try:
            weights, kv = model_info(workdir, name, fmt)
        except Exception as e:  # noqa: BLE001
            weights, kv = None, None
            print(f"report: no byte count for {key}: {e}", file=sys.stderr)
        roof = []
        for ctx in (0, 4096):
            v = t.get(f"tg@{ctx}")
            if v and weights and bw_gbs:
                roof.append(f"{100 * v * (weights + kv * ctx) / (bw_gbs * 1e9):.0f}%")
            else:
                roof.append("—")
        out.append(f"| {name} | {fmt} | {rt} | " + " | ".join(fmt_cell(t.get(c)) for c in cols)
                   + " | " + " | ".join(roof) + " |")
    out.append("\nRatios (lmx / peer, same model; > 1 means lmx is faster):\n")
    out.append("| model | lmx format | peer | decode ctx 0 | decode ctx 4096 | prefill 512 | "
               "prefill 2048 |")
    out.append("|" + "---|" * 7)
    pairs = [("mlx-bf16", "mlx-lm", "mlx-bf16"), ("mlx-4bit-g64", "mlx-lm", "mlx-4bit-g64"),
             ("mlx-4bit-g32", "mlx-lm", "mlx-4bit-g32"),
             ("mlx-4bit-g64", "llama.cpp", "gguf-q4_0"), ("mlx-bf16", "llama.cpp", "gguf-q8_0")]
    for name in sorted({k[0] for k in table}):
        for ours_fmt, peer, peer_fmt in pairs:
            a, b = table.get((name, ours_fmt, "lmx")), table.get((name, peer_fmt, peer))
            if not a or not b:
                continue
            cells = []
            for c in cols[:4]:
                cells.append(f"{a[c] / b[c]:.2f}" if a.get(c) and b.get(c) else "—")
            out.append(f"| {name} | {ours_fmt} | {peer} {peer_fmt} | " + " | ".join(cells) + " |")
    print("\n".join(out))


if __name__ == "__main__":
    main()
