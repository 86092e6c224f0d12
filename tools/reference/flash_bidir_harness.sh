#!/usr/bin/env bash
# Builds and runs flash_bidir_harness.cu on the GPU machine (nvcc, an sm_90 GPU): the vision
# attention kernels against an f64 reference and each other, and their times. The build log
# (registers, spills) and the results go to $OUT (or /tmp).
#   bash tools/reference/flash_bidir_harness.sh
set -uo pipefail
OUT=${OUT:-/tmp}
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
cd "$(dirname "$0")"
$NVCC -O3 -arch=sm_90a -std=c++17 -lineinfo -Xptxas -v -o /tmp/flash_bidir_harness flash_bidir_harness.cu \
  > "$OUT/flash_bidir_build.log" 2>&1
echo "build exit $?"
grep -E "error|Used" "$OUT/flash_bidir_build.log" | head -20
timeout 120 /tmp/flash_bidir_harness > "$OUT/flash_bidir_harness.log" 2>&1
echo "harness exit $?"
cat "$OUT/flash_bidir_harness.log"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
