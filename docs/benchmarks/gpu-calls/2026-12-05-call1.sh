#!/usr/bin/env bash
# First device call of the 2026-12-05 evening session: the GPU tests of the resume grid, the
# batch-invariant mode and the prefix form's split last row; whole-model parity; then
# tools/reference/gpu_invariance.sh (the fixtures alone vs beside load, three servers). Results in
# $OUT: call.log, tests.log, check.json, invariance.tgz. Run from the repository root on the GPU
# machine, carrying .carry, .cache/qwen-tokenizer and .cache/fixtures:
#   REV=<sha> bash docs/benchmarks/gpu-calls/2026-12-05-call1.sh
export INSTINCT_CUDA_HOME=/usr/local/cuda HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
L=$OUT/call.log
R=$OUT/tests.log
T0=$(date +%s); t() { echo "=== [$(( $(date +%s) - T0 )) s] $*" >> $L; }
t "rev $REV; $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i 0)"
( .carry/bin/instinct build-tokenizer --vocab .cache/qwen-tokenizer/qwen3_6.tiktoken --out /tmp/tokenizer.json > /tmp/ckpt.log 2>&1
  cd tools/reference && timeout 150 python3 real_shapes.py --out /tmp/real --tokenizer-json /tmp/tokenizer.json >> /tmp/ckpt.log 2>&1
  echo "ckpt exit $?" >> /tmp/ckpt.log ) &
CK=$!
run() {  # run TEST-EXECUTABLE SECONDS [FILTER/SKIP ARGS]
  local T=.carry/tests/$1 s=$2; shift 2
  echo "## $T $*" >> $R
  timeout $s $T --ignored --test-threads=1 --nocapture "$@" >> $R 2>&1; t "$1 exit $?"
}
run cuda_carried-test 90
run prefix_states-test 60
run cuda_batch_invariance-test 150
run cuda_attention-test 60 --skip flash_attention_throughput --skip flash_matches_cpu_on_a_long_sequence
run cuda_gemm_tuning-test 90
run vision_tiny-test 40
t wait-checkpoint; wait $CK; tail -2 /tmp/ckpt.log >> $L
t parity
timeout 60 .carry/bin/instinct check --model /tmp/real --text-adapter /tmp/real/adapter-text --device cuda:0 \
  --corpus docs/validation/real-shapes/corpus_ids.json --goldens docs/validation/real-shapes/real_goldens.json \
  --out $OUT/check.json > /tmp/check.log 2>&1; t "check exit $?"
grep -E "questions on|PASS|FAIL|Error" /tmp/check.log >> $L
grep -E "^## |test result|panicked|FAILED|resumed vs whole|largest|worst|cuts |identical|differ|mode off" $R >> $L
t invariance
LEFT=$(( 570 - ($(date +%s) - T0) )); (( LEFT > 330 )) && LEFT=330
OUT=/tmp/invariance REVISION=$REV timeout $LEFT bash tools/reference/gpu_invariance.sh > /dev/null 2>&1
t "invariance exit $?"
cat /tmp/invariance/summary.json >> $L 2>/dev/null
tar czf $OUT/invariance.tgz -C /tmp invariance
t done
