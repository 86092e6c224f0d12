#!/usr/bin/env bash
# The planned device call (CALL_S seconds, 590 unless set), after the GEMM tuner times its
# candidates in rounds and keeps each one's fastest run (5 rounds; was 3 runs back to back). At
# b6caffc and aeb7e13 the same bench (whole 648-id question, its bucket tuned at 648 rows in both)
# ran 10.90 and 12.29 ms: the tuner picked a 192x176 kernel (92 us a call) in one process and a
# 144x128 one (115 us) in the other.
#   1. the GEMM tuning and captured-pass GPU tests;
#   2. the same forward bench as at aeb7e13 (whole, then resumed from 64 ids), twice, each pair
#      with a fresh cache (so each tunes anew), the tuner's candidate times logged;
#   3. parity, and its bits against ffe6daf's report;
#   4. HTTP resumed and whole, and gpu_load.sh, with what time is left.
# Carries .carry (carry.tar.xz: bin/instinct, bin/instinct-loadtest, tests/cuda_gemm_tuning-test,
# tests/captured_passes-test), .cache/qwen-tokenizer, .cache/fixtures.
#   REV=<sha> [CALL_S=440] bash docs/benchmarks/gpu-calls/next/call.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
start_checkpoint
run_test cuda_gemm_tuning-test 120
run_test captured_passes-test 120
tests_summary
wait_checkpoint
mkdir -p /tmp/fwd
common=(--model /tmp/real --text-adapter /tmp/real/adapter-text --device cuda:0 --runs 30
  --batch-runs 10 --warmup 3 --revision "$REV")
for try in 1 2; do
  for resume in 0 64; do
    XDG_CACHE_HOME=/tmp/cache$try INSTINCT_LOG=info,instinct_kernels::cuda::blas=debug timeout 90 \
      .carry/bin/instinct bench "${common[@]}" --lengths 139,204,300,584,648,712 \
      --batch-sizes 4 --batch-prompt-tokens 300 --resume-tokens $resume \
      --out /tmp/fwd/bench${try}_resume$resume.json > /tmp/fwd/bench${try}_resume$resume.log 2>&1
    t "bench try $try resume $resume exit $?"
    grep -E "^\[bench\] (latency|batch)" /tmp/fwd/bench${try}_resume$resume.log | sed "s/^/try $try resume $resume /" >> $L
  done
done
parity
python3 - "$OUT/check.json" docs/benchmarks/gpu-calls/2026-12-06-ffe6daf-h100/check.json >> $L 2>&1 <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
same = sum(x["p"] == y["p"] for x, y in zip(a["rows"], b["rows"]))
print(f"{same} of {len(a['rows'])} questions identical to ffe6daf's report")
PY
for flags in "" "--prefix-cache-mib 0"; do
  (( $(left) > 60 )) || break
  name=resumed; [[ -n $flags ]] && name=whole
  OUT=/tmp/fwd/http_$name REVISION=$REV RUNS=30 LENGTHS=139,300,648,712 STAGES=http SERVE_FLAGS="$flags" \
    timeout 80 bash tools/reference/gpu_graphs_bench.sh > /dev/null 2>&1
  t "http $name exit $?"
  grep -E "^http" /tmp/fwd/http_$name/summary.txt | sed "s/^/$name /" >> $L
done
tar czf $OUT/fwd.tgz -C /tmp fwd
if (( $(left) > 80 )); then
  OUT=/tmp/load REVISION=$REV CLIENTS=1,8 LEVEL_S=8 RATES=20,25,30,35 FIXTURE_REQUESTS=60 \
    TOTAL_S=$(( $(left) - 15 < 90 ? $(left) - 15 : 90 )) timeout $(( $(left) - 5 < 100 ? $(left) - 5 : 100 )) bash tools/reference/gpu_load.sh > /dev/null 2>&1
  t "load exit $?"
  python3 -c "import json; d=json.load(open('/tmp/load/summary.json')); print(json.dumps({k: v for k, v in d.items() if k not in ('closed', 'open', 'fixtures')}))" >> $L 2>&1
  tar czf $OUT/load.tgz -C /tmp load
fi
t done
