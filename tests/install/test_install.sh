#!/usr/bin/env bash
# cmake --install into a temporary prefix, then a program configured with find_package(lmx) against
# that prefix only, built and run on the default test model: its greedy text must be what
# `lmx generate` prints for the same prompt. Usage: test_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$1"
src="$2"
model="${LMX_TEST_DATA:?}/smollm2-135m-instruct-4bit"
[[ -f "$model/config.json" ]] || { echo "missing test model $model (scripts/test.sh generates it)"; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
for f in include/lmx/lmx.h lib/cmake/lmx/lmxConfig.cmake lib/cmake/lmx/lmxConfigVersion.cmake \
         lib/cmake/lmx/lmxTargets.cmake bin/lmx; do
  [[ -e "$tmp/prefix/$f" ]] || { echo "FAIL: $f not installed"; exit 1; }
done
ls "$tmp/prefix"/lib/liblmx.so* >/dev/null || { echo "FAIL: liblmx.so not installed"; exit 1; }
# Only the installed tree: no path into the source or build directory.
cmake -S "$src/tests/install" -B "$tmp/app" -DCMAKE_PREFIX_PATH="$tmp/prefix" \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$tmp/app" >/dev/null
app="$tmp/app/lmx_install_check"
# ldd's output is captured first: `ldd | grep -q` under pipefail fails whenever grep's early exit
# makes ldd die of SIGPIPE (CI failure of stop 35).
libs="$(ldd "$app")"
grep -qF "$tmp/prefix/lib/liblmx.so" <<<"$libs" ||
  { echo "FAIL: the program does not load the installed liblmx.so:"; echo "$libs"; exit 1; }
prompt="The capital of France is"
got="$("$app" "$model" "$prompt" 12)"
want="$("$tmp/prefix/bin/lmx" generate --model "$model" --prompt "$prompt" --max-tokens 12)"
echo "find_package program: $got"
echo "lmx generate:         $want"
[[ -n "$got" ]] || { echo "FAIL: empty output"; exit 1; }
[[ "$got" == "$want" ]] || { echo "FAIL: outputs differ"; exit 1; }
echo "PASS"
