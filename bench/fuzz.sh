#!/usr/bin/env bash
# Runs the libFuzzer targets of tests/fuzz (docs/reliability.md) for a fixed number of executions.
#   bench/fuzz.sh [-n RUNS] [-t SECONDS] [target ...]   (default: every target, 1000000 runs each;
#                                                       -t also stops each target after SECONDS)
# Installs clang-14 if missing (scripts/bootstrap.sh --fuzz), builds the targets in build-fuzz
# (-DLMX_FUZZ=ON: ASan + UBSan + libFuzzer). Each target starts from its seed corpus (build-fuzz/seeds/<target>,
# made by scripts/gen_fuzz_seeds.py with the real libraries) plus what earlier runs found
# (build-fuzz/corpus/<target>); a crash, leak, timeout (10 s per input) or out-of-memory (2 GiB)
# stops that target, leaves the input in build-fuzz/artifacts/<target>/ and fails the script.
# Prints one line per target: executions, seconds, coverage, corpus size and the result.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
runs=1000000
secs_limit=0
while getopts "n:t:" o; do
  case "$o" in
    n) runs="$OPTARG" ;;
    t) secs_limit="$OPTARG" ;;
    *) echo "usage: bench/fuzz.sh [-n RUNS] [-t SECONDS] [target ...]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
scripts/bootstrap.sh --fuzz
source scripts/common.sh
cxx="${LMX_FUZZ_CXX:-clang++-14}"
build="$root/build-fuzz"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g" \
  -DCMAKE_CXX_COMPILER="$cxx" -DLMX_FUZZ=ON -DLMX_BUILD_TESTS=OFF \
  -DMLX_DIR="$(mlx_cmake_dir cpu)" >/dev/null
seeds="$build/seeds"
[[ -d "$seeds" ]] || "$root/.venv/bin/python" scripts/gen_fuzz_seeds.py "$seeds"
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  for d in "$seeds"/*/; do targets+=("$(basename "$d")"); done
fi
cmake --build "$build" -j"$(nproc)" --target "${targets[@]/#/lmx_fuzz_}"

# Leak checking is on: every target's code runs on the calling thread, and what MLX keeps for the
# process (allocator caches, the stream thread) is made once, before libFuzzer's leak check.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
failed=0
printf '%-22s %10s %8s %7s %7s  %s\n' target runs seconds cov corpus result
for t in "${targets[@]}"; do
  corpus="$build/corpus/$t"
  art="$build/artifacts/$t"
  mkdir -p "$corpus" "$art"
  log="$build/fuzz-$t.log"
  start=$(date +%s)
  rc=0
  "$build/tests/fuzz/lmx_fuzz_$t" -runs="$runs" -max_total_time="$secs_limit" -timeout=10 -rss_limit_mb=2048 \
    -max_len=65536 -print_final_stats=1 -artifact_prefix="$art/" "$corpus" \
    "$seeds/$t" >"$log" 2>&1 || rc=$?
  secs=$(($(date +%s) - start))
  done_runs=$(grep -oE 'Done [0-9]+ runs' "$log" | grep -oE '[0-9]+' || true)
  [[ -n "$done_runs" ]] || done_runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" |
    grep -oE '[0-9]+$' || echo "?")
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+' || echo "?")
  ncorp=$(find "$corpus" -type f | wc -l)
  if [[ $rc -eq 0 ]]; then
    result=ok
  else
    failed=1
    result="FAILED rc=$rc ($(grep -m1 -oE 'ERROR: [A-Za-z]+: [a-z-]+|unexpected exception: .{0,60}|ERROR: libFuzzer: [a-z-]+' "$log" || echo see log)): $log"
  fi
  printf '%-22s %10s %8s %7s %7s  %s\n' "$t" "$done_runs" "$secs" "$cov" "$ncorp" "$result"
done
exit $failed
