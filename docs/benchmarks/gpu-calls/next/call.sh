#!/usr/bin/env bash
# The planned device call (CALL_S seconds, 590 unless set), for issue 19's long mix: does holding
# chunks back behind short questions (`--chunk-defer-ms`, added after f861373; CPU-tested only)
# bring the mix's p99 beside ~14,500-token questions within 1.5x of its p99 alone? Two runs of one
# setting have differed by ~25 ms at p99 (9ec1406, cace793), so the settings alternate, twice each:
#   chunked (chunks of 1,024 beside the short questions, as today), defer40 (--chunk-defer-ms 40),
#   chunked, defer40; then defer100 once if time is left.
# Each run is gpu_prefix_bench.sh's bench stage on the chunked server (the mix alone, the mix
# beside the long questions, and the long questions' own latency).
# Carries .carry (carry.tar.xz: bin/instinct, bin/instinct-loadtest), .cache/qwen-tokenizer,
# .cache/fixtures.
#   REV=<sha> [CALL_S=450] bash docs/benchmarks/gpu-calls/next/call.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
start_checkpoint
wait_checkpoint
for run in chunked defer40 chunked2 defer40b defer100; do
  (( $(left) > 75 )) || break
  case $run in
    chunked*) flags="" ;;
    defer40*) flags="--chunk-defer-ms 40" ;;
    defer100) flags="--chunk-defer-ms 100" ;;
  esac
  OUT=/tmp/$run SERVERS=chunked STAGES=bench CHUNK=1024 CHUNK_FLAGS="$flags" REVISION=$REV \
    timeout $(( $(left) - 5 < 90 ? $(left) - 5 : 90 )) bash tools/reference/gpu_prefix_bench.sh > /dev/null 2>&1
  t "$run ($flags) exit $?"
  grep -E "^long_chunked|^long chunked" /tmp/$run/gpu_prefix_bench.log >> $L
  tar czf $OUT/$run.tgz --exclude=workloads -C /tmp $run
done
t done
