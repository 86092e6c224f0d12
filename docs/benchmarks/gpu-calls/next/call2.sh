#!/usr/bin/env bash
# Planned second device call: issue 19's prefix benchmark, both stages (exactness of reuse, chunks
# riding in the questions' pass and snapshots taken on the way, then the three benchmarks), and
# a chunk-size sweep of the long-mix pair (512 and 2,048 tokens beside the bench's 1,024), and
# issue 20's mixed load, closed loop (images sharing tower passes under load).
# Carries .carry (carry.tar.xz with bin/instinct, bin/instinct-loadtest), .cache/qwen-tokenizer,
# .cache/fixtures. Results in $OUT: call.log, prefix.tgz, chunk512.tgz, mixed.tgz, chunk2048.tgz.
#   REV=<sha> bash docs/benchmarks/gpu-calls/next/call2.sh
export INSTINCT_CUDA_HOME=/usr/local/cuda HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
L=$OUT/call.log
T0=$(date +%s); t() { echo "=== [$(( $(date +%s) - T0 )) s] $*" >> $L; }
[ -f .carry/carry.tar.xz ] && tar xJf .carry/carry.tar.xz -C .carry
t "rev $REV; $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i 0)"
OUT=/tmp/prefix REVISION=$REV timeout 330 bash tools/reference/gpu_prefix_bench.sh > /dev/null 2>&1
t "prefix exit $?"
grep -vE "^\[|^ *$" /tmp/prefix/gpu_prefix_bench.log | tail -32 >> $L
tar czf $OUT/prefix.tgz --exclude=workloads -C /tmp prefix
sweep() {  # sweep CHUNK: the long-mix pair alone on a chunked server with chunks of CHUNK tokens
  OUT=/tmp/chunk$1 SERVERS=chunked CHUNK=$1 STAGES=bench REVISION=$REV timeout 100 bash tools/reference/gpu_prefix_bench.sh > /dev/null 2>&1
  t "chunk $1 exit $?"
  grep -E "^long_chunked|^long chunked" /tmp/chunk$1/gpu_prefix_bench.log >> $L
  tar czf $OUT/chunk$1.tgz --exclude=workloads -C /tmp chunk$1
}
sweep 512
RUNS=mixed_closed OUT=/tmp/mixed REVISION=$REV timeout 120 bash tools/reference/gpu_mixed_load.sh > /dev/null 2>&1
t "mixed exit $?"
grep -E "^(mixed_)|image stages" /tmp/mixed/gpu_mixed_load.log >> $L
tar czf $OUT/mixed.tgz -C /tmp mixed
sweep 2048
t done
