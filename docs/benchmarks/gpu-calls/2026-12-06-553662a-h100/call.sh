#!/usr/bin/env bash
# The planned device call (CALL_S seconds, 590 unless set), in order of need. Captured passes are
# on by default since 0c598bb; text parity, prefix reuse and chunking were checked with them on
# (gpu-calls/2026-12-06-9ec1406-h100, -cace793-h100), screenshots were not. This call:
#   1. the captured-pass GPU tests, the carried-pass and prefix-state GPU tests (Carry::allocate
#      changed at d4c5a82), and whole-model parity with the defaults;
#   2. gpu_vl_check.sh with --screenshot-cuda-graphs on: screenshot parity and latency with
#      captured passes on (the multimodal copy captures its own passes; off by default until this
#      passes);
#   3. gpu_mixed_load.sh (half text, half screenshots) with --screenshot-cuda-graphs on, if 150 s
#      are left, and /metrics' device memory summed over both language copies and the tower;
#   4. gpu_graphs_bench.sh around the rows where replays were slower than launched passes at
#      51581dd (300 ids: 304 rows, 2x300: 608 rows), if 100 s are left.
# Carries .carry (carry.tar.xz: bin/instinct, bin/instinct-loadtest, tests/captured_passes-test,
# tests/cuda_carried-test, tests/prefix_states-test), .cache/qwen-tokenizer, .cache/fixtures. Results in $OUT: call.log,
# tests.log, vl.tgz, mixed.tgz, graphs.tgz.
#   REV=<sha> [CALL_S=450] bash docs/benchmarks/gpu-calls/next/call.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
start_checkpoint
run_test captured_passes-test 120
run_test cuda_carried-test 90
run_test prefix_states-test 90
tests_summary
wait_checkpoint
parity
SERVE_FLAGS="--screenshot-cuda-graphs on" OUT=/tmp/vl timeout $(( $(left) - 10 < 200 ? $(left) - 10 : 200 )) bash tools/reference/gpu_vl_check.sh > /dev/null 2>&1
t "vl exit $?"
grep -E "vl_parity\]" /tmp/vl/gpu_vl_check.log | tail -2 >> $L
tar czf $OUT/vl.tgz --exclude=extras.tgz -C /tmp vl
if (( $(left) > 150 )); then
  SERVE_FLAGS="--screenshot-cuda-graphs on" OUT=/tmp/mixed REVISION=$REV timeout 140 bash tools/reference/gpu_mixed_load.sh > /dev/null 2>&1
  t "mixed exit $?"
  grep -E "^mixed_closed|image stages" /tmp/mixed/gpu_mixed_load.log >> $L
  grep -E "kind=\"(weights|activations|graphs)\"" /tmp/mixed/metrics.txt >> $L 2>/dev/null
  tar czf $OUT/mixed.tgz -C /tmp mixed
fi
if (( $(left) > 100 )); then
  OUT=/tmp/graphs REVISION=$REV RUNS=30 LENGTHS=256,288,300,304,320,384 BATCHES=2 \
    timeout $(( $(left) - 5 )) bash tools/reference/gpu_graphs_bench.sh > /dev/null 2>&1
  t "graphs bench exit $?"
  grep -E "^(bench|http)|probabilities" /tmp/graphs/summary.txt >> $L
  tar czf $OUT/graphs.tgz -C /tmp graphs
fi
t done
