#!/usr/bin/env bash
# Builds and runs gdr_prepare_harness.cu on the GPU machine (nvcc, an sm_90 GPU): the DeltaNet
# chunk preparation's time per batch shape, its phases and waves, variants' bits against the served
# kernel; with PROFILE=1 also Nsight Compute's full sections for one launch at 2 x 300 and one at
# 1,100 rows. The build log (registers, spills) and the results go to $OUT (or /tmp).
#   [PROFILE=1] bash tools/reference/gdr_prepare_harness.sh
set -uo pipefail
OUT=${OUT:-/tmp}
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
cd "$(dirname "$0")"
$NVCC -O3 -arch=sm_90a -std=c++17 -lineinfo -Xptxas -v -o /tmp/gdr_prepare_harness gdr_prepare_harness.cu \
  > "$OUT/gdr_prepare_build.log" 2>&1
echo "build exit $?"
grep -E "error|gdr_prepare_conv|Used" "$OUT/gdr_prepare_build.log" | grep -B1 -A1 "gdr_prepare_conv" | head -8
grep -E "error" "$OUT/gdr_prepare_build.log" | head -10
timeout 120 /tmp/gdr_prepare_harness > "$OUT/gdr_prepare_harness.log" 2>&1
echo "harness exit $?"
cat "$OUT/gdr_prepare_harness.log"
if [[ ${PROFILE:-0} == 1 ]] && command -v ncu > /dev/null; then
  # Launches per case: 1 reference + 3 warm-up + 20 timed + 1 marked (25); 2x300 is the third
  # case, 1,100 rows the fifth.
  for skip in 54 104; do
    timeout 90 ncu --set full --import-source no -k regex:gdr_prepare_conv --launch-skip $skip --launch-count 1 \
      /tmp/gdr_prepare_harness > "$OUT/gdr_prepare_ncu_$skip.txt" 2>&1
    echo "ncu (skip $skip) exit $?"
  done
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
