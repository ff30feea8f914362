#!/usr/bin/env python3
"""Speculative decoding side by side, in one run: lmx without speculation, with prompt lookup and
with draft models, and mlx-lm without and with `--draft-model`, on the same prompts.

Each prompt file is rendered with the model's chat template (transformers' apply_chat_template;
`--raw` sends the file as it is) and both runtimes generate `--gen` tokens with EOS ignored
(`lmx bench --prompt-file`; mlx-lm's stream_generate with its EOS set emptied), greedy. The
configurations run in turn, `--rounds` times, the order reversed every other round; the table
gives each one's median decode tok/s and its ratio to lmx without speculation. Speculative runs
add lmx's counts (drafted, accepted, tokens per target forward) or, for mlx-lm, the share of
tokens that came from the draft. `--dry-draft DIR` adds a draft that (almost) never agrees, to
measure what the back-off leaves of a useless draft's cost.

llama.cpp (`--llama-cpp BIN_DIR --gguf F [--draft-gguf F] [--dry-draft-gguf F]`): llama-completion
without speculation (its "eval time" rate), llama-lookup (prompt lookup, `--spec-draft-n-max` as
--lookup-k) and llama-speculative with each draft (`--spec-draft-n-max` K), greedy, --ignore-eos, on the
same rendered prompt; its rate is their "decoded ... speed" line. `--threads T` goes to llama.cpp
(the CPU), `--ngl` offloads layers (the GPU).

usage: spec_bench.py --model DIR --prompt-file F [--prompt-file F2 ...] [--draft DIR]
                     [--dry-draft DIR] [--lmx build/lmx] [--gen 128] [--rounds 3] [-k 3]
                     [--lookup 3] [--lookup-k 4] [--mlx-lm] [--exact] [--jsonl OUT]
                     [--llama-cpp DIR --gguf F [--draft-gguf F] [--dry-draft-gguf F]]
       spec_bench.py --truncate DIR N OUT   (a draft: DIR's first N layers, same vocabulary)
       spec_bench.py --truncate-gguf FILE N OUT   (the same for llama.cpp)
       spec_bench.py --scale-tail DIR N EPS OUT   (a target that a draft of DIR's first N layers
                                                   agrees with: see scale_tail)
"""
import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MLX_LM_RUNNER = r"""
import json, sys
from mlx_lm import load
from mlx_lm.generate import stream_generate
a = json.loads(sys.argv[1])
model, tok = load(a["model"])
draft = load(a["draft"])[0] if a["draft"] else None
tok.eos_token_ids = set()
kw = {"draft_model": draft, "num_draft_tokens": a["k"]} if draft is not None else {}
# A short warm-up (kernels, allocations) without the long prompt's prefill.
for r in stream_generate(model, tok, "Hello", max_tokens=8, **kw):
    pass
n = from_draft = 0
for r in stream_generate(model, tok, a["prompt"], max_tokens=a["gen"], **kw):
    n += 1
    from_draft += bool(r.from_draft)
    last = r
print(json.dumps({"generation_tps": last.generation_tps, "prompt_tps": last.prompt_tps,
                  "tokens": n, "from_draft": from_draft, "peak_memory_gb": last.peak_memory}))
"""


def render(model, text, raw):
    if raw:
        return text
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model)
    if not tok.chat_template:
        return text
    return tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                   add_generation_prompt=True)


