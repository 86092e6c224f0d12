#!/usr/bin/env bash
# The session's last device call: the vision tower's fused bias/GELU/LayerNorm passes and wide
# attention layout, the tokenizer loaded beside the weights, on one GPU:
#   1. cuda_vision (fused ops bit for bit against the separate ones, both attention layouts the
#      same bits, the speed of each at one screenshot), vision_tiny and cuda_gemm_tuning on the
#      GPU, cuda_ops;
#   2. whole-model parity (84 questions);
#   3. a first start (no tuning file) and a second one: the start-up phases;
#   4. tools/reference/gpu_vl_check.sh (screenshot parity and 1024x1024 latency);
#   5. tools/reference/gpu_mixed_load.sh, the mixed runs only.
# Carries .carry (bin: instinct, instinct-loadtest; tests: cuda_vision, vision_tiny, cuda_ops,
# cuda_gemm_tuning), .cache/qwen-tokenizer, .cache/fixtures. Results in $OUT: call.log,
# tests.log, check.json, starts.tgz, vl.tgz, mixed.tgz.
#   REV=<sha> bash docs/benchmarks/gpu-calls/next/call_final.sh
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
run cuda_vision-test 120
run vision_tiny-test 60
run cuda_ops-test 90
run cuda_gemm_tuning-test 90
grep -E "^## |test result|panicked|FAILED|attention 4096|worst" $R >> $L
t wait-checkpoint; wait $CK; tail -1 /tmp/ckpt.log >> $L
t parity
timeout 90 .carry/bin/instinct check --model /tmp/real --text-adapter /tmp/real/adapter-text --device cuda:0 \
  --corpus docs/validation/real-shapes/corpus_ids.json --goldens docs/validation/real-shapes/real_goldens.json \
  --out $OUT/check.json > /tmp/check.log 2>&1; t "check exit $?"
grep -E "questions on|PASS|FAIL|Error" /tmp/check.log >> $L
mkdir -p /tmp/starts
for start in first second; do
  .carry/bin/instinct serve --model /tmp/real --text-adapter /tmp/real/adapter-text --device cuda:0 \
    --bind 127.0.0.1:8200 > /tmp/starts/serve_$start.log 2>&1 &
  SP=$!
  for _ in $(seq 1 600); do curl -sf localhost:8200/readyz > /dev/null && break; sleep 0.2; done
  kill -TERM $SP; wait $SP
  t "$start start: $(sed 's/\x1b\[[0-9;]*m//g' /tmp/starts/serve_$start.log | grep -oE '(text weights read|adapter.s language modules merged|tokenizer loaded|weights uploaded and activations allocated|warm-up forwards run).* ms=[0-9.]+|ready load_ms=[0-9.]+ warmup_ms=[0-9.]+' | sed -E 's/row_counts=\[[^]]*\] //; s/values=[0-9]+ //; s/backend="cuda:0" //' | tr '\n' ';')"
done
tar czf $OUT/starts.tgz -C /tmp starts
OUT=/tmp/vl timeout 200 bash tools/reference/gpu_vl_check.sh > /dev/null 2>&1
t "vl exit $?"
grep -E "vl_parity\]" /tmp/vl/gpu_vl_check.log | tail -2 >> $L
tar czf $OUT/vl.tgz -C /tmp vl
RUNS=mixed_closed,mixed_open RATES=10,20,30 OUT=/tmp/mixed REVISION=$REV timeout 200 bash tools/reference/gpu_mixed_load.sh > /dev/null 2>&1
t "mixed exit $?"
grep -E "^(mixed_)|image stages" /tmp/mixed/gpu_mixed_load.log >> $L
tar czf $OUT/mixed.tgz -C /tmp mixed
t done
