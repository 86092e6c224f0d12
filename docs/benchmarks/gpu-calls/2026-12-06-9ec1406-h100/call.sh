#!/usr/bin/env bash
# The planned device call (CALL_S seconds, 590 unless set), in order of need. At 51581dd (H100,
# gpu-calls/2026-12-06-51581dd-h100) captured passes answered bit for bit and helped below
# saturation, so they are on by default since 0c598bb. This call checks the default:
#   1. the captured-pass GPU tests (the carried one's repeated batches now keep one shape);
#   2. parity with the defaults (graphs on), compared row by row with 51581dd's graphs-off report;
#   3. gpu_prefix_bench.sh, both stages, three servers with the defaults (graphs on): reuse and
#      chunking exact against the server with both off, and issue 19's benchmarks;
#   4. if 150 s are left: gpu_load.sh with the defaults, open loop at 20-35 requests/s (the
#      highest load within a 100 ms p99 was below 40 at 51581dd).
# Carries .carry (carry.tar.xz: bin/instinct, bin/instinct-loadtest, tests/captured_passes-test),
# .cache/qwen-tokenizer, .cache/fixtures. Results in $OUT: call.log, tests.log, check.json,
# prefix.tgz, load.tgz.
#   REV=<sha> [CALL_S=450] bash docs/benchmarks/gpu-calls/next/call.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
start_checkpoint
run_test captured_passes-test 150
tests_summary
wait_checkpoint
t parity-defaults
timeout 60 .carry/bin/instinct check --model /tmp/real --text-adapter /tmp/real/adapter-text --device cuda:0 \
  --corpus docs/validation/real-shapes/corpus_ids.json --goldens docs/validation/real-shapes/real_goldens.json \
  --out "$OUT/check.json" > /tmp/check.log 2>&1
t "check exit $?"
grep -E "questions on|captured passes|Error" /tmp/check.log >> $L
python3 - "$OUT/check.json" docs/benchmarks/gpu-calls/2026-12-06-51581dd-h100/check.json >> $L 2>&1 <<'PY'
import json, sys
a, off = (json.load(open(p)) for p in sys.argv[1:3])
same = sum(x["p"] == y["p"] for x, y in zip(a["rows"], off["rows"]))
print(f"defaults (graphs {a.get('cuda_graphs')}): {same} of {len(a['rows'])} questions identical to 51581dd's graphs-off report")
PY
if (( $(left) > 140 )); then
  OUT=/tmp/prefix REVISION=$REV timeout 150 bash tools/reference/gpu_prefix_bench.sh > /dev/null 2>&1
  t "prefix exit $?"
  sed -n '/exactness against off/,$p' /tmp/prefix/gpu_prefix_bench.log >> $L
  tar czf $OUT/prefix.tgz --exclude=workloads -C /tmp prefix
fi
if (( $(left) > 150 )); then
  OUT=/tmp/load REVISION=$REV CLIENTS=1,8 LEVEL_S=8 RATES=20,25,30,35 FIXTURE_REQUESTS=60 \
    TOTAL_S=$(( $(left) - 15 )) timeout $(( $(left) - 5 )) bash tools/reference/gpu_load.sh > /dev/null 2>&1
  t "load exit $?"
  python3 -c "import json; print(json.dumps(json.load(open('/tmp/load/summary.json'))))" >> $L 2>&1
  tar czf $OUT/load.tgz -C /tmp load
fi
t done
