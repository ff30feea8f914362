#!/usr/bin/env bash
# Several GPUs of one host: lmx tensor-parallel scaling (docs/distributed.md) on the models
# bench/gpu/prepare.sh made in $W (bf16 in $W/hf, 4-bit g64 in $W/mlx). For every model, format
# and rank count: `lmx bench --tp N` with decode at batch 1 (16:128) and prefill 2048 (2048:1),
# one JSON line each into $W/results-tp.jsonl (and $OUT/ when set), then the scaling table:
# tokens/s, speedup over 1 rank and efficiency = speedup / N.
#   bench/gpu/tp.sh run MODELS [RANKS]     e.g. qwen3-8b,qwen3-32b 1,2,4,8
#   bench/gpu/tp.sh report
# Environment: W (default /tmp/gpubench), LMX (default lmx), TRIALS (2), WORKLOADS,
# FORMATS (default bf16,4bit-g64), STEP_TIMEOUT (default 600 s a model, format and rank count).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
W="${W:-/tmp/gpubench}"
LMX="${LMX:-lmx}"
TRIALS="${TRIALS:-2}"
WORKLOADS="${WORKLOADS:-16:128,2048:1}"
FORMATS="${FORMATS:-bf16,4bit-g64}"
STEP_TIMEOUT="${STEP_TIMEOUT:-600}"
export NCCL_NVLS_ENABLE=0  # NVLink multicast off (lmx's launcher sets it in every rank too)
res="$W/results-tp.jsonl"
mkdir -p "$W/logs"
[[ -f /tmp/lmx/env.sh ]] && . /tmp/lmx/env.sh

run() {
  local m fmt d n
  for m in ${1//,/ }; do
    for fmt in ${FORMATS//,/ }; do
      if [[ $fmt == bf16 ]]; then d="$W/hf/$m"; else d="$W/mlx/$m-$fmt"; fi
      [[ -f "$d/config.json" ]] || { echo "tp: missing $d" >&2; continue; }
      for n in ${2//,/ }; do
        echo "== lmx --tp $n $m $fmt" >&2
        timeout "$STEP_TIMEOUT" "$LMX" bench --model "$d" --workloads "$WORKLOADS" \
          --trials "$TRIALS" --tp "$n" 2>"$W/logs/tp$n-$m-$fmt.err" |
          python3 -c 'import json, sys
for line in sys.stdin:
    if line.startswith("{"):
        d = json.loads(line); d.update(runtime="lmx", name=sys.argv[1], format=sys.argv[2])
        print(json.dumps(d), flush=True)' "$m" "$fmt" | tee -a "$res" ${OUT:+"$OUT/results-tp.jsonl"}
      done
    done
  done
}

report() {
  python3 - "$res" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
base, out = {}, []
for r in rows:
    decode = r["prompt_tokens"] <= 16
    r["work"] = f"decode b1 ({r['gen_tokens']} tok)" if decode else f"prefill {r['prompt_tokens']}"
    r["tps"] = r["generation_tps"] if decode else r["prompt_tps"]
    if r["tensor_parallel"] == 1:
        base[r["name"], r["format"], r["work"]] = r["tps"]
print("| model | format | workload | GPUs | tok/s | speedup | efficiency |")
print("|---|---|---|---|---|---|---|")
for r in sorted(rows, key=lambda r: (r["name"], r["format"], r["work"], r["tensor_parallel"])):
    b, n = base.get((r["name"], r["format"], r["work"])), r["tensor_parallel"]
    s = f"{r['tps'] / b:.2f}x | {r['tps'] / b / n:.0%}" if b else "- | -"
    print(f"| {r['name']} | {r['format']} | {r['work']} | {n} | {r['tps']:.1f} | {s} |")
PY
}

case "${1:-}" in
  run) run "${2:?models}" "${3:-1,2,4,8}" && report ;;
  report) report ;;
  *) echo "usage: tp.sh run MODELS [RANKS] | report" >&2; exit 2 ;;
esac
