#!/usr/bin/env bash
# Elastic chunks (issue 19): tools/reference/gpu_prefix_bench.sh with the build before them
# (.carry/old: instinct of 3d4f12e) and after (.carry/bin), one after the other on one GPU, the
# same checkpoint and loadtest. The new build also runs the parity stage (answers against the
# cache-off server, alone and beside the mix).
#   OLD=3d4f12e NEW=<sha> bash docs/benchmarks/gpu-calls/next/call_prefix.sh
# Results in $OUT: call.log, old.tgz, new.tgz.
export INSTINCT_CUDA_HOME=/usr/local/cuda HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
L=$OUT/call.log
T0=$(date +%s); t() { echo "=== [$(( $(date +%s) - T0 )) s] $*" >> $L; }
t "old $OLD new $NEW; $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i 0)"
cp .carry/bin/instinct-loadtest .carry/old/  # one loadtest for both builds
OUT=/tmp/old BIN=$PWD/.carry/old REVISION=$OLD STAGES=bench timeout 250 bash tools/reference/gpu_prefix_bench.sh > /dev/null 2>&1
t "old exit $?"
OUT=/tmp/new BIN=$PWD/.carry/bin REVISION=$NEW STAGES=parity,bench timeout 300 bash tools/reference/gpu_prefix_bench.sh > /dev/null 2>&1
t "new exit $?"
for v in old new; do echo "## $v" >> $L; grep -vE "^\[|^ *$" /tmp/$v/gpu_prefix_bench.log | tail -30 >> $L; done
tar czf $OUT/old.tgz --exclude=workloads -C /tmp old; tar czf $OUT/new.tgz --exclude=workloads -C /tmp new
t done
