#!/usr/bin/env bash
# The planned device call (CALL_S seconds, 590 unless set), at the head after the exact GEMM
# buckets (544e877), 8 compared rows in the tuner's candidate check, the per-pass debug log of
# prefix reuse, and the faster PNG decode:
#   1. the GPU test of the tuning file;
#   2. a first start on an empty cache (ready time; the tuner's phase times), a second start;
#   3. parity, and its bits against 99b9d07's;
#   4. gpu_vl_check.sh (screenshot parity, 1024x1024 latencies, a miss's preprocess time);
#   5. goal-less requests (8 questions over ~2,000 tokens, 1 client) with each pass's rows and time;
#   6. gpu_load.sh (load_stage);
#   7. the batch-invariance GPU test, if time is left.
# Carries .carry (carry.tar.xz: bin/instinct, bin/instinct-loadtest, 
# tests/cuda_gemm_tuning-test, tests/cuda_batch_invariance-test), .cache/qwen-tokenizer,
# .cache/fixtures.
#   REV=<sha> [CALL_S=560] bash docs/benchmarks/gpu-calls/next/call.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
start_checkpoint
run_test cuda_gemm_tuning-test 120
tests_summary
wait_checkpoint
# start NAME [FLAGS]: serve on the real-shape checkpoint until ready (at most 240 s), the log in
# $OUT/NAME.log; leaves it running (pid in $SERVER).
start() {
  local name=$1 t0; shift; t0=$(date +%s)
  INSTINCT_LOG=${LOG_SPEC:-info,instinct_kernels::cuda::blas=debug} .carry/bin/instinct serve --model /tmp/real \
    --text-adapter /tmp/real/adapter-text --device cuda:0 --bind 127.0.0.1:8124 "$@" > "$OUT/$name.log" 2>&1 &
  SERVER=$!
  until curl -sf http://127.0.0.1:8124/readyz > /dev/null; do
    if ! kill -0 $SERVER 2> /dev/null || (( $(date +%s) - t0 > 240 )); then break; fi
    sleep 0.2
  done
  t "$name ready after $(( $(date +%s) - t0 )) s"
}
stop() { kill $SERVER; wait $SERVER 2> /dev/null; gzip -f "$OUT/$1.log"; }
start first_start; stop first_start
start second_start; stop second_start
parity
same_bits_as 2026-12-06-99b9d07-h100
OUT=/tmp/vl timeout 120 bash tools/reference/gpu_vl_check.sh > /dev/null 2>&1
t "vl exit $?"
grep -E "vl_parity\]" /tmp/vl/gpu_vl_check.log | tail -3 >> $L
tar czf $OUT/vl.tgz --exclude=extras.tgz -C /tmp vl
LOG_SPEC=info,instinct::prefix_reuse=debug start goal_less
LT=(.carry/bin/instinct-loadtest --target http://127.0.0.1:8124 --quiet)
timeout 60 "${LT[@]}" --goal-less --questions 8 --prompt-tokens 2000 --synthetic-count 64 --seed 7 \
  --concurrency 1 --requests 40 --duration 20 --warmup 2 --json $OUT/goal_less.json > /dev/null 2>&1
t "goal-less exit $?"
python3 - "$OUT/goal_less.log" >> $L 2>&1 <<'PY'
import re, statistics, sys
ansi = re.compile(r"\x1b\[[0-9;]*m")
passes = {}
for line in open(sys.argv[1]):
    line = ansi.sub("", line)
    if "forward pass" not in line:
        continue
    f = dict(re.findall(r"(\w+)=(\S+)", line))
    passes.setdefault(f["pass"], []).append((int(f["rows"]), int(f["segments"]), float(f["ms"])))
for name, v in passes.items():
    print(f"goal-less {name} passes: {len(v)}, median rows {statistics.median(r for r, _, _ in v)}, "
          f"segments {statistics.median(s for _, s, _ in v)}, ms {statistics.median(m for _, _, m in v):.2f}")
PY
stop goal_less
load_stage
if (( $(left) > 60 )); then
  run_test cuda_batch_invariance-test $(( $(left) - 10 ))
  grep -E "^## .*invariance|test result|panicked|FAILED" "$TESTS_LOG" | tail -3 >> $L
fi
t done
