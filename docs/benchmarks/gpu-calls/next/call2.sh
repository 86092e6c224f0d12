#!/usr/bin/env bash
# Second call of the session (CALL_S seconds): the captured-pass GPU tests (plain, carried, and each
# padding of a carried pass alone), parity with graphs on compared row by row with the graphs-off
# report of 6b2473a (the graphs-off path is unchanged since), then forward and HTTP latency with
# graphs off and on at row counts on a captured shape's size (128, 256, 384: the graph alone) and
# off it (139, 300, 712: padded to 144, 320, 736).
#   REV=<sha> [CALL_S=300] bash docs/benchmarks/gpu-calls/next/call2.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
start_checkpoint
run_test captured_passes-test 150
run_test cuda_carried-test 60 ignores_rows_in_no_sequence
tests_summary
grep -E "max \|dp\|" "$TESTS_LOG" >> $L
wait_checkpoint
t parity-graphs
timeout 60 .carry/bin/instinct check --model /tmp/real --text-adapter /tmp/real/adapter-text --device cuda:0 \
  --corpus docs/validation/real-shapes/corpus_ids.json --goldens docs/validation/real-shapes/real_goldens.json \
  --cuda-graphs on --out "$OUT/check_graphs.json" > /tmp/check_graphs.log 2>&1
t "check graphs exit $?"
grep -E "questions on|captured passes|Error" /tmp/check_graphs.log >> $L
python3 - docs/benchmarks/gpu-calls/2026-12-06-6b2473a-h100/check.json "$OUT/check_graphs.json" >> $L 2>&1 <<'EOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
same, differ, worst = 0, 0, 0.0
for x, r in zip(a["rows"], b["rows"]):
    assert (x["prompt"], x["n_options"]) == (r["prompt"], r["n_options"])
    if x["p"] == r["p"]:
        same += 1
    else:
        differ += 1
        worst = max(worst, max(abs(p - q) for p, q in zip(x["p"], r["p"])))
print(f"graphs on vs off (6b2473a): {same} questions identical, {differ} differ (max |dp| {worst:.3e})")
EOF
if (( $(left) > 100 )); then
  OUT=/tmp/graphs2 REVISION=$REV RUNS=30 LENGTHS=128,139,256,300,384,712 BATCHES=2 \
    timeout $(( $(left) - 10 )) bash tools/reference/gpu_graphs_bench.sh > /tmp/graphs2.log 2>&1
  t "graphs bench exit $?"
  grep -E "^(bench|http)|probabilities|replays_total|failed" /tmp/graphs2/summary.txt >> $L
  tar czf $OUT/graphs2.tgz -C /tmp graphs2
fi
t done
