#!/usr/bin/env bash
# GPU machine, after scripts/gpu/unpack.sh: the CUDA build's checks in one call (docs/gpu.md).
#   1. lmx_tests_unit's CudaQmm* (lmx's GEMV against a float32 reference and MLX's op), through
#      lmx's MLX primitive (the default), with UNIT_JIT=1 also through mx::fast::cuda_kernel
#      (LMX_CUDA_QMV_JIT=1: NVRTC compiles each layout, a minute or more);
#   2. mlx-lm's reference on the GPU for ROWS (gen_tiny_models.py --device gpu), then
#      lmx_tests_models: L1 parity (Rows/Parity.*, bit-exact with mlx-lm) and tier L3's gates
#      against L1 on the GPU (Rows/CudaTiers.*: teacher-forced KL <= 1e-3, top-1 >= 99%, greedy).
#   3. with PIPE=1, steps 1 and 2's tier gates again on the kernels' software-pipelined build
#      (LMX_CUDA_QMV_PIPE=1).
# Logs go to $OUT (or /tmp); the last lines are a summary.
# Environment: ROWS (default: the 16-byte aligned quantized rows and two float rows),
# LMX_TEST_DATA (default /tmp/testdata), GEN_TIMEOUT / TEST_TIMEOUT (seconds).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. "${LMX_GPU_PREFIX:-/tmp/lmx}/env.sh" || { echo "test: run scripts/gpu/unpack.sh first" >&2; exit 1; }
export LMX_TEST_DATA="${LMX_TEST_DATA:-/tmp/testdata}" PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
out="${OUT:-/tmp}"
t0=$SECONDS
rows=(${ROWS:-llama_a512_q4_g64 llama_a512_q4_g32 llama_a512_q8_g64 llama_a1024_f16_q4_g128
  qwen2_a512_q4_g64 qwen3_a512_q4_g64 gemma3_text_a512_q4_g64 llama_tied qwen3_tied})
status=0
summary=()
gtest_counts() { grep -E '^\[  PASSED  \]|^\[  FAILED  \] [0-9]+ test' "$1" | tr '\n' ' '; }

jits=(0); [[ "${UNIT_JIT:-0}" == 1 ]] && jits+=(1)
for jit in "${jits[@]}"; do
  log="$out/test-unit-jit$jit.log"
  timeout "${TEST_TIMEOUT:-300}" env LMX_CUDA_QMV_JIT=$jit lmx_tests_unit \
    --gtest_filter='*CudaQmm*:*CudaQkRope*' --gtest_brief=1 >"$log" 2>&1
  rc=$?; ((rc)) && status=1
  summary+=("unit CudaQmm (LMX_CUDA_QMV_JIT=$jit): rc=$rc $(gtest_counts "$log")")
  echo "test: unit jit=$jit rc=$rc after $((SECONDS - t0)) s"
done

timeout "${GEN_TIMEOUT:-300}" python3 scripts/gen_tiny_models.py "$LMX_TEST_DATA" --device gpu \
  --rows "${rows[@]}" >"$out/test-gen.log" 2>&1
rc=$?
echo "test: reference rc=$rc after $((SECONDS - t0)) s: $(tail -n 1 "$out/test-gen.log")"
if ((rc)); then
  tail -n 20 "$out/test-gen.log"; status=1
else
  filter="" tiers=""
  for r in "${rows[@]}"; do
    filter+="${filter:+:}Rows/Parity.*/$r:Rows/CudaTiers.*/$r"
    tiers+="${tiers:+:}Rows/CudaTiers.*/$r"
  done
  log="$out/test-models.log"
  timeout "${TEST_TIMEOUT:-300}" lmx_tests_models --gtest_filter="$filter" --gtest_brief=1 >"$log" 2>&1
  rc=$?; ((rc)) && status=1
  summary+=("models Parity + CudaTiers: rc=$rc $(gtest_counts "$log")")
  echo "test: models rc=$rc after $((SECONDS - t0)) s"
  grep '^\[ gate \]' "$log"
  grep -B2 -A8 'Failure' "$log" | cut -c1-240 | head -n 60
  if [[ "${PIPE:-0}" == 1 ]]; then
    log="$out/test-unit-pipe.log"
    timeout "${TEST_TIMEOUT:-300}" env LMX_CUDA_QMV_PIPE=1 lmx_tests_unit \
      --gtest_filter='*CudaQmm*:*CudaQkRope*' --gtest_brief=1 >"$log" 2>&1
    rc=$?; ((rc)) && status=1
    summary+=("unit CudaQmm (LMX_CUDA_QMV_PIPE=1): rc=$rc $(gtest_counts "$log")")
    grep -B2 -A8 'Failure' "$log" | cut -c1-240 | head -n 30
    log="$out/test-models-pipe.log"
    timeout "${TEST_TIMEOUT:-300}" env LMX_CUDA_QMV_PIPE=1 lmx_tests_models \
      --gtest_filter="$tiers" --gtest_brief=1 >"$log" 2>&1
    rc=$?; ((rc)) && status=1
    summary+=("models CudaTiers (LMX_CUDA_QMV_PIPE=1): rc=$rc $(gtest_counts "$log")")
    echo "test: pipe rc=$rc after $((SECONDS - t0)) s"
    grep '^\[ gate \]' "$log"
    grep -B2 -A8 'Failure' "$log" | cut -c1-240 | head -n 30
  fi
fi
echo "test: summary after $((SECONDS - t0)) s"
printf '  %s\n' "${summary[@]}"
exit $status
