#!/usr/bin/env bash
# GPU machine, run in the background (setsid) while other device calls go on: builds llama.cpp and
# makes the benchmark models. Everything lands in $W (default /tmp/gpubench); each step leaves a
# marker $W/done.<step> and logs to $W/logs/<step>.log, so a later call waits on the markers.
#   bench/gpu/prepare.sh llama   llama.cpp (sdist of llama-cpp-python, .gpu/llama-src.tar.xz)
#                                for sm_90: llama-bench, llama-quantize, llama-completion,
#                                llama-lookup, llama-speculative
#   bench/gpu/prepare.sh hf      random bf16 checkpoints (bench/gpu/make_models.py, torch)
#   bench/gpu/prepare.sh gguf    convert_hf_to_gguf.py bf16 -> llama-quantize Q8_0 and Q4_0
#   bench/gpu/prepare.sh mlx     mlx_lm.convert -q 4-bit group 64 and 32 (needs /tmp/lmx/env.sh)
# Environment: MODELS (default qwen3-0.6b,qwen3-4b,qwen3-8b), W, MLX_GROUPS (the mlx step's group
# sizes, default "64 32").
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
W="${W:-/tmp/gpubench}"
MODELS="${MODELS:-qwen3-0.6b,qwen3-4b,qwen3-8b}"
mkdir -p "$W/logs" "$W/hf" "$W/gguf" "$W/mlx"
export NCCL_NVLS_ENABLE=0
log() { echo "[prepare $(date +%T)] $*"; }
wait_for() { while [[ ! -e "$W/done.$1" ]]; do [[ -e "$W/failed.$1" ]] && return 1; sleep 2; done; }
run_step() {
  local step="$1"; shift
  rm -f "$W/done.$step" "$W/failed.$step"
  if "$@" >"$W/logs/$step.log" 2>&1; then touch "$W/done.$step"; else touch "$W/failed.$step"; fi
}

step_llama() {
  cd "$W" || return 1
  rm -rf llama.cpp && tar xJf "$root/.gpu/llama-src.tar.xz"
  cd llama.cpp || return 1
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF
  # Only these targets build: the speed rows, the GGUF conversions, and the speculative peers.
  cmake --build build -j"$(nproc)" --target llama-bench llama-quantize llama-completion \
    llama-lookup llama-speculative
  ls -la build/bin
}

step_hf() {
  python3 "$here/make_models.py" "$W/hf" --tokenizer "$root/.gpu/tok" --models "$MODELS"
}

step_gguf() {
  wait_for llama || { echo "llama.cpp build failed"; return 1; }
  local lc="$W/llama.cpp" m
  for m in ${MODELS//,/ }; do
    [[ -f "$W/gguf/$m-q4_0.gguf" ]] && continue
    PYTHONPATH="$lc/gguf-py" python3 "$lc/convert_hf_to_gguf.py" "$W/hf/$m" --outtype bf16 \
      --outfile "$W/gguf/$m-bf16.gguf" || return 1
    "$lc/build/bin/llama-quantize" "$W/gguf/$m-bf16.gguf" "$W/gguf/$m-q8_0.gguf" Q8_0 || return 1
    "$lc/build/bin/llama-quantize" "$W/gguf/$m-bf16.gguf" "$W/gguf/$m-q4_0.gguf" Q4_0 || return 1
    rm -f "$W/gguf/$m-bf16.gguf"
    log "gguf $m done"; df -h "$W" | tail -1
  done
}

step_mlx() {
  # shellcheck disable=SC1091
  . /tmp/lmx/env.sh
  local m g
  for m in ${MODELS//,/ }; do
    for g in ${MLX_GROUPS:-64 32}; do
      [[ -f "$W/mlx/$m-4bit-g$g/config.json" ]] && continue
      python3 -m mlx_lm convert --hf-path "$W/hf/$m" --mlx-path "$W/mlx/$m-4bit-g$g" -q \
        --q-bits 4 --q-group-size "$g" || return 1
      cp "$W/hf/$m/tokenizer.json" "$W/hf/$m/tokenizer_config.json" "$W/mlx/$m-4bit-g$g/"
    done
    log "mlx $m done"; df -h "$W" | tail -1
  done
}

for step in "$@"; do
  case "$step" in
    llama) run_step llama step_llama ;;
    hf) run_step hf step_hf ;;
    gguf) wait_for hf && run_step gguf step_gguf ;;
    mlx) wait_for hf && run_step mlx step_mlx ;;
    *) echo "prepare: unknown step $step" >&2; exit 2 ;;
  esac
  for f in "$W/done.$step" "$W/failed.$step"; do [[ -e "$f" ]] && log "${f##*/}"; done
done
