#!/usr/bin/env bash
# The main job on a fresh machine: install what is missing, build Release, prepare the default
# model (SmolLM2-135M-Instruct, GGUF -> MLX 4-bit by lmx convert) and generate from a prompt.
#   scripts/run.sh ["your prompt"] [extra lmx generate flags...]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
scripts/bootstrap.sh
source scripts/common.sh
build_lmx build -DLMX_BUILD_TESTS=OFF >/dev/null
model="$(scripts/prepare_default_model.sh "$root/build/lmx")"
prompt="${1:-What is the capital of France? Answer in one sentence.}"
shift || true
# SmolLM2-Instruct is a ChatML model; chat templates arrive with `lmx chat`/`serve`.
chatml="<|im_start|>user
${prompt}<|im_end|>
<|im_start|>assistant
"
build/lmx generate --model "$model" --prompt "$chatml" --max-tokens 128 --verbose "$@"
