#!/usr/bin/env bash
# Call 3 (binary: exact buckets to 2,048 rows, 32 compared rows, the tuner's phase times logged;
# no INSTINCT_GEMM_EXACT_ROWS yet). Carried: bin/instinct, bin/instinct-loadtest and the tests
# captured_passes, cuda_gemm_tuning, cuda_batch_invariance.
#   REV=99b9d07+exact CALL_S=560 bash call.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
start_checkpoint
run_test cuda_gemm_tuning-test 120
run_test captured_passes-test 150
tests_summary
wait_checkpoint
start() {
  local t0; t0=$(date +%s)
  INSTINCT_LOG=info,instinct_kernels::cuda::blas=debug .carry/bin/instinct serve --model /tmp/real \
    --text-adapter /tmp/real/adapter-text --device cuda:0 --bind 127.0.0.1:8124 > "$OUT/$1.log" 2>&1 &
  local pid=$!
  until curl -sf http://127.0.0.1:8124/readyz > /dev/null; do
    if ! kill -0 $pid 2> /dev/null || (( $(date +%s) - t0 > 240 )); then break; fi
    sleep 0.2
  done
  t "$1 ready after $(( $(date +%s) - t0 )) s"
  grep -E "warm-up forwards run" "$OUT/$1.log" | sed 's/row_counts=\[[^]]*\]//' | tail -1 >> $L
  kill $pid; wait $pid 2> /dev/null
  gzip -f "$OUT/$1.log"
}
start first_start
start second_start
OUT=/tmp/fwd timeout 120 .carry/bin/instinct bench --model /tmp/real --text-adapter /tmp/real/adapter-text \
  --device cuda:0 --lengths 304,456,648,904,1048,1304,1704,2248,3304 --batch-sizes 1 --batch-prompt-tokens 16 \
  --runs 10 --batch-runs 3 --warmup 2 --out $OUT/bench_exact.json > /tmp/bench_exact.log 2>&1
t "bench exit $?"
grep -E "^\[bench\] latency" /tmp/bench_exact.log >> $L
parity
same_bits_as 2026-12-06-99b9d07-h100
load_stage
if (( $(left) > 60 )); then
  run_test cuda_batch_invariance-test $(( $(left) - 10 ))
  grep -E "^## .*invariance|test result|panicked|FAILED" "$TESTS_LOG" | tail -3 >> $L
fi
t done
