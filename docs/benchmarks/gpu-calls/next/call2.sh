#!/usr/bin/env bash
# Second call of the session: the captured-pass GPU tests (which padding of a carried pass moves
# its bits), then forward latency with graphs off and on at row counts on a captured shape's size
# (16, 128, 256, 384: no padding, the graph alone) and off it (139, 300: padded).
#   REV=<sha> [CALL_S=300] bash docs/benchmarks/gpu-calls/next/call2.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
start_checkpoint
run_test captured_passes-test 150
grep -E "max \|dp\||panicked|differ|test result" "$TESTS_LOG" >> $L
wait_checkpoint
OUT=/tmp/graphs2 REVISION=$REV RUNS=30 STAGES=forward LENGTHS=16,128,139,256,300,384 BATCHES=4 \
  timeout $(( $(left) - 10 )) bash tools/reference/gpu_graphs_bench.sh > /tmp/graphs2.log 2>&1
t "graphs bench exit $?"
grep -E "^bench|probabilities" /tmp/graphs2/summary.txt >> $L
tar czf $OUT/graphs2.tgz -C /tmp graphs2
t done
