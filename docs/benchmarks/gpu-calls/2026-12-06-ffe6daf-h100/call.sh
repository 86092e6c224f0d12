#!/usr/bin/env bash
# The planned device call (CALL_S seconds, 590 unless set), in order of need, after aeeff48:
# captured passes pad their rows to a multiple of 8 (not 16 and 32), GEMM buckets back to 128.
#   1. the captured-pass and carried-pass GPU tests;
#   2. parity with the defaults, and its bits against 553662a's report;
#   3. gpu_graphs_bench.sh at 139, 300, 600, 608 and 712 ids and 2x300 (42c518c: 300, 600 and
#      2x300 slower replayed);
#   4. start-up with an empty kernel cache, then again;
#   5. gpu_load.sh as at 9ec1406 and 42c518c;
#   6. gpu_vl_check.sh with the defaults, if time is left.
# Carries .carry (carry.tar.xz: bin/instinct, bin/instinct-loadtest, tests/captured_passes-test,
# tests/cuda_carried-test), .cache/qwen-tokenizer, .cache/fixtures.
#   REV=<sha> [CALL_S=330] bash docs/benchmarks/gpu-calls/next/call.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
start_checkpoint
run_test captured_passes-test 120
run_test cuda_carried-test 90
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
if (( $(left) > 80 )); then
  OUT=/tmp/load REVISION=$REV CLIENTS=1,8 LEVEL_S=8 RATES=20,25,30,35 FIXTURE_REQUESTS=60 \
    TOTAL_S=$(( $(left) - 15 < 90 ? $(left) - 15 : 90 )) timeout $(( $(left) - 5 < 100 ? $(left) - 5 : 100 )) bash tools/reference/gpu_load.sh > /dev/null 2>&1
  t "load exit $?"
  python3 -c "import json; d=json.load(open('/tmp/load/summary.json')); print(json.dumps({k: v for k, v in d.items() if k not in ('closed', 'open', 'fixtures')}))" >> $L 2>&1
  tar czf $OUT/load.tgz -C /tmp load
fi
if (( $(left) > 110 )); then
  OUT=/tmp/vl timeout $(( $(left) - 10 < 200 ? $(left) - 10 : 200 )) bash tools/reference/gpu_vl_check.sh > /dev/null 2>&1
  t "vl exit $?"
  grep -E "vl_parity\]" /tmp/vl/gpu_vl_check.log | tail -3 >> $L
  tar czf $OUT/vl.tgz --exclude=extras.tgz -C /tmp vl
fi
t done
