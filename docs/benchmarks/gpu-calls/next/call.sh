#!/usr/bin/env bash
# Parity and screenshots at main's head (any H100 or H200; ~200 s on a fresh machine):
#   1. text parity on the 84 questions, bits against b4c153f's (identical at 5b90854);
#   2. gpu_vl_check.sh with the defaults: screenshot parity and latency, the answers' bits against
#      b4c153f's (identical at 5b90854; four questions on one screenshot 1.317x one at b4c153f,
#      1.331x at 5b90854 on a slower host, target 1.3x);
#   3. a screenshot server started twice, timed (5.7 s at b4c153f, 8.1 / 7.4 s at 5b90854).
# The next call planned is call_ab_profile.sh beside this one (the index uploads' pinned staging
# against 39d7fb6 at one client; where a chunk's time goes).
# Pack: cargo build --release -p instinct -p instinct-loadtest; .carry/bin/{instinct,instinct-loadtest},
# stripped, `tar cf - bin | xz -T2 -6` as .carry/carry.tar.xz. Carries .carry, .cache/qwen-tokenizer,
# .cache/fixtures. Returns results.tgz and call.log.
#   REV=<sha> bash docs/benchmarks/gpu-calls/next/call.sh
set -uo pipefail
REV=${REV:?set REV}
source tools/reference/gpu_call.sh
start_checkpoint
wait_checkpoint
parity
same_bits_as 2026-12-07-b4c153f-h100
cp "$OUT/check.json" $R/
screenshot_check $R docs/benchmarks/gpu-calls/2026-12-07-b4c153f-h100/results/vl_parity.json main
pack
if (( $(left) > 60 )); then
  screenshot_server_start $R
  pack
fi
cat "$CALL_LOG"
