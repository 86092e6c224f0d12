#!/usr/bin/env bash
# The next device call (written 2026-12-05 when the session's device time ran out): what landed
# after the last GPU run and was not measured.
#   1. cuda_vision (the flash bidirectional attention, its speed test with the padding fix),
#      vision_tiny on the GPU, cuda_ops' scatter_rows (image features put in place on the device);
#   2. the batch-invariant mode's cold warm-up after 5ca496e (first start, no tuning file, then a
#      second start with it): `warmed every batch size bucket ms=` of each;
#   2b. whole-model parity (`instinct check`, 84 questions) on the flash kernels as they are now;
#   3. tools/reference/gpu_vl_check.sh: real-shape screenshot parity and 1024x1024 latency with the
#      tower's attention on tensor cores and its kept position tables (the split of a miss into
#      preprocess and encode comes from the server's histograms).
# Results in $OUT: call.log, tests.log, check.json, vl.tgz. From the repository root, carrying .carry (bin:
# instinct, instinct-loadtest; tests: cuda_vision, vision_tiny), .cache/qwen-tokenizer and
# .cache/fixtures (real_shapes.py needs the fixtures):
#   REV=<sha> bash docs/benchmarks/gpu-calls/next/call.sh
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
run cuda_vision-test 90
run vision_tiny-test 60
run cuda_ops-test 60 scatter_rows
grep -E "^## |test result|panicked|FAILED|attention 4096|worst" $R >> $L
t wait-checkpoint; wait $CK; tail -1 /tmp/ckpt.log >> $L
t parity
timeout 90 .carry/bin/instinct check --model /tmp/real --text-adapter /tmp/real/adapter-text --device cuda:0 \
  --corpus docs/validation/real-shapes/corpus_ids.json --goldens docs/validation/real-shapes/real_goldens.json \
  --out $OUT/check.json > /tmp/check.log 2>&1; t "check exit $?"
grep -E "questions on|PASS|FAIL|Error" /tmp/check.log >> $L
for start in cold warm; do
  .carry/bin/instinct serve --model /tmp/real --text-adapter /tmp/real/adapter-text --device cuda:0 \
    --bind 127.0.0.1:8200 > /tmp/serve_$start.log 2>&1 &
  SP=$!
  for _ in $(seq 1 400); do curl -sf localhost:8200/readyz > /dev/null && break; sleep 0.5; done
  kill -TERM $SP; wait $SP
  t "$start start: $(sed 's/\x1b\[[0-9;]*m//g' /tmp/serve_$start.log | grep -oE 'warmed every batch size bucket.*ms=[0-9.]+|ready load_ms=[0-9.]+' | sed 's/row_counts=\[[^]]*\]//' | tr '\n' ' ')"
done
OUT=/tmp/vl timeout 330 bash tools/reference/gpu_vl_check.sh > /dev/null 2>&1
t "vl exit $?"
tail -25 /tmp/vl/gpu_vl_check.log >> $L
cp /tmp/serve_cold.log /tmp/serve_warm.log /tmp/vl/ 2>/dev/null
tar czf $OUT/vl.tgz -C /tmp vl
t done
