#!/usr/bin/env bash
# Builds and runs skinny_gemm_harness.cu on the GPU machine (nvcc, an sm_90 GPU): a GEMM of our own
# for few rows against cuBLASLt's batch-invariant reference on the language model's five shapes,
# bit for bit and timed. The build log (registers, spills) and the results go to $OUT (or /tmp).
#   bash tools/reference/skinny_gemm_harness.sh [rows ...]     # 139 64 17 unless given
set -uo pipefail
OUT=${OUT:-/tmp}
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
cd "$(dirname "$0")"
$NVCC -O3 -arch=sm_90a -std=c++17 -lineinfo -Xptxas -v -o /tmp/skinny_gemm_harness skinny_gemm_harness.cu \
  -lcublasLt > "$OUT/skinny_gemm_build.log" 2>&1
echo "build exit $?"
grep -E "error|spill" "$OUT/skinny_gemm_build.log" | grep -v " 0 bytes spill" | head -20
timeout 90 /tmp/skinny_gemm_harness "$@" > "$OUT/skinny_gemm_harness.log" 2>&1
echo "harness exit $?"
cat "$OUT/skinny_gemm_harness.log"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
