#!/usr/bin/env bash
# GPU machine, second device call (after scripts/gpu/unpack.sh's parts have arrived and
# `bench/gpu/all.sh start` ran in the first call): unpacks lmx, waits for the background model
# preparation, then runs the side-by-side benchmark and the report into $OUT. See docs/gpu.md.
#   bench/gpu/all.sh start      first call: llama.cpp build + models, in the background (setsid)
#   bench/gpu/all.sh run        second call: unpack, MLX conversions, wait, bench, report
# Environment: MODELS (default qwen3-0.6b,qwen3-4b), BUDGET (seconds for the whole run, 420),
# STEP_TIMEOUT (seconds for one MLX runtime on one model and format, 180).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
W="${W:-/tmp/gpubench}"
export MODELS="${MODELS:-qwen3-0.6b,qwen3-4b}" W NCCL_NVLS_ENABLE=0
BUDGET="${BUDGET:-420}"
mkdir -p "$W"
case "${1:-}" in
  start)
    (setsid nohup bash "$here/prepare.sh" llama >"$W/prep-llama.log" 2>&1 </dev/null &)
    (setsid nohup bash "$here/prepare.sh" hf gguf >"$W/prep-hf.log" 2>&1 </dev/null &)
    echo "all: started the llama.cpp build and the model preparation in $W" ;;
  run)
    t0=$SECONDS
    "$root/scripts/gpu/unpack.sh" >"${OUT:-$W}/unpack.log" 2>&1 || { tail -20 "${OUT:-$W}/unpack.log"; exit 1; }
    (setsid nohup bash "$here/prepare.sh" mlx >"$W/prep-mlx.log" 2>&1 </dev/null &)
    "$here/run.sh" bw
    left() { echo $((BUDGET - (SECONDS - t0))); }
    # The MLX runtimes first (their models are ready within a minute), llama.cpp last: its CUDA
    # build takes about 5 minutes on the 16 cores. The first 4-bit run of each process JIT-compiles
    # MLX's quantized kernels (NVRTC, cached in /tmp/mlx/<version>/ptx for the later processes).
    for m in ${MODELS//,/ }; do
      while [[ ! -f "$W/mlx/$m-4bit-g32/config.json" && ! -e "$W/failed.mlx" && $(left) -gt 60 ]]; do sleep 3; done
      (($(left) > 60)) || break
      echo "all: $m (lmx, mlx-lm) at $((SECONDS - t0)) s" >&2
      STEP_TIMEOUT="${STEP_TIMEOUT:-180}" timeout "$(left)" "$here/run.sh" models "$m" lmx,mlx-lm
    done
    for m in ${MODELS//,/ }; do
      while [[ ! -f "$W/gguf/$m-q4_0.gguf" && ! -e "$W/failed.gguf" && ! -e "$W/failed.llama" && $(left) -gt 30 ]]; do sleep 3; done
      (($(left) > 30)) || break
      echo "all: $m (llama.cpp) at $((SECONDS - t0)) s" >&2
      STEP_TIMEOUT=120 timeout "$(left)" "$here/run.sh" models "$m" llama.cpp
    done
    "$here/run.sh" report >"${OUT:-$W}/report.md" 2>"${OUT:-$W}/report.err"
    cat "${OUT:-$W}/report.md"
    for f in "$W"/logs/*.log "$W"/logs/*.err; do echo "== $f"; tail -n 3 "$f" | cut -c1-300; done ;;
  *) echo "usage: all.sh start | run" >&2; exit 2 ;;
esac