def run_lmx(a, prompt_file, extra):
    cmd = [a.lmx, "bench", "--model", a.model, "--prompt-file", prompt_file, "--gen-tokens",
           str(a.gen), "--trials", "1", "--json", *extra]
    if a.exact:
        cmd.append("--exact")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def run_mlx_lm(a, prompt, draft):
    arg = json.dumps({"model": a.model, "draft": draft, "prompt": prompt, "gen": a.gen, "k": a.k})
    out = subprocess.run([sys.executable, "-c", MLX_LM_RUNNER, arg], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def run_llama(a, tool, prompt_file, extra):
    cmd = [str(Path(a.llama_cpp) / tool), "-m", a.gguf, "-f", prompt_file, "-n", str(a.gen),
           "--temp", "0", "--ignore-eos", "-c", "4096", *extra]
    if a.threads:
        cmd += ["-t", str(a.threads)]
    if a.ngl is not None:
        cmd += ["-ngl", str(a.ngl)]
    if tool == "llama-completion":
        cmd += ["-no-cnv", "--no-display-prompt"]
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", stdin=subprocess.DEVNULL)
    log = p.stdout + p.stderr
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{log[-2000:]}")
    out = {}
    if tool == "llama-completion":
        m = re.findall(r"\beval time = .*?/\s*(\d+) runs .*?([\d.]+) tokens per second", log)
        out["generation_tps"] = float(m[-1][1])
    else:
        m = re.findall(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", log)
        out["generation_tps"] = float(m[-1][2])
        d = re.findall(r"n_drafted\s*=\s*(\d+)", log)
        c = re.findall(r"n_accept\s*=\s*(\d+)", log)
        if d and c:
            out["speculative"] = {"drafted": int(d[-1]), "accepted": int(c[-1])}
    return out


def truncate(src, n, out):
    """A same-vocabulary draft for a CPU run: the model's first n layers (real weights)."""
    src, out = Path(src), Path(out)
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(src, out, ignore=shutil.ignore_patterns("*.safetensors", "*.index.json"))
    import mlx.core as mx
    weights = {}
    for f in sorted(src.glob("*.safetensors")):
        weights.update(mx.load(str(f)))
    keep = {}
    for k, v in weights.items():
        parts = k.split(".")
        if "layers" in parts:
            i = parts.index("layers")
            if int(parts[i + 1]) >= n:
                continue
        keep[k] = v
    mx.save_safetensors(str(out / "model.safetensors"), keep, metadata={"format": "mlx"})
    cfg = json.loads((src / "config.json").read_text())
    cfg["num_hidden_layers"] = n
    (out / "config.json").write_text(json.dumps(cfg, indent=2))


def scale_tail(src, n, eps, out):
    """DIR with the o_proj and down_proj of layers n.. scaled by eps: those layers' residual
    branches shrink, so the target's logits approach those of its first n layers (`--truncate DIR
    n`): eps = 0 makes the two agree on every token, larger eps less often. A draft pair with a
    known cost ratio and a tunable acceptance, for random weights in real shapes (no real pair of
    one vocabulary is available offline). Quantized layers scale their scales and biases, which
    scales the dequantized weight exactly."""
    src, out = Path(src), Path(out)
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(src, out, ignore=shutil.ignore_patterns("*.safetensors"))
    import mlx.core as mx
    for f in sorted(src.glob("*.safetensors")):
        weights = mx.load(str(f))
        for k in list(weights):
            parts = k.split(".")
            if ("layers" not in parts or len(parts) < 2 or
                    parts[-2] not in ("o_proj", "down_proj") or
                    int(parts[parts.index("layers") + 1]) < n):
                continue
            if parts[-1] == "weight" and weights[k].dtype == mx.uint32:
                continue  # packed integers: their scales and biases carry the factor
            weights[k] = (weights[k] * eps).astype(weights[k].dtype)
        mx.save_safetensors(str(out / f.name), weights, metadata={"format": "mlx"})


def truncate_gguf(src, n, out):
    """truncate() for a GGUF: blocks 0..n-1, block_count n, everything else as it was."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter
    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = GGUFWriter(out, arch)
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        vtype = GGUFValueType(f.types[0])
        sub = GGUFValueType(f.types[1]) if vtype == GGUFValueType.ARRAY else None
        val = n if f.name == f"{arch}.block_count" else f.contents()
        w.add_key_value(f.name, val, vtype, sub)
    for t in r.tensors:
        parts = t.name.split(".")
        if parts[0] == "blk" and int(parts[1]) >= n:
            continue
        w.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--scale-tail":
        scale_tail(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5])
        return
    if len(sys.argv) > 1 and sys.argv[1] in ("--truncate", "--truncate-gguf"):
        fn = truncate if sys.argv[1] == "--truncate" else truncate_gguf
        fn(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-file", action="append", required=True)
    ap.add_argument("--draft", help="a draft model of the same vocabulary")
    ap.add_argument("--dry-draft", help="a draft that (almost) never agrees: the back-off's floor")
    ap.add_argument("--lmx", default=str(Path(__file__).resolve().parents[1] / "build" / "lmx"))
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-k", type=int, default=3, help="--num-draft-tokens of the draft models")
    ap.add_argument("--lookup", type=int, default=3, help="--prompt-lookup N (0: none)")
    ap.add_argument("--lookup-k", type=int, default=4, help="--num-draft-tokens of the lookup")
    ap.add_argument("--mlx-lm", action="store_true", help="also mlx-lm, plain and with --draft")
    ap.add_argument("--mlx-lm-rounds", type=int, default=None,
                    help="rounds that include mlx-lm (default all; its CPU prefill is slow)")
    ap.add_argument("--exact", action="store_true", help="lmx at tier L1")
    ap.add_argument("--raw", action="store_true", help="no chat template")
    ap.add_argument("--jsonl")
    ap.add_argument("--llama-cpp", help="directory of llama.cpp's binaries")
    ap.add_argument("--gguf", help="the model as GGUF, for llama.cpp")
    ap.add_argument("--draft-gguf")
    ap.add_argument("--dry-draft-gguf")
    ap.add_argument("--threads", type=int, help="llama.cpp's -t")
    ap.add_argument("--ngl", type=int, help="llama.cpp's -ngl (and -ngld)")
    a = ap.parse_args()

    configs = [("lmx", "none", lambda pf, p: run_lmx(a, pf, []))]
    if a.lookup:
        configs.append(("lmx", f"prompt lookup {a.lookup}, K={a.lookup_k}", lambda pf, p: run_lmx(
            a, pf, ["--prompt-lookup", str(a.lookup), "--num-draft-tokens", str(a.lookup_k)])))
    for name, d in (("draft", a.draft), ("dry draft", a.dry_draft)):
        if d:
            configs.append(("lmx", f"{name} {Path(d).name}, K={a.k}", lambda pf, p, d=d: run_lmx(
                a, pf, ["--draft-model", d, "--num-draft-tokens", str(a.k)])))
    if a.mlx_lm:
        configs.append(("mlx-lm", "none", lambda pf, p: run_mlx_lm(a, p, None)))
        for name, d in (("draft", a.draft), ("dry draft", a.dry_draft)):
            if d:
                configs.append(("mlx-lm", f"{name} {Path(d).name}, K={a.k}",
                                lambda pf, p, d=d: run_mlx_lm(a, p, d)))

    if a.llama_cpp:
        configs.append(("llama.cpp", "none",
                        lambda pf, p: run_llama(a, "llama-completion", pf, [])))
        if a.lookup:
            configs.append(("llama.cpp", f"prompt lookup, K={a.lookup_k}", lambda pf, p: run_llama(
                a, "llama-lookup", pf, ["--spec-draft-n-max", str(a.lookup_k)])))
        for name, d in (("draft", a.draft_gguf), ("dry draft", a.dry_draft_gguf)):
            if d:
                ngld = ["-ngld", str(a.ngl)] if a.ngl is not None else []
                configs.append(("llama.cpp", f"{name} {Path(d).name}, K={a.k}",
                                lambda pf, p, d=d, ngld=ngld: run_llama(
                                    a, "llama-speculative", pf,
                                    ["-md", d, "--spec-draft-n-max", str(a.k), "--spec-draft-n-min", "0",
                                     *ngld])))

    log = open(a.jsonl, "a") if a.jsonl else None
    tmp = Path(tempfile.mkdtemp(prefix="spec_bench_"))
    print(f"model: {a.model}; {a.gen} generated tokens (EOS ignored), greedy; median of "
          f"{a.rounds} rounds, alternating order; lmx {'L1 (--exact)' if a.exact else 'default tier'}")
    for pf in a.prompt_file:
        prompt = render(a.model, Path(pf).read_text(), a.raw)
        rendered = tmp / Path(pf).name
        rendered.write_text(prompt)
        runs = {i: [] for i in range(len(configs))}
        for r in range(a.rounds):
            order = range(len(configs)) if r % 2 == 0 else reversed(range(len(configs)))
            for i in order:
                runtime, proposer, fn = configs[i]
                if runtime == "mlx-lm" and a.mlx_lm_rounds is not None and r >= a.mlx_lm_rounds:
                    continue
                res = fn(str(rendered), prompt)
                runs[i].append(res)
                if log:
                    log.write(json.dumps({"prompt_file": Path(pf).name, "round": r,
                                          "runtime": runtime, "proposer": proposer,
                                          **res}) + "\n")
                    log.flush()
        base = statistics.median(x["generation_tps"] for x in runs[0])
        print(f"\nprompt: {Path(pf).name}\n")
        print("| runtime | speculation | decode tok/s | vs lmx plain | drafted | accepted | "
              "acceptance | tokens / target forward |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for i, (runtime, proposer, _) in enumerate(configs):
            tps = statistics.median(x["generation_tps"] for x in runs[i])
            cells = ["", "", "", ""]
            last = runs[i][-1]
            if "speculative" in last:
                s = last["speculative"]
                rate = s["accepted"] / s["drafted"] if s["drafted"] else 0
                cells = [str(s["drafted"]), str(s["accepted"]), f"{rate:.1%}",
                         f"{s['mean_accepted_length']:.2f}" if "mean_accepted_length" in s else ""]
            elif "from_draft" in last and proposer != "none":
                cells = ["", str(last["from_draft"]), f"{last['from_draft'] / last['tokens']:.1%} "
                         "of tokens", ""]
            print(f"| {runtime} | {proposer} | {tps:.1f} | {tps / base:.2f}x | " +
                  " | ".join(cells) + " |")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
