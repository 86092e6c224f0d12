#!/usr/bin/env bash
# The planned device call (CALL_S seconds, 590 unless set), in order of need, after two changes
# checked on CPUs only: GEMM tuning buckets at the captured passes' row counts (7e9a798) and the
# carry arena allocated only where prefix reuse or chunking is on. This call:
#   1. the captured-pass, carried-pass, prefix-state and GEMM-tuning GEMM tests on the GPU;
#   2. parity with the defaults, and whether its answers are the bits of 553662a's (batch-invariant
#      GEMMs: any bucket's pick gives the reference's bits);
#   3. gpu_graphs_bench.sh at 139, 300, 600, 608 and 712 ids and 2x300 (553662a: 600 and 2x300
#      slower replayed, 608 launched slow);
#   4. start-up: `instinct serve` with an empty kernel cache (every bucket timed), then again;
#   5. gpu_vl_check.sh with the defaults (screenshot passes captured since 9ad2d5a): parity and the
#      replays over its screenshot questions;
#   6. gpu_load.sh as at 9ec1406 (issue 18's figures), with what time is left.
# Carries .carry (carry.tar.xz: bin/instinct, bin/instinct-loadtest, tests/captured_passes-test,
# tests/cuda_carried-test, tests/prefix_states-test, tests/cuda_gemm_tuning-test),
# .cache/qwen-tokenizer, .cache/fixtures.
#   REV=<sha> [CALL_S=560] bash docs/benchmarks/gpu-calls/next/call.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
start_checkpoint
run_test captured_passes-test 120
run_test cuda_carried-test 90
run_test prefix_states-test 90
run_test cuda_gemm_tuning-test 60
tests_summary
wait_checkpoint
parity
python3 - "$OUT/check.json" docs/benchmarks/gpu-calls/2026-12-06-553662a-h100/check.json >> $L 2>&1 <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
same = sum(x["p"] == y["p"] for x, y in zip(a["rows"], b["rows"]))
print(f"{same} of {len(a['rows'])} questions identical to 553662a's report")
PY
OUT=/tmp/graphs REVISION=$REV RUNS=30 LENGTHS=139,300,600,608,712 BATCHES=2 \
  timeout 120 bash tools/reference/gpu_graphs_bench.sh > /dev/null 2>&1
t "graphs bench exit $?"
grep -E "^(bench|http)|probabilities" /tmp/graphs/summary.txt >> $L
tar czf $OUT/graphs.tgz -C /tmp graphs
# Start-up with an empty kernel cache (kernels compiled, every GEMM bucket timed), then warm.
for cache in cold warm; do
  XDG_CACHE_HOME=/tmp/startup-cache .carry/bin/instinct serve --model /tmp/real \
    --text-adapter /tmp/real/adapter-text --device cuda:0 --bind 127.0.0.1:8131 > $OUT/serve_$cache.log 2>&1 &
  pid=$!; s0=$(date +%s%N)
  for _ in $(seq 1 900); do
    curl -sf -o /dev/null http://127.0.0.1:8131/readyz && break; sleep 0.1
  done
  t "start-up $cache: ready after $(( ($(date +%s%N) - s0) / 1000000 )) ms"
  grep -E "ready load_ms" $OUT/serve_$cache.log | tail -1 >> $L
  kill $pid; wait $pid 2>/dev/null
done
OUT=/tmp/vl timeout $(( $(left) - 10 < 200 ? $(left) - 10 : 200 )) bash tools/reference/gpu_vl_check.sh > /dev/null 2>&1
t "vl exit $?"
grep -E "vl_parity\]" /tmp/vl/gpu_vl_check.log | tail -3 >> $L
tar czf $OUT/vl.tgz --exclude=extras.tgz -C /tmp vl
if (( $(left) > 90 )); then
  OUT=/tmp/load REVISION=$REV CLIENTS=1,8 LEVEL_S=8 RATES=20,25,30,35 FIXTURE_REQUESTS=60 \
    TOTAL_S=$(( $(left) - 15 )) timeout $(( $(left) - 5 )) bash tools/reference/gpu_load.sh > /dev/null 2>&1
  t "load exit $?"
  python3 -c "import json; d=json.load(open('/tmp/load/summary.json')); print(json.dumps({k: v for k, v in d.items() if k not in ('closed', 'open', 'fixtures')}))" >> $L 2>&1
  tar czf $OUT/load.tgz -C /tmp load
fi
t done
