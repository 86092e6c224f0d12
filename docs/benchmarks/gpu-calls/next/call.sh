#!/usr/bin/env bash
# The planned device call (CALL_S seconds, 590 unless set), in order of need:
#   1. the captured-pass (CUDA graph) GPU tests: replayed = as launched bit for bit, plain and
#      carried passes, snapshots included; the prefix-state GPU tests (graphs off);
#   2. parity on the 84-question corpus with graphs off, then on; the two reports' probabilities
#      compared question by question (the same bits?);
#   3. gpu_graphs_bench.sh: forward and HTTP latency, graphs off against on;
#   4. gpu_vl_check.sh with the defaults and with `--snapshots-within off`, on one host;
#   5. gpu_prefix_bench.sh, both stages, if 120 s are left; the mixed load if 130 s; the long mix
#      with 512-token chunks if 100 s.
# Carries .carry (carry.tar.xz: bin/instinct, bin/instinct-loadtest, tests), .cache/qwen-tokenizer,
# .cache/fixtures. Results in $OUT: call.log, tests.log, check.json, check_graphs.json, graphs.tgz,
# vl.tgz, prefix.tgz, mixed.tgz, chunk512.tgz.
#   REV=<sha> [CALL_S=450] bash docs/benchmarks/gpu-calls/next/call.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
start_checkpoint
run_test captured_passes-test 150
run_test prefix_states-test 60
tests_summary
wait_checkpoint
parity
t parity-graphs
timeout 90 .carry/bin/instinct check --model /tmp/real --text-adapter /tmp/real/adapter-text --device cuda:0 \
  --corpus docs/validation/real-shapes/corpus_ids.json --goldens docs/validation/real-shapes/real_goldens.json \
  --cuda-graphs on --out "$OUT/check_graphs.json" > /tmp/check_graphs.log 2>&1
t "check graphs exit $?"
grep -E "questions on|captured passes|Error" /tmp/check_graphs.log >> $L
python3 - "$OUT/check.json" "$OUT/check_graphs.json" >> $L 2>&1 <<'EOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
# Row by row: a prompt may be asked twice with different option counts.
same, differ, worst = 0, 0, 0.0
for x, r in zip(a["rows"], b["rows"]):
    assert (x["prompt"], x["n_options"]) == (r["prompt"], r["n_options"])
    p = x["p"]
    if p == r["p"]:
        same += 1
    else:
        differ += 1
        worst = max(worst, max(abs(x - y) for x, y in zip(p, r["p"])))
print(f"graphs on vs off: {same} questions identical, {differ} differ (max |dp| {worst:.3e})")
EOF
if (( $(left) > 150 )); then
  OUT=/tmp/graphs REVISION=$REV RUNS=40 timeout $(( $(left) - 20 < 300 ? $(left) - 20 : 300 )) \
    bash tools/reference/gpu_graphs_bench.sh > /tmp/graphs.log 2>&1
  t "graphs bench exit $?"
  cat /tmp/graphs/summary.txt >> $L
  tar czf $OUT/graphs.tgz -C /tmp graphs
fi
(( $(left) > 130 )) || { t "no time for the VL checks"; exit 0; }
OUT=/tmp/vl timeout $(( $(left) - 10 < 200 ? $(left) - 10 : 200 )) bash tools/reference/gpu_vl_check.sh > /dev/null 2>&1
t "vl exit $?"
grep -E "vl_parity\]" /tmp/vl/gpu_vl_check.log | tail -2 >> $L
if (( $(left) > 90 )); then
  SERVE_FLAGS="--snapshots-within off" OUT=/tmp/vl_two_passes WORK=/tmp/vl_check_two_passes \
    timeout $(( $(left) - 10 < 200 ? $(left) - 10 : 200 )) bash tools/reference/gpu_vl_check.sh > /dev/null 2>&1
  t "vl two passes exit $?"
  grep -E "vl_parity\]" /tmp/vl_two_passes/gpu_vl_check.log | tail -2 >> $L
fi
tar czf $OUT/vl.tgz --exclude=extras.tgz -C /tmp vl vl_two_passes
if (( $(left) > 120 )); then
  LEVEL_S=${LEVEL_S:-10} OUT=/tmp/prefix REVISION=$REV timeout $(( $(left) < 330 ? $(left) : 330 )) \
    bash tools/reference/gpu_prefix_bench.sh > /dev/null 2>&1
  t "prefix exit $?"
  grep -vE "^\[|^ *$" /tmp/prefix/gpu_prefix_bench.log | tail -32 >> $L
  tar czf $OUT/prefix.tgz --exclude=workloads -C /tmp prefix
fi
if (( $(left) > 130 )); then
  RUNS=mixed_closed OUT=/tmp/mixed REVISION=$REV timeout 120 bash tools/reference/gpu_mixed_load.sh > /dev/null 2>&1
  t "mixed exit $?"
  grep -E "^(mixed_)|image stages" /tmp/mixed/gpu_mixed_load.log >> $L
  tar czf $OUT/mixed.tgz -C /tmp mixed
fi
if (( $(left) > 100 )); then
  # The long-mix pair alone on a chunked server with 512-token chunks (the bench ran 1,024).
  OUT=/tmp/chunk512 SERVERS=chunked CHUNK=512 STAGES=bench REVISION=$REV timeout 100 bash tools/reference/gpu_prefix_bench.sh > /dev/null 2>&1
  t "chunk 512 exit $?"
  grep -E "^long_chunked|^long chunked" /tmp/chunk512/gpu_prefix_bench.log >> $L
  tar czf $OUT/chunk512.tgz --exclude=workloads -C /tmp chunk512
fi
t done
