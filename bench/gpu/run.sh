#!/usr/bin/env bash
# GPU machine: the side-by-side benchmark, lmx vs mlx-lm vs llama.cpp, on the models that
# bench/gpu/prepare.sh made in $W. Appends one JSON line per measurement to $W/results.jsonl (and
# $OUT/results.jsonl when $OUT is set), then prints the table (bench/gpu/report.py).
#   bench/gpu/run.sh bw                     device-to-device copy bandwidth (torch), once
#   bench/gpu/run.sh models M1,M2 [RUNTIMES]  RUNTIMES: lmx,mlx-lm,llama.cpp (default all)
#   bench/gpu/run.sh report
# Environment: W (default /tmp/gpubench), TRIALS (default 2), WORKLOADS (PROMPT:GEN pairs),
# STEP_TIMEOUT (default 240 s a runtime, model and format).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
W="${W:-/tmp/gpubench}"
TRIALS="${TRIALS:-2}"
STEP_TIMEOUT="${STEP_TIMEOUT:-240}"  # seconds for one runtime on one model and format
# decode at context ~0 and ~4096, prefill 512 and 2048
WORKLOADS="${WORKLOADS:-16:128,4096:128,512:1,2048:1}"
export NCCL_NVLS_ENABLE=0
res="$W/results.jsonl"
mkdir -p "$W/logs"
# shellcheck disable=SC1091
. /tmp/lmx/env.sh
# shellcheck source=lib.sh
. "$here/lib.sh"
emit() { tee -a "$res" ${OUT:+"$OUT/results.jsonl"}; }

bw() {
  python3 - <<'EOF' | emit
import json, torch
n = 4 << 30
a = torch.empty(n, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
for _ in range(3): b.copy_(a)
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
torch.cuda.synchronize(); s.record()
for _ in range(10): b.copy_(a)
e.record(); torch.cuda.synchronize()
sec = s.elapsed_time(e) / 1e3 / 10
print(json.dumps({"kind": "bandwidth", "bytes_moved": 2 * n, "seconds": sec,
                  "gb_per_s": 2 * n / sec / 1e9, "gpu": torch.cuda.get_device_name()}))
EOF
}

models() {
  local list="$1" runtimes="${2:-lmx,mlx-lm,llama.cpp}" m d fmt
  for m in ${list//,/ }; do
    for fmt in bf16 4bit-g64 4bit-g32; do
      if [[ $fmt == bf16 ]]; then d="$W/hf/$m"; else d="$W/mlx/$m-$fmt"; fi
      [[ -f "$d/config.json" ]] || { echo "run: missing $d" >&2; continue; }
      if [[ ",$runtimes," == *,lmx,* ]]; then
        echo "== lmx $m $fmt" >&2
        timeout "$STEP_TIMEOUT" lmx bench --model "$d" --workloads "$WORKLOADS" --trials "$TRIALS" 2>"$W/logs/lmx-$m-$fmt.err" |
          tag "{\"runtime\":\"lmx\",\"name\":\"$m\",\"format\":\"mlx-$fmt\"}" | emit
      fi
      if [[ ",$runtimes," == *,mlx-lm,* ]]; then
        echo "== mlx-lm $m $fmt" >&2
        timeout "$STEP_TIMEOUT" python3 "$here/mlx_lm_bench.py" "$d" --workloads "$WORKLOADS,16:128:4,16:128:16" \
          -n "$TRIALS" 2>"$W/logs/mlxlm-$m-$fmt.err" |
          tag "{\"name\":\"$m\",\"format\":\"mlx-$fmt\"}" | emit
      fi
    done
    if [[ ",$runtimes," == *,llama.cpp,* ]]; then
      for fmt in q4_0 q8_0; do
        d="$W/gguf/$m-$fmt.gguf"
        [[ -f "$d" ]] || { echo "run: missing $d" >&2; continue; }
        echo "== llama.cpp $m $fmt" >&2
        timeout "$STEP_TIMEOUT" "$W/llama.cpp/build/bin/llama-bench" -m "$d" -ngl 99 -p 512,2048 -n 128 -d 0,4096 \
          -r "$TRIALS" -o jsonl 2>"$W/logs/llama-$m-$fmt.err" |
          tag "{\"runtime\":\"llama.cpp\",\"name\":\"$m\",\"format\":\"gguf-$fmt\"}" | emit
      done
    fi
  done
}

case "${1:-}" in
  bw) bw ;;
  models) models "${2:?models}" "${3:-}" ;;
  report) python3 "$here/report.py" "$res" "$W" ;;
  *) echo "usage: run.sh bw | models M1,M2 [RUNTIMES] | report" >&2; exit 2 ;;
esac
