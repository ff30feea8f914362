#!/usr/bin/env bash
# GPU machine: kernel-level profile of one model (default Qwen3-4B 4-bit g64) through the CUPTI
# tracer bin/liblmx_ktrace.so (bench/gpu/ktrace.cpp; Nsight Systems makes no reports there and
# Nsight Compute replays every kernel). lmx and mlx-lm each run a decode workload twice, with 8
# and 40 generated tokens (the difference: 32 decode steps in the warm-up and 32 in the trial),
# and a 2048-token prefill (warm-up plus one trial); an untraced lmx run gives the wall times.
# Writes the traces to $W/profile and prints the breakdown (bench/gpu/profile_report.py).
#   bench/gpu/profile.sh [MODEL_DIR]
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
W="${W:-/tmp/gpubench}"
model="${1:-$W/mlx/qwen3-4b-4bit-g64}"
prefix="${LMX_GPU_PREFIX:-/tmp/lmx}"
# shellcheck disable=SC1091
. "$prefix/env.sh"
export NCCL_NVLS_ENABLE=0
tracer="$prefix/bin/liblmx_ktrace.so"
[[ -f "$tracer" ]] || { echo "profile: $tracer missing (pack.sh of a build with CUDA::cupti)" >&2; exit 1; }
# libcupti.so.13: the toolkit's (seen there in /usr/local/cuda-13.0/targets/x86_64-linux/lib),
# else a CUDA 13 wheel's. (Never preload the tracer into a program without CUDA to test it: its
# exit waits on CUPTI.)
cupti=""
for dir in /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/targets/x86_64-linux/lib \
           /usr/local/cuda/extras/CUPTI/lib64 "$prefix"/nvidia/cu13/lib "$prefix"/nvidia/cuda_cupti/lib; do
  [[ -f "$dir/libcupti.so.13" ]] && { cupti="$dir"; break; }
done
[[ -n "$cupti" ]] || { echo "profile: libcupti.so.13 not found" >&2; exit 1; }
export LD_LIBRARY_PATH="$cupti:${LD_LIBRARY_PATH:-}"
echo "profile: tracer $tracer, libcupti.so.13 from $cupti"
d="$W/profile"
mkdir -p "$d"
t0=$SECONDS
trace() {  # NAME CMD...: one traced run, at most STEP_TIMEOUT seconds
  local name="$1"; shift
  # The preload goes to the traced program only (timeout would write its own empty trace).
  timeout "${STEP_TIMEOUT:-120}" env LMX_KTRACE="$d/$name.csv" LD_PRELOAD="$tracer" "$@" \
    >"$d/$name.out" 2>"$d/$name.err" || { echo "profile: $name failed:"; tail -n 5 "$d/$name.err"; }
  echo "profile: $name at $((SECONDS - t0)) s: $(tail -n 1 "$d/$name.err")"
}
if [[ -z "${KEEP_TIMING:-}" || ! -s "$d/timing.jsonl" ]]; then  # KEEP_TIMING=1: a rerun's traces only
  timeout "${STEP_TIMEOUT:-120}" lmx bench --model "$model" --workloads 16:64,2048:1 --trials 2 >"$d/timing.jsonl"
  echo "profile: lmx timing at $((SECONDS - t0)) s"
  timeout "${STEP_TIMEOUT:-120}" python3 "$here/mlx_lm_bench.py" "$model" --workloads 16:64,2048:1 -n 2 \
    >"$d/timing-mlx-lm.jsonl"
  echo "profile: mlx-lm timing at $((SECONDS - t0)) s"
fi
trace lmx-decode8 lmx bench --model "$model" --prompt-tokens 16 --gen-tokens 8 --trials 1
trace lmx-decode40 lmx bench --model "$model" --prompt-tokens 16 --gen-tokens 40 --trials 1
trace lmx-prefill2048 lmx bench --model "$model" --prompt-tokens 2048 --gen-tokens 1 --trials 1
trace mlx-lm-decode8 python3 "$here/mlx_lm_bench.py" "$model" --workloads 16:8 -n 1
trace mlx-lm-decode40 python3 "$here/mlx_lm_bench.py" "$model" --workloads 16:40 -n 1
trace mlx-lm-prefill2048 python3 "$here/mlx_lm_bench.py" "$model" --workloads 2048:1 -n 1
python3 "$here/profile_report.py" "$d"
