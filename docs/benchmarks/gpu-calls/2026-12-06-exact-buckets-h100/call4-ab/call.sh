#!/usr/bin/env bash
# The planned device call (CALL_S seconds, 590 unless set): the load with GEMM winners timed at
# every multiple of 8 up to 2,048 rows (exact buckets, the default) against 128-row buckets
# (INSTINCT_GEMM_EXACT_ROWS=0, as before), alternated on one machine, each mode with its own
# cache (its first start times its buckets; the load runs on a later start).
#   1. the tuning file's GPU test (a bucket's second row count is now 697 rows, not 650);
#   2. per mode a first start on an empty cache (ready time);
#   3. gpu_load.sh: off, exact, off, exact (1 and 8 clients, open loop 20-35 req/s, fixtures).
# Carries .carry (carry.tar.xz: bin/instinct, bin/instinct-loadtest, tests/cuda_gemm_tuning-test),
# .cache/qwen-tokenizer, .cache/fixtures.
#   REV=<sha> [CALL_S=580] bash docs/benchmarks/gpu-calls/next/call.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
start_checkpoint
run_test cuda_gemm_tuning-test 120
tests_summary
wait_checkpoint
# first_start MODE EXACT: serve once on the mode's empty cache until ready; the ready time.
first_start() {
  local t0; t0=$(date +%s)
  mkdir -p /tmp/cache_$1
  XDG_CACHE_HOME=/tmp/cache_$1 INSTINCT_GEMM_EXACT_ROWS=$2 .carry/bin/instinct serve --model /tmp/real \
    --text-adapter /tmp/real/adapter-text --device cuda:0 --bind 127.0.0.1:8124 > "$OUT/first_$1.log" 2>&1 &
  local pid=$!
  until curl -sf http://127.0.0.1:8124/readyz > /dev/null; do
    if ! kill -0 $pid 2> /dev/null || (( $(date +%s) - t0 > 120 )); then break; fi
    sleep 0.2
  done
  t "first start $1 (exact rows $2): ready after $(( $(date +%s) - t0 )) s"
  kill $pid; wait $pid 2> /dev/null
  gzip -f "$OUT/first_$1.log"
}
first_start off 0
first_start exact 2048
# load MODE EXACT N: gpu_load.sh on the mode's cache.
load() {
  XDG_CACHE_HOME=/tmp/cache_$1 INSTINCT_GEMM_EXACT_ROWS=$2 OUT=/tmp/load_$1_$3 REVISION="$REV $1" \
    CLIENTS=1,8 LEVEL_S=8 RATES=20,25,30,35 FIXTURE_REQUESTS=60 TOTAL_S=85 \
    timeout 100 bash tools/reference/gpu_load.sh > /dev/null 2>&1
  t "load $1 $3 exit $?"
  python3 -c "import json; d=json.load(open('/tmp/load_$1_$3/summary.json')); print(json.dumps({k: v for k, v in d.items() if k not in ('closed', 'open', 'fixtures', 'hardware')}))" >> "$L" 2>&1
}
for n in 1 2; do
  (( $(left) > 100 )) && load off 0 $n
  (( $(left) > 100 )) && load exact 2048 $n
done
tar czf $OUT/loads.tgz -C /tmp $(cd /tmp && ls -d load_*)
t done
