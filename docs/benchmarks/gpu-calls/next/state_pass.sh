#!/usr/bin/env bash
# A short device call (no checkpoint): the delta rule's state pass with 8 warps per 32 value columns
# (INSTINCT_STATE_PASS_WARPS=8) against the CPU reference (cuda_delta_chunked's chunked_ tests), then
# the chunked delta rule's time at 15,446, 712, 139 and 128 x 300 rows (its timing test) with 4 and 8
# warps, alternated twice. Carries .carry (tests/cuda_delta_chunked-test). Results in $OUT.
#   REV=<sha> CALL_S=150 bash docs/benchmarks/gpu-calls/next/state_pass.sh
source tools/reference/gpu_call.sh
export INSTINCT_STATE_PASS_WARPS=8
run_test cuda_delta_chunked-test ${TEST_S:-70} chunked_
unset INSTINCT_STATE_PASS_WARPS
tests_summary
for w in 4 8 4 8; do
  (( $(left) > 15 )) || break
  echo "## warps $w" >> $OUT/timing.log
  INSTINCT_STATE_PASS_WARPS=$w timeout $(( $(left) < 30 ? $(left) - 2 : 30 )) .carry/tests/cuda_delta_chunked-test --ignored --nocapture timing_ \
    >> $OUT/timing.log 2>&1
  t "timing, $w warps, exit $?"
  grep -E "chunked" $OUT/timing.log | tail -4 | sed "s/^/  $w warps: /" >> $CALL_LOG
done
t done
