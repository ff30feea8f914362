#!/usr/bin/env bash
# GPU machine, after scripts/gpu/unpack.sh: continuous batching on CUDA (docs/batching.md).
#   bench/gpu/batch.sh test DATA   the rows attention kernel against per-row MLX ops
#                                  (lmx_tests_models GpuRowsAttention.*) and the batched-vs-alone
#                                  gates on tiny models (lmx_tests_models Rows/BatchRowsGpuL3.*);
#                                  DATA holds parity/<row>/ (config + weights, made here by
#                                  scripts/gen_tiny_models.py: fixed seeds) and the tokenizer of
#                                  smollm2-135m-instruct-4bit/, copied into $LMX_TEST_DATA
#   bench/gpu/batch.sh bench M...  per model dir: lmx bench --concurrency $LEVELS in each of
#                                  $TIERS (l3rows: L3 with the rows attention kernel; l3: L3 with
#                                  per-row MLX attention, LMX_CUDA_ROWS=0; l1: --exact), then
#                                  mlx-lm's batch_generate (mlx_lm_bench.py), one after the other
# Logs and JSON lines go to $OUT (or /tmp/batch). Environment: LEVELS (default 1,8,32,64),
# PROMPT / GEN (default 128 / 128), STEP_TIMEOUT (seconds a runtime, default 200), TIERS (default
# "l3rows l3 l1").
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
. "${LMX_GPU_PREFIX:-/tmp/lmx}/env.sh" || { echo "batch: run scripts/gpu/unpack.sh first" >&2; exit 1; }
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
out="${OUT:-/tmp/batch}"
mkdir -p "$out"
LEVELS="${LEVELS:-1,8,32,64}"
PROMPT="${PROMPT:-128}"
GEN="${GEN:-128}"
STEP_TIMEOUT="${STEP_TIMEOUT:-200}"
TIERS="${TIERS:-l3rows l3 l1}"
t0=$SECONDS
counts() { grep -E '^\[  PASSED  \]|^\[  FAILED  \] [0-9]+ test|^\[  SKIPPED \] [0-9]+ test' "$1" | tr '\n' ' '; }

test_() {
  local data="$1" status=0 rc
  export LMX_TEST_DATA="${LMX_TEST_DATA:-/tmp/testdata}"
  mkdir -p "$LMX_TEST_DATA"
  cp -r "$data"/. "$LMX_TEST_DATA"/
  timeout 300 lmx_tests_models --gtest_filter='GpuRowsAttention.*' >"$out/test-unit-rows.log" 2>&1
  rc=$?; ((rc)) && status=1
  echo "batch: unit GpuRowsAttention rc=$rc $(counts "$out/test-unit-rows.log") ($((SECONDS - t0)) s)"
  grep -B2 -A6 'Failure' "$out/test-unit-rows.log" | cut -c1-240 | head -n 40
  timeout 400 lmx_tests_models --gtest_filter='Rows/BatchRowsGpuL3.*' >"$out/test-models-batch.log" 2>&1
  rc=$?; ((rc)) && status=1
  echo "batch: models BatchRowsGpuL3 rc=$rc $(counts "$out/test-models-batch.log") ($((SECONDS - t0)) s)"
  grep -B2 -A6 'Failure' "$out/test-models-batch.log" | cut -c1-240 | head -n 40
  return $status
}

bench() {
  local m name
  for m in "$@"; do
    name="$(basename "$m")"
    for tier in $TIERS; do
      local flags=() rows=1
      [[ $tier == l1 ]] && flags=(--exact)
      [[ $tier == l3 ]] && rows=0
      LMX_CUDA_ROWS=$rows timeout "$STEP_TIMEOUT" lmx bench --model "$m" "${flags[@]}" --concurrency "$LEVELS" \
        --prompt-tokens "$PROMPT" --gen-tokens "$GEN" --json \
        >"$out/batch-$name-lmx-$tier.jsonl" 2>>"$out/batch-$name.log"
      echo "batch: $name lmx $tier rc=$? ($((SECONDS - t0)) s)"
    done
    local wl="" n
    for n in ${LEVELS//,/ }; do wl+="${wl:+,}$PROMPT:$GEN:$n"; done
    timeout "$STEP_TIMEOUT" python3 "$here/mlx_lm_bench.py" "$m" --workloads "$wl" \
      >"$out/batch-$name-mlx-lm.jsonl" 2>>"$out/batch-$name.log"
    echo "batch: $name mlx-lm rc=$? ($((SECONDS - t0)) s)"
    python3 - "$out" "$name" <<'EOF'
import json, sys, pathlib
out, name = pathlib.Path(sys.argv[1]), sys.argv[2]
def rows(f):
    p = out / f
    return [json.loads(l) for l in p.read_text().splitlines() if l.startswith("{")] if p.exists() else []
tiers = ["l3rows", "l3", "l1"]
lmx = {t: {r["concurrency"]: r for r in rows(f"batch-{name}-lmx-{t}.jsonl")} for t in tiers}
ml = {r["batch"]: r for r in rows(f"batch-{name}-mlx-lm.jsonl")}
print(f"{name}: streams | " + " | ".join(f"{t} aggregate / per-stream tok/s" for t in tiers)
      + " | mlx-lm")
for n in sorted(set(ml).union(*lmx.values())):
    f = lambda d, k: f"{d[n][k]:.1f}" if n in d else "-"
    cells = [f"{f(lmx[t], 'aggregate_tps')} / {f(lmx[t], 'per_stream_tps')}" for t in tiers]
    print(f"  {n:3d} | " + " | ".join(cells) + f" | {f(ml, 'generation_tps')}")
EOF
  done
}

case "${1:-}" in
  test) shift; test_ "$@" ;;
  bench) shift; bench "$@" ;;
  *) echo "usage: bench/gpu/batch.sh test DATA | bench MODEL_DIR..." >&2; exit 2 ;;
esac
