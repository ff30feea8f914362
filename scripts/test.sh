#!/usr/bin/env bash
# Builds lmx with its tests, generates the reference data with the real Python reference
# (mlx, mlx-lm, tokenizers, transformers from PyPI) and runs the suite with ctest.
#   scripts/test.sh [--sanitize address|undefined|thread] [ctest args...]
# --sanitize builds lmx and its tests again in build-<sanitizer> (address means ASan + UBSan) and
# runs ctest there on the same reference data; see docs/reliability.md.
# LMX_HEAVY=1 adds the slow checks (documented in docs/testing.md): the tests' heavy variants and,
# without --sanitize, an ASan + UBSan pass over the unit and model suites and every fuzzer of
# tests/fuzz for 3000 executions (bench/fuzz.sh).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
sanitize=""
if [[ "${1:-}" == --sanitize ]]; then
  sanitize="${2:-}"
  [[ "$sanitize" =~ ^(address|undefined|thread)$ ]] ||
    { echo "scripts/test.sh: --sanitize takes address, undefined or thread, got '$sanitize'" >&2; exit 2; }
  shift 2
fi
scripts/bootstrap.sh --test
source scripts/common.sh
build_lmx build -DLMX_BUILD_TESTS=ON
data="$root/build/testdata"
py="$root/.venv/bin/python"
mkdir -p "$data" "$root/.cache"
export LMX_TEST_DATA="$data"
# Each step prints the seconds since the script started (set-up and build included), so a slow
# run shows where its time went.
step() { echo "== [${SECONDS} s] $*"; }
step "tiny random models and mlx-lm reference logits"
"$py" scripts/gen_tiny_models.py "$data"
step "speculative decoding: tiny target/draft pairs and mlx-lm's speculative tokens"
"$py" scripts/gen_speculative.py "$data"
step "DFlash: a tiny Qwen3 target, random and briefly trained drafters, reference logits/tokens"
"$py" scripts/gen_dflash.py "$data"
step "tensor-parallel references (mlx-lm Model.shard under 2 ring processes)"
"$py" scripts/gen_tp_fixtures.py "$data"
step "Qwen3-Embedding reference embeddings"
"$py" scripts/gen_embed_fixtures.py "$data/embed"
step "JSON texts labelled by jsonschema"
"$py" scripts/gen_json_schema_fixtures.py "$data/json_schema"
step "sampler fixtures"
"$py" scripts/gen_sampler_fixtures.py "$data/sampler"
step "KV cache fixtures"
"$py" scripts/gen_cache_fixtures.py "$data/caches"
step "tokenizer fixtures"
"$py" scripts/gen_tokenizer_fixtures.py "$data/tokenizers" --cache "$root/.cache"
step "conversion fixtures"
"$py" scripts/gen_convert_fixtures.py "$data/convert" --cache "$root/.cache"
step "converted tokenizers against transformers' GGUF tokenizers"
"$py" scripts/check_convert_tokenizer.py "$root/build/lmx" "$data/convert"
step "Gemma 3 270M (its GGUF converted by lmx convert) and mlx-lm golden outputs"
rm -rf "$data/gemma3-270m"
"$root/build/lmx" convert --hf-path "$data/convert/gguf/gemma3.gguf" --mlx-path "$data/gemma3-270m" --quiet
"$py" scripts/gen_golden_gemma3.py "$data/gemma3-270m" "$data/golden-gemma3"
step "lmx serve fixtures (mlx_lm's tool-call parsers)"
"$py" scripts/gen_server_fixtures.py "$data/server"
step "default model (SmolLM2-135M-Instruct 4-bit) and mlx-lm golden outputs"
model="$(scripts/prepare_default_model.sh "$root/build/lmx" "$data/smollm2-135m-instruct-4bit")"
"$py" scripts/gen_golden.py "$model" "$data/golden"
"$py" scripts/gen_batch_golden.py "$model" "$data/golden"
step "LoRA adapters made with mlx-lm and its logits / greedy text with them loaded"
"$py" scripts/gen_lora_fixtures.py "$data/lora" --smollm2 "$model"
step "LoRA training and fuse references (mlx_lm.lora, mlx_lm.fuse on tiny models)"
"$py" scripts/gen_train_fixtures.py "$data/train"
step "DPO / ORPO references (the papers' losses over mlx-lm's model and LoRA, tiny llama)"
"$py" scripts/gen_pref_fixtures.py "$data/pref"
step "chat templates rendered by transformers' apply_chat_template"
"$py" scripts/gen_template_fixtures.py "$data/templates" --cache "$root/.cache" --model-dir "$model"
# A sanitizer build of lmx and its tests (build-address, ...) reading build/testdata.
sanitized_ctest() {
  local san="$1"; shift
  step "ctest under -fsanitize=$san (build-$san)"
  build_lmx "build-$san" -DLMX_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g -DNDEBUG" -DLMX_SANITIZE="$san" \
    -DLMX_TEST_DATA_DIR="$data"
  # halt_on_error: a UBSan report fails the test instead of scrolling by; MLX's own allocations
  # live until exit, so leak checking stays off (docs/reliability.md).
  (cd "build-$san" &&
    ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$root/tests/tsan.supp \
    ctest --output-on-failure --no-tests=error -j1 "$@")
}
if [[ -n "$sanitize" ]]; then
  sanitized_ctest "$sanitize" "$@"
  exit 0
fi
step "ctest"
(cd build && ctest --output-on-failure --no-tests=error -j1 "$@")
if [[ "${LMX_HEAVY:-0}" == 1 ]]; then
  sanitized_ctest address -L '^(unit|models)$'
  # Every libFuzzer target for a short fixed count (clang-14 build in build-fuzz; bench/fuzz.sh).
  step "fuzzers, 3000 executions each"
  bench/fuzz.sh -n 3000
fi
