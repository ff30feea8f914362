#!/usr/bin/env bash
# GPU machine, after scripts/gpu/unpack.sh: lmx's CUDA quantized matmul (src/kernels/cuda/qmv.cuh,
# issue 21). Logs and results go to $OUT (else /tmp).
#   bench/gpu/qmv.sh test          lmx_tests_unit's CudaQmm* (the kernel against mx::quantized_matmul)
#   bench/gpu/qmv.sh micro [ARGS]  bench/gpu/qmv_bench.py under the CUPTI tracer, then its report
#   bench/gpu/qmv.sh e2e MODEL     lmx bench per tier in TIERS, then mlx-lm, decode and prefill
# Environment: STEP_TIMEOUT (seconds a step, default 240), WORKLOADS (default 16:128,512:1),
# TIERS (default "l3 l1"; l1: --exact, l3: the kernel as an MLX primitive (the default),
# l3jit: through mx::fast::cuda_kernel (LMX_CUDA_QMV_JIT=1), l3nofuse: without the fused decode
# kernels (LMX_CUDA_FUSED=0, one kernel per projection), l3pipe: the kernels' software-pipelined
# build (LMX_CUDA_QMV_PIPE=1), l3norope: q/k norms and RoPE unfused (LMX_CUDA_QK_ROPE=0),
# l3nofold: the layers' RMSNorms as their own kernels (LMX_CUDA_NORM_FOLD=0), l3opsN: L3 with MLX
# committing a CUDA graph every N nodes (MLX_MAX_OPS_PER_BUFFER=N; MLX's default is about 20); a
# tier named twice runs twice and
# its files get a suffix), TRIALS (default 3), GGUF (a GGUF of the same weights: llama-bench too).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
prefix="${LMX_GPU_PREFIX:-/tmp/lmx}"
# shellcheck disable=SC1091
. "$prefix/env.sh" || { echo "qmv: run scripts/gpu/unpack.sh first" >&2; exit 1; }
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
out="${OUT:-/tmp}"
step="${STEP_TIMEOUT:-240}"
t0=$SECONDS
case "${1:-}" in
  test)
    timeout "$step" lmx_tests_unit --gtest_filter='*CudaQmm*:*CudaQkRope*' >"$out/qmv-test.log" 2>&1
    echo "qmv: test rc=$? after $((SECONDS - t0)) s"
    grep -E '^\[  (PASSED|FAILED) |^\[  FAILED|tests? ran' "$out/qmv-test.log" | tail -n 30
    grep -B2 -A6 'Failure' "$out/qmv-test.log" | cut -c1-200 | head -n 40 ;;
  micro)
    shift
    tracer="$prefix/bin/liblmx_ktrace.so"
    cupti=""
    for dir in /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/targets/x86_64-linux/lib \
               /usr/local/cuda/extras/CUPTI/lib64 "$prefix"/nvidia/cu13/lib; do
      [[ -f "$dir/libcupti.so.13" ]] && { cupti="$dir"; break; }
    done
    [[ -f "$tracer" && -n "$cupti" ]] || { echo "qmv: tracer or libcupti.so.13 missing" >&2; exit 1; }
    # The preload goes to python3 only (timeout would write its own empty trace).
    timeout "$step" env LD_LIBRARY_PATH="$cupti:${LD_LIBRARY_PATH:-}" LMX_KTRACE=/tmp/qmv-trace.csv \
      LD_PRELOAD="$tracer" python3 "$here/qmv_bench.py" --plan "$out/qmv-plan.json" "$@" \
      >"$out/qmv-run.jsonl" 2>"$out/qmv-run.err"
    echo "qmv: micro rc=$? after $((SECONDS - t0)) s: $(tail -n 1 "$out/qmv-run.err")"
    python3 "$here/qmv_bench.py" --report /tmp/qmv-trace.csv --plan "$out/qmv-plan.json" \
      >"$out/qmv-report.txt" 2>&1
    grep -v '^{' "$out/qmv-report.txt" ;;
  e2e)
    model="${2:?model dir}"
    wl="${WORKLOADS:-16:128,512:1}"
    declare -A seen=()
    for tier in ${TIERS:-l3 l1}; do
      flag=(); jit=0; fused=1; pipe=0; rope=1; fold=1; ops=()
      [[ $tier == l1 ]] && flag=(--exact)
      [[ $tier == l3jit ]] && jit=1
      [[ $tier == l3nofuse ]] && fused=0
      [[ $tier == l3pipe ]] && pipe=1
      [[ $tier == l3norope ]] && rope=0
      [[ $tier == l3nofold ]] && fold=0
      [[ $tier == l3ops* ]] && ops=(MLX_MAX_OPS_PER_BUFFER="${tier#l3ops}")
      seen[$tier]=$((${seen[$tier]:-0} + 1))
      name="$tier"; ((seen[$tier] > 1)) && name="$tier-${seen[$tier]}"
      timeout "$step" env LMX_CUDA_QMV_JIT=$jit LMX_CUDA_FUSED=$fused LMX_CUDA_QMV_PIPE=$pipe LMX_CUDA_QK_ROPE=$rope LMX_CUDA_NORM_FOLD=$fold "${ops[@]}" lmx bench --model "$model" --workloads "$wl" \
        --trials "${TRIALS:-3}" "${flag[@]}" >"$out/e2e-lmx-$name.jsonl" 2>"$out/e2e-lmx-$name.err"
      echo "qmv: lmx $name rc=$? after $((SECONDS - t0)) s"
      sed "s/^{/{\"run\": \"$name\", /" "$out/e2e-lmx-$name.jsonl"
    done
    timeout "$step" python3 "$here/mlx_lm_bench.py" "$model" --workloads "$wl" -n "${TRIALS:-3}" \
      >"$out/e2e-mlx-lm.jsonl" 2>"$out/e2e-mlx-lm.err"
    echo "qmv: mlx-lm rc=$? after $((SECONDS - t0)) s"
    cat "$out/e2e-mlx-lm.jsonl"
    # GGUF=path: llama.cpp's llama-bench on the same weights' GGUF (bench/gpu/prepare.sh's build).
    if [[ -n "${GGUF:-}" ]]; then
      timeout "$step" "${W:-/tmp/gpubench}/llama.cpp/build/bin/llama-bench" -m "$GGUF" -ngl 99 \
        -p 512 -n 128 -r "${TRIALS:-3}" -o jsonl >"$out/e2e-llama.jsonl" 2>"$out/e2e-llama.err"
      echo "qmv: llama.cpp rc=$? after $((SECONDS - t0)) s"
      cat "$out/e2e-llama.jsonl"
    fi ;;
  *) echo "usage: qmv.sh test | micro [ARGS] | e2e MODEL_DIR" >&2; exit 2 ;;
esac
