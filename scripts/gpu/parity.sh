#!/usr/bin/env bash
# GPU machine, after scripts/gpu/unpack.sh: L1 parity on CUDA. mlx-lm's reference logits are
# computed on the GPU (gen_tiny_models.py --device gpu: parity holds per backend), then lmx's
# parity rows run against them. Logs go to $OUT (or /tmp). See docs/gpu.md.
#   scripts/gpu/parity.sh [ROW...]      default: every row of scripts/gen_tiny_models.py
# Environment: LMX_TEST_DATA (default /tmp/testdata), GEN_TIMEOUT / TEST_TIMEOUT (seconds).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. "${LMX_GPU_PREFIX:-/tmp/lmx}/env.sh" || { echo "parity: run scripts/gpu/unpack.sh first" >&2; exit 1; }
export LMX_TEST_DATA="${LMX_TEST_DATA:-/tmp/testdata}" PYTHONUNBUFFERED=1
out="${OUT:-/tmp}"
t0=$SECONDS
gen=(python3 scripts/gen_tiny_models.py "$LMX_TEST_DATA" --device gpu)
filter='Rows/Parity.*'
if (($#)); then
  gen+=(--rows "$@")
  filter=""
  for r in "$@"; do filter+="${filter:+:}Rows/Parity.*/$r"; done
fi
timeout "${GEN_TIMEOUT:-400}" "${gen[@]}" >"$out/parity-gen.log" 2>&1
rc=$?
echo "parity: reference rc=$rc after $((SECONDS - t0)) s: $(tail -n 1 "$out/parity-gen.log")"
((rc == 0)) || { tail -n 20 "$out/parity-gen.log"; exit 1; }
timeout "${TEST_TIMEOUT:-400}" lmx_tests_models --gtest_filter="$filter" --gtest_brief=1 \
  >"$out/parity-test.log" 2>&1
rc=$?
echo "parity: lmx_tests_models rc=$rc after $((SECONDS - t0)) s"
grep -E '^\[  (PASSED|FAILED)|^\[  FAILED|tests? ran' "$out/parity-test.log" | tail -n 40
grep -B2 -A8 'Failure' "$out/parity-test.log" | cut -c1-240 | head -n 60
exit $rc
