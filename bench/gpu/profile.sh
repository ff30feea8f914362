#!/usr/bin/env bash
# GPU machine: kernel-level profile of lmx on one model (default Qwen3-4B 4-bit g64) with Nsight
# Compute (the machine has no nsys): one kernel-duration metric, clocks left alone. Runs
# `lmx bench` twice for decode (8 and 4 generated tokens: the difference is 2 x 4 decode steps,
# warm-up plus one trial) and once for a 2048-token prefill, writes the CSVs to $W/profile and
# prints the breakdown (bench/gpu/profile_report.py).
#   bench/gpu/profile.sh [MODEL_DIR]
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
W="${W:-/tmp/gpubench}"
model="${1:-$W/mlx/qwen3-4b-4bit-g64}"
# shellcheck disable=SC1091
. /tmp/lmx/env.sh
export NCCL_NVLS_ENABLE=0
ncu="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)"
[[ -x "$ncu" ]] || { echo "profile: ncu not found" >&2; exit 1; }
mkdir -p "$W/profile"
prof() {
  local name="$1"; shift
  "$ncu" --clock-control none --metrics gpu__time_duration.sum --csv --page raw "$@" \
    >"$W/profile/$name.csv" 2>"$W/profile/$name.err" || echo "profile: $name failed" >&2
}
# Timings without the profiler, for the host-side share.
lmx bench --model "$model" --workloads 16:64,2048:1 --trials 2 >"$W/profile/timing.jsonl"
prof decode8 lmx bench --model "$model" --prompt-tokens 16 --gen-tokens 8 --trials 1
prof decode4 lmx bench --model "$model" --prompt-tokens 16 --gen-tokens 4 --trials 1
prof prefill2048 lmx bench --model "$model" --prompt-tokens 2048 --gen-tokens 1 --trials 1
python3 "$here/profile_report.py" "$W/profile"
