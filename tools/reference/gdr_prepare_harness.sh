#!/usr/bin/env bash
# Builds and runs gdr_prepare_harness.cu on the GPU machine (nvcc, an sm_90 GPU): the DeltaNet
# chunk preparation's time per batch shape, its phases and waves; with REF_CU=path/to/delta_chunked.cu
# (another revision's) that kernel's time too and how many outputs differ from the served one's bit
# for bit; with PROFILE=1 Nsight Compute's full sections for one launch of the served kernel at
# 2 x 300 and one at 1,100 rows. The build log (registers, spills) and the results go to $OUT (or /tmp).
#   [REF_CU=...] [PROFILE=1] bash tools/reference/gdr_prepare_harness.sh
set -uo pipefail
OUT=${OUT:-/tmp}
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
cd "$(dirname "$0")"
# REF_CU: another revision's delta_chunked.cu, built beside with its names prefixed ref_ and
# compared bit for bit (its path absolute or from the repository root).
ref=()
if [[ -n ${REF_CU:-} ]]; then
  [[ $REF_CU = /* ]] || REF_CU=../../$REF_CU
  { echo '#include "prelude.cuh"'; sed 's/\bgdr_/ref_gdr_/g' "$REF_CU"; } > /tmp/gdr_ref.cu
  # prelude.cuh's non-inline device functions get a host stub in each file: one is kept.
  ref=(-DGDR_REF -I../../kernels/cuda /tmp/gdr_ref.cu -Xlinker --allow-multiple-definition)
fi
$NVCC -O3 -arch=sm_90a -std=c++17 -lineinfo -Xptxas -v -o /tmp/gdr_prepare_harness gdr_prepare_harness.cu \
  "${ref[@]}" > "$OUT/gdr_prepare_build.log" 2>&1
echo "build exit $?"
grep -E "error|gdr_prepare_conv|Used" "$OUT/gdr_prepare_build.log" | grep -B1 -A1 "gdr_prepare_conv" | head -8
grep -E "error" "$OUT/gdr_prepare_build.log" | head -10
timeout 120 /tmp/gdr_prepare_harness > "$OUT/gdr_prepare_harness.log" 2>&1
echo "harness exit $?"
cat "$OUT/gdr_prepare_harness.log"
if [[ ${PROFILE:-0} == 1 ]] && command -v ncu > /dev/null; then
  # The served kernel's launches per case: 1 reference + 3 warm-up + 20 timed + 1 marked; 2x300 is
  # the third case, 1,100 rows the fifth.
  for skip in 54 104; do
    timeout 90 ncu --set full --import-source no -k regex:^gdr_prepare_conv$ --launch-skip $skip --launch-count 1 \
      /tmp/gdr_prepare_harness > "$OUT/gdr_prepare_ncu_$skip.txt" 2>&1
    echo "ncu (skip $skip) exit $?"
  done
  # Per source line and per SASS instruction: executed instructions and stall samples (2 x 300).
  timeout 90 ncu --section SourceCounters --section WarpStateStats --section InstructionStats --import-source yes \
    -k regex:^gdr_prepare_conv$ --launch-skip 54 --launch-count 1 -f -o /tmp/gdr_prepare_src \
    /tmp/gdr_prepare_harness > /dev/null 2>&1
  echo "ncu source exit $?"
  for what in cuda sass; do
    ncu -i /tmp/gdr_prepare_src.ncu-rep --page source --csv --print-source $what > "$OUT/gdr_prepare_src_$what.csv" 2>&1
    echo "ncu source page ($what) exit $?"
  done
  gzip -f "$OUT"/gdr_prepare_src_*.csv
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
