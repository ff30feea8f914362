#!/usr/bin/env bash
# GPU machine, after scripts/gpu/unpack.sh: speculative decoding side by side (bench/spec_bench.py)
# on random Qwen3 weights in real shapes, 4-bit group 64 (bench/gpu/prepare.sh hf + mlx): the 8B
# shape as the target, the 0.6B shape as its draft (one vocabulary), and prompt lookup; peers
# mlx-lm (--draft-model) and, where `prepare.sh llama gguf` has run, llama.cpp (llama-completion,
# llama-lookup, llama-speculative on the Q4_0 GGUFs, all layers on the GPU). Random weights agree
# by chance only: the draft rows measure what a useless draft costs, not a draft's gain. So a
# second part (PAIR_EPS, default "0 0.1"; empty skips it) makes draft pairs that do agree: the 8B
# target with the o_proj and down_proj of its layers PAIR_LAYERS.. (default 4) scaled by each eps
# (`spec_bench.py --scale-tail`), drafted by its first PAIR_LAYERS layers (`--truncate`): eps 0
# agrees on every token, larger eps less often (the measured acceptance is in the table).
#   bench/gpu/spec.sh [spec_bench.py flags...]        (tables and JSON lines land in $OUT)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck disable=SC1091
. /tmp/lmx/env.sh
W="${W:-/tmp/gpubench}"
out="${OUT:-$W/out}"
mkdir -p "$out"
target="$W/mlx/qwen3-8b-4bit-g64" draft="$W/mlx/qwen3-0.6b-4bit-g64"
if [[ ! -f "$target/config.json" || ! -f "$draft/config.json" ]]; then
  MODELS=qwen3-0.6b,qwen3-8b MLX_GROUPS=64 bash "$here/prepare.sh" hf mlx || true
fi
[[ -f "$target/config.json" && -f "$draft/config.json" ]] ||
  { echo "spec.sh: preparing the models failed ($W/logs)" >&2; exit 1; }
llama=()
bin="$W/llama.cpp/build/bin"
if [[ -x "$bin/llama-speculative" && -f "$W/gguf/qwen3-8b-q4_0.gguf" &&
      -f "$W/gguf/qwen3-0.6b-q4_0.gguf" ]]; then
  llama=(--llama-cpp "$bin" --gguf "$W/gguf/qwen3-8b-q4_0.gguf"
         --draft-gguf "$W/gguf/qwen3-0.6b-q4_0.gguf" --ngl 99)
else
  echo "spec.sh: no llama.cpp build or GGUFs in $W: llama.cpp rows left out" >&2
fi
python3 "$root/bench/spec_bench.py" --model "$target" --draft "$draft" \
  --prompt-file "$root/bench/prompts/code_edit.txt" \
  --prompt-file "$root/bench/prompts/summarize.txt" \
  --lmx /tmp/lmx/bin/lmx --mlx-lm "${llama[@]}" --jsonl "$out/spec.jsonl" "$@" |
  tee "$out/spec.md"

pair_layers="${PAIR_LAYERS:-4}"
for eps in ${PAIR_EPS-0 0.1}; do
  t="$W/mlx/qwen3-8b-tail$eps" d="$W/mlx/qwen3-8b-first$pair_layers"
  python3 "$root/bench/spec_bench.py" --scale-tail "$target" "$pair_layers" "$eps" "$t"
  [[ -f "$d/config.json" ]] || python3 "$root/bench/spec_bench.py" --truncate "$t" "$pair_layers" "$d"
  python3 "$root/bench/spec_bench.py" --model "$t" --draft "$d" --lookup 0 \
    --prompt-file "$root/bench/prompts/summarize.txt" --rounds "${PAIR_ROUNDS:-2}" \
    --lmx /tmp/lmx/bin/lmx --mlx-lm --jsonl "$out/spec-pair.jsonl" "$@" | tee -a "$out/spec-pair.md"
  rm -rf "$t"
done
