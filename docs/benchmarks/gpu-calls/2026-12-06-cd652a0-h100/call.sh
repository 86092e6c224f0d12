#!/usr/bin/env bash
# The planned device call (CALL_S seconds, 590 unless set), after the fused delta-rule prepare
# learnt to read carried conv windows: a pass that resumes a prefix (every question over HTTP
# resumes from the cached system turn) no longer takes the conv, L2 norm and gates apart. At
# 637a76d the 712-id question over HTTP took 13.45 ms resumed against 12.45 whole.
#   1. the GPU tests of carried ops, captured passes and prefix states;
#   2. parity, and its bits against ffe6daf's report (whole passes: unchanged);
#   3. gpu_graphs_bench.sh at 139, 300, 648 and 712 ids (forward and HTTP, graphs off and on;
#      HTTP resumed from the system turn), then HTTP whole (--prefix-cache-mib 0);
#   4. gpu_prefix_bench.sh (reuse and chunks exact against off; goal-less 4x; long mix);
#   5. gpu_load.sh as at ffe6daf, with what time is left.
# At most 8 files come back: call.log, check.json, tests.log and four archives.
# Carries .carry (carry.tar.xz: bin/instinct, bin/instinct-loadtest, tests/cuda_carried-test,
# tests/captured_passes-test, tests/prefix_states-test), .cache/qwen-tokenizer, .cache/fixtures.
#   REV=<sha> [CALL_S=560] bash docs/benchmarks/gpu-calls/next/call.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
start_checkpoint
run_test cuda_carried-test 120
run_test captured_passes-test 120
tests_summary
wait_checkpoint
run_test prefix_states-test 120
grep -E "^## .*prefix|test result|panicked|FAILED" "$TESTS_LOG" | tail -3 >> $L
parity
python3 - "$OUT/check.json" docs/benchmarks/gpu-calls/2026-12-06-ffe6daf-h100/check.json >> $L 2>&1 <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
same = sum(x["p"] == y["p"] for x, y in zip(a["rows"], b["rows"]))
print(f"{same} of {len(a['rows'])} questions identical to ffe6daf's report")
PY
OUT=/tmp/graphs REVISION=$REV RUNS=30 LENGTHS=139,300,648,712 \
  timeout 120 bash tools/reference/gpu_graphs_bench.sh > /dev/null 2>&1
t "graphs bench exit $?"
grep -E "^(bench|http)|probabilities" /tmp/graphs/summary.txt >> $L
OUT=/tmp/graphs/whole REVISION=$REV RUNS=30 LENGTHS=139,300,648,712 STAGES=http \
  SERVE_FLAGS="--prefix-cache-mib 0" timeout 80 bash tools/reference/gpu_graphs_bench.sh > /dev/null 2>&1
t "http whole exit $?"
grep -E "^http" /tmp/graphs/whole/summary.txt | sed 's/^/whole /' >> $L
tar czf $OUT/graphs.tgz -C /tmp graphs
if (( $(left) > 170 )); then
  OUT=/tmp/prefix REVISION=$REV timeout 160 bash tools/reference/gpu_prefix_bench.sh > /dev/null 2>&1
  t "prefix exit $?"
  sed -n '/exactness against off/,$p' /tmp/prefix/gpu_prefix_bench.log >> $L
  tar czf $OUT/prefix.tgz --exclude=workloads -C /tmp prefix
fi
if (( $(left) > 80 )); then
  OUT=/tmp/load REVISION=$REV CLIENTS=1,8 LEVEL_S=8 RATES=20,25,30,35 FIXTURE_REQUESTS=60 \
    TOTAL_S=$(( $(left) - 15 < 90 ? $(left) - 15 : 90 )) timeout $(( $(left) - 5 < 100 ? $(left) - 5 : 100 )) bash tools/reference/gpu_load.sh > /dev/null 2>&1
  t "load exit $?"
  python3 -c "import json; d=json.load(open('/tmp/load/summary.json')); print(json.dumps({k: v for k, v in d.items() if k not in ('closed', 'open', 'fixtures')}))" >> $L 2>&1
  tar czf $OUT/load.tgz -C /tmp load
fi
t done
