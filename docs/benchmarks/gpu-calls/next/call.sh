#!/usr/bin/env bash
# The planned device call (~450 s on a fresh machine), at main's head: issue 19's long mix with
# --chunk-over-tokens, whose level beside the long questions did not run at 0f185b2 (the run's own
# cap; gpu-calls/2026-12-07-0f185b2-h100), alternated with the default chunking in the same call:
#   over  --max-chunk-tokens 512 --chunk-over-tokens 4096
#   base  --max-chunk-tokens 1024
# then text parity (bits against 4b846f2) and a screenshot server's warm start.
# Each: gpu_prefix_bench.sh's bench stage with 60-s levels (the upstream mix at 19 req/s alone, then
# beside 1 req/s of ~14,500-token questions). The first run also waits for the checkpoint (~60 s)
# and the first server start (~50 s: kernels compiled, GEMMs timed), so its cap is longer.
# Start-up (issue 18: ready in <= 5 s on a warm cache): base is the machine's second server start
# (kernel cache and GEMM picks stored by over's), so its serve log's phases (`text weights read`,
# `engine loaded`, `ready load_ms`) compare with 0f185b2's base (read 2,474 ms + merge 1,139 ms,
# load 5,565 ms, ready ~5.9 s) after 09a8778 (huge pages for the host weights, the backend
# started beside the reading) and the merge done as each Linear is decoded (one phase now, "text
# weights read ... and the adapter's language modules merged"): grep them from
# /tmp/r/base/serve_chunked.log.
# Pack: cargo build --release -p instinct -p instinct-loadtest; .carry/bin/{instinct,instinct-loadtest},
# stripped, `tar cf - bin | xz -T2 -6` as .carry/carry.tar.xz. Carries .carry, .cache/qwen-tokenizer,
# .cache/fixtures. Returns runs.tgz, call.log and check.json (the device returns a bounded number
# of files).
#   REV=<sha> bash docs/benchmarks/gpu-calls/next/call.sh
set -uo pipefail
REV=${REV:?set REV}
# The call log, the carried binaries unpacked, parity and its bits (gpu_call.sh's helpers).
source tools/reference/gpu_call.sh
S=$(date +%s)
for run in over base; do
  cap=165; [[ $run == over ]] && cap=280
  fl="--chunk-over-tokens 4096"; ch=512
  [[ $run == base ]] && { fl=""; ch=1024; }
  OUT=/tmp/r/$run REVISION=$REV-$run SERVERS=chunked STAGES=bench CHUNK=$ch CHUNK_FLAGS="$fl" LONG_LEVEL_S=60 \
    timeout $cap bash tools/reference/gpu_prefix_bench.sh > /dev/null 2>&1
  echo "$run rc $? at $(( $(date +%s) - S )) s"
  grep -E "^long_chunked|chunks run|hardware" /tmp/r/$run/gpu_prefix_bench.log
done
# Text parity at this head (the weights now load with the adapter merged while decoding): the
# verdict, and the answers' bits against 4b846f2's report (expected identical), into call.log.
parity
same_bits_as 2026-12-07-4b846f2-h100
# A screenshot server's warm start (both copies; since this commit the screenshot copy is read beside
# the text copy): its phases, from start to ready.
if (( $(date +%s) - S < 440 )); then
  INSTINCT_BIND=127.0.0.1:8000 .carry/bin/instinct serve --model /tmp/real --text-adapter /tmp/real/adapter-text \
    --multimodal-adapter /tmp/real/adapter-multimodal --device cuda:0 > /tmp/r/vl_start.log 2>&1 &
  pid=$!
  for _ in $(seq 90); do curl -sf http://127.0.0.1:8000/readyz > /dev/null && break; sleep 1; done
  kill $pid; wait $pid
  grep -E "listening|weights|merged|loaded|ready" /tmp/r/vl_start.log | cut -c1-220
fi
rm -rf /tmp/r/*/workloads
tar czf "$OUT/runs.tgz" -C /tmp r
