#!/usr/bin/env bash
# GPU machine, after scripts/gpu/unpack.sh: decode and prefill speed of lmx (default tier L3)
# against mlx-lm on random weights in the real shapes of the families issue 24 added
# (bench/gpu/family_models.py: 4-bit group 64, gpt-oss's experts MXFP4), one runtime at a time.
# JSON lines land in $W/families.jsonl (and $OUT/families.jsonl), then a table.
#   bench/gpu/families.sh make        make the checkpoints into $W/mlx (skips those present)
#   bench/gpu/families.sh run         the benchmark
#   bench/gpu/families.sh all         per model: make, run, delete (disk holds one at a time; the
#                                     nine take ~47 GB)
# Environment: MODELS (default all of family_models.py), W (default /tmp/gpubench), TRIALS
# (default 2), WORKLOADS (default 16:128,512:1: decode of 128 tokens after a 16-token prompt,
# prefill of 512), STEP_TIMEOUT (default 300 s a runtime and model), TIERS (lmx flags per row,
# default "l3": l3 = default tier, l1 = --exact).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
W="${W:-/tmp/gpubench}"
MODELS="${MODELS:-phi3-mini,gemma2-2b,olmo2-1b,glm4-9b,granite-3.3-2b,smollm3-3b,qwen3-moe-30b-a3b,gpt-oss-20b,qwen3.5-9b-like}"
TRIALS="${TRIALS:-2}"
WORKLOADS="${WORKLOADS:-16:128,512:1}"
STEP_TIMEOUT="${STEP_TIMEOUT:-300}"
TIERS="${TIERS:-l3}"
res="$W/families.jsonl"
mkdir -p "$W/mlx" "$W/logs"
# shellcheck disable=SC1091
. /tmp/lmx/env.sh
# shellcheck source=lib.sh
. "$here/lib.sh"
emit() { tee -a "$res" ${OUT:+"$OUT/families.jsonl"}; }

case "${1:-}" in
  make)
    python3 "$here/family_models.py" "$W/mlx" --models "$MODELS" ;;
  run | all)
    for m in ${MODELS//,/ }; do
      d="$W/mlx/$m-4bit-g64"
      if [[ $1 == all ]]; then
        python3 "$here/family_models.py" "$W/mlx" --models "$m" 2>&1 | grep -v '^\[INFO' >&2
      fi
      [[ -f "$d/config.json" ]] || { echo "families: missing $d" >&2; continue; }
      for t in $TIERS; do
        flag=(); [[ $t == l1 ]] && flag=(--exact)
        echo "== lmx $t $m" >&2
        timeout "$STEP_TIMEOUT" lmx bench --model "$d" --workloads "$WORKLOADS" --trials "$TRIALS" \
          "${flag[@]}" 2>"$W/logs/fam-lmx-$t-$m.err" |
          tag "{\"runtime\":\"lmx\",\"tier\":\"$t\",\"name\":\"$m\"}" | emit
      done
      echo "== mlx-lm $m" >&2
      timeout "$STEP_TIMEOUT" python3 "$here/mlx_lm_bench.py" "$d" --workloads "$WORKLOADS" \
        -n "$TRIALS" 2>"$W/logs/fam-mlxlm-$m.err" | tag "{\"name\":\"$m\"}" | emit
      [[ $1 == all ]] && rm -rf "$d"
    done
    WORKLOADS="$WORKLOADS" python3 - "$res" <<'PY'
import json, os, sys
wl = [tuple(int(x) for x in w.split(":")[:2]) for w in os.environ["WORKLOADS"].split(",")]
dec = next(w for w in wl if w[1] > 1)
pre = next(w for w in wl if w[1] == 1)
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
def get(name, rt, tier, p, g):
    for r in reversed(rows):
        if (r.get("name") == name and r.get("runtime") == rt and r.get("tier", "") == tier
                and r["prompt_tokens"] == p and r["gen_tokens"] == g):
            return r
names = list(dict.fromkeys(r["name"] for r in rows))
print(f"| model | lmx decode {dec[1]} | mlx-lm | ratio | lmx prefill {pre[0]} | mlx-lm | ratio |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for n in names:
    cells = [n]
    for (p, g), k in ((dec, "generation_tps"), (pre, "prompt_tps")):
        a, b = get(n, "lmx", "l3", p, g), get(n, "mlx-lm", "", p, g)
        x, y = (a or {}).get(k), (b or {}).get(k)
        cells += [f"{x:.1f}" if x else "-", f"{y:.1f}" if y else "-",
                  f"{x / y:.2f}x" if x and y else "-"]
    print("| " + " | ".join(cells) + " |")
PY
    ;;
  *) echo "usage: bench/gpu/families.sh make|run|all" >&2; exit 2 ;;
esac
