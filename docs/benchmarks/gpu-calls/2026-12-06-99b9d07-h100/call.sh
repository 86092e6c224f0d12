#!/usr/bin/env bash
# The planned device call (CALL_S seconds, 590 unless set), after snapshots are cut out of a pass
# by one copy_many too (and `7d796fb`'s tuner and `aeb7e13`'s staging are in):
#   1. the GPU tests of carried ops, captured passes and prefix states;
#   2. parity, and its bits against ffe6daf's report;
#   3. gpu_vl_check.sh: screenshot parity through the server (every question resumes from the
#      system turn and image, snapshots taken on the way) and the 1024x1024 latencies (issue 20:
#      hit 1q 9.30 ms at ffe6daf, target 8);
#   4. gpu_prefix_bench.sh's exactness stage (reuse and chunks against off), if time is left;
#   5. gpu_load.sh (load_stage) as at 7d796fb, if time is left;
#   6. gemm_sweep.sh: each GEMM candidate's time at rows 520-768, tuned at each row count (at
#      7d796fb a 648-row forward took 10.4-10.9 ms with its own winner, ~12.4 with the server's,
#      timed at 768), if time is left.
# Carries .carry (carry.tar.xz: bin/instinct, bin/instinct-loadtest, tests/cuda_carried-test,
# tests/captured_passes-test, tests/prefix_states-test), .cache/qwen-tokenizer, .cache/fixtures.
# Not run at b4e2aab: the session's device time was spent. Run it first next time, at the head.
#   REV=<sha> [CALL_S=420] bash docs/benchmarks/gpu-calls/next/call.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
start_checkpoint
run_test cuda_carried-test 120
run_test captured_passes-test 120
tests_summary
wait_checkpoint
run_test prefix_states-test 120
grep -E "^## .*prefix|test result|panicked|FAILED" "$TESTS_LOG" | tail -3 >> $L
parity
same_bits_as 2026-12-06-ffe6daf-h100
OUT=/tmp/vl timeout $(( $(left) - 10 < 120 ? $(left) - 10 : 120 )) bash tools/reference/gpu_vl_check.sh > /dev/null 2>&1
t "vl exit $?"
grep -E "vl_parity\]" /tmp/vl/gpu_vl_check.log | tail -3 >> $L
tar czf $OUT/vl.tgz --exclude=extras.tgz -C /tmp vl
if (( $(left) > 70 )); then
  OUT=/tmp/prefix REVISION=$REV STAGES=parity timeout $(( $(left) - 5 )) bash tools/reference/gpu_prefix_bench.sh > /dev/null 2>&1
  t "prefix exit $?"
  sed -n '/exactness against off/,$p' /tmp/prefix/gpu_prefix_bench.log >> $L
  tar czf $OUT/prefix.tgz --exclude=workloads -C /tmp prefix
fi
load_stage
if (( $(left) > 90 )); then
  OUT=/tmp/sweep timeout $(( $(left) - 5 )) bash tools/reference/gemm_sweep.sh > /dev/null 2>&1
  t "sweep exit $?"
  tar czf $OUT/sweep.tgz -C /tmp sweep
fi
t done
