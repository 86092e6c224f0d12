#!/usr/bin/env bash
# The planned device call (CALL_S seconds, 590 unless set): why a pass of 8 questions resumed from
# a 1,792-token snapshot each takes 26.6 ms for 975 rows (goal-less requests at cbb1c82), where a
# forward of ~1,000 rows takes 15-17 ms.
#   0. cuda_gemm_tuning-test: its new test (a second copy takes up the first's stored winners, as
#      the screenshot copy's warm-up does since 544e877) has not run on a GPU yet;
#   1. instinct bench: 8 questions of 1,920 ids resumed from their first 1,792 (the questions'
#      pass of a goal-less request, 1,024 rows), beside one question of 1,024 ids (a plain pass);
#      with a text of 1,920 ids resumed from 1,792, 1,536, 1,024, 512 and 64, if time allows, to
#      see how the cost grows with the prefix;
#   2. Nsight Compute, per kernel, of the last forward of each (ncu_forward.py tables): which
#      kernels grow with the prefix (flash attention over f32 prefix K/V, the staging copies, the
#      delta rule's initial states);
# Carries .carry (carry.tar.xz: bin/instinct, tests/cuda_gemm_tuning-test), .cache/qwen-tokenizer,
# .cache/fixtures.
#   REV=<sha> [CALL_S=420] bash docs/benchmarks/gpu-calls/next/call.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
start_checkpoint
run_test cuda_gemm_tuning-test 120
tests_summary
wait_checkpoint
B=(.carry/bin/instinct bench --model /tmp/real --text-adapter /tmp/real/adapter-text --device cuda:0)
"${B[@]}" --lengths 1024 --batch-sizes 8 --batch-prompt-tokens 1920 --resume-tokens 1792 --runs 10 \
  --batch-runs 10 --warmup 2 --out $OUT/bench_8x1920_from_1792.json > /tmp/bench.log 2>&1
t "bench exit $?"
grep -E "^\[bench\] (latency|batch)" /tmp/bench.log >> $L
for r in 1536 1024 512 64; do
  (( $(left) > 200 )) || break
  "${B[@]}" --lengths 16 --batch-sizes 8 --batch-prompt-tokens 1920 --resume-tokens $r --runs 3 \
    --batch-runs 10 --warmup 2 --out $OUT/bench_8x1920_from_$r.json > /tmp/bench_$r.log 2>&1
  grep -E "^\[bench\] batch" /tmp/bench_$r.log | sed "s/^/from $r: /" >> $L
done
# ncu NAME ARGS...: the per-kernel table of the last forward of a bench run.
ncu_run() {
  local name=$1; shift
  (( $(left) > 70 )) || return 0
  t "ncu $name"
  timeout $(( $(left) - 10 < 90 ? $(left) - 10 : 90 )) ncu --metrics gpu__time_duration.sum --csv \
    --cache-control none --clock-control none --graph-profiling node "${B[@]}" "$@" --runs 1 \
    --batch-runs 1 --warmup 1 > /tmp/ncu_$name.csv 2> /tmp/ncu_$name.err
  t "ncu exit $?"
  gzip -c /tmp/ncu_$name.csv > $OUT/ncu-$name.csv.gz
  python3 tools/reference/ncu_forward.py /tmp/ncu_$name.csv > $OUT/ncu-$name.md 2>> $L
  head -16 $OUT/ncu-$name.md >> $L
}
ncu_run resumed --lengths 16 --batch-sizes 8 --batch-prompt-tokens 1920 --resume-tokens 1792
ncu_run plain --lengths 16 --batch-sizes 8 --batch-prompt-tokens 128
t done
