#!/usr/bin/env bash
# The planned device call, all in one (600 s at most), in order of need:
#   1. GPU tests of what landed without a GPU run (cuda_carried with
#      a_snapshot_inside_a_pass_is_the_prefixs_own_on_the_gpu, prefix_states with
#      on_the_gpu_a_question_leaves_a_prefix_snapshot_on_its_way, cuda_attention, cuda_vision,
#      cuda_ops, vision_tiny with on_the_gpu_several_images_in_one_tower_pass_...);
#   2. whole-model parity (84 questions);
#   3. gpu_vl_check.sh (screenshot parity and 1024x1024 latency), default and
#      `--snapshots-within on`;
#   4. gpu_prefix_bench.sh, both stages (exactness with reuse, riders and chunks; the three
#      benchmarks);
#   5. gpu_mixed_load.sh, closed loop (images sharing tower passes), if 130 s are left;
#   6. the long-mix pair with 512-token chunks, if 100 s are left.
# Carries .carry (carry.tar.xz: bin/instinct, bin/instinct-loadtest and the six test
# executables), .cache/qwen-tokenizer, .cache/fixtures. Results in $OUT: call.log, tests.log,
# check.json, vl.tgz, prefix.tgz, mixed.tgz, chunk512.tgz.
#   REV=<sha> bash docs/benchmarks/gpu-calls/next/call.sh
export INSTINCT_CUDA_HOME=/usr/local/cuda HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
L=$OUT/call.log
R=$OUT/tests.log
T0=$(date +%s); t() { echo "=== [$(( $(date +%s) - T0 )) s] $*" >> $L; }
# The binaries travel xz-packed: stripped, they are 39 MB, and the carry limit is 64 MiB with the tree.
[ -f .carry/carry.tar.xz ] && tar xJf .carry/carry.tar.xz -C .carry
t "rev $REV; $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i 0)"
( .carry/bin/instinct build-tokenizer --vocab .cache/qwen-tokenizer/qwen3_6.tiktoken --out /tmp/tokenizer.json > /tmp/ckpt.log 2>&1
  cd tools/reference && timeout 150 python3 real_shapes.py --out /tmp/real --tokenizer-json /tmp/tokenizer.json >> /tmp/ckpt.log 2>&1
  echo "ckpt exit $?" >> /tmp/ckpt.log ) &
CK=$!
run() {  # run TEST-EXECUTABLE SECONDS [FILTER/SKIP ARGS]
  local T=.carry/tests/$1 s=$2; shift 2
  echo "## $T $*" >> $R
  timeout $s $T --ignored --test-threads=1 --nocapture "$@" >> $R 2>&1; t "$1 exit $?"
}
run cuda_carried-test 90
run prefix_states-test 90
run cuda_attention-test 90
run cuda_vision-test 90
run cuda_ops-test 90
run vision_tiny-test 60
grep -E "^## |test result|panicked|FAILED" $R >> $L
t wait-checkpoint; wait $CK; tail -1 /tmp/ckpt.log >> $L
t parity
timeout 90 .carry/bin/instinct check --model /tmp/real --text-adapter /tmp/real/adapter-text --device cuda:0 \
  --corpus docs/validation/real-shapes/corpus_ids.json --goldens docs/validation/real-shapes/real_goldens.json \
  --out $OUT/check.json > /tmp/check.log 2>&1; t "check exit $?"
grep -E "questions on|PASS|FAIL|Error" /tmp/check.log >> $L
OUT=/tmp/vl timeout 200 bash tools/reference/gpu_vl_check.sh > /dev/null 2>&1
t "vl exit $?"
grep -E "vl_parity\]" /tmp/vl/gpu_vl_check.log | tail -2 >> $L
# The same with a new screenshot's single question in one pass (its snapshot taken on the way).
SERVE_FLAGS="--snapshots-within on" OUT=/tmp/vl_within WORK=/tmp/vl_check_within timeout 200 \
  bash tools/reference/gpu_vl_check.sh > /dev/null 2>&1
t "vl within exit $?"
grep -E "vl_parity\]" /tmp/vl_within/gpu_vl_check.log | tail -2 >> $L
tar czf $OUT/vl.tgz -C /tmp vl vl_within
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
left() { echo $(( 590 - ($(date +%s) - T0) )); }
[ $(left) -gt 130 ] && {
RUNS=mixed_closed OUT=/tmp/mixed REVISION=$REV timeout 120 bash tools/reference/gpu_mixed_load.sh > /dev/null 2>&1
t "mixed exit $?"
grep -E "^(mixed_)|image stages" /tmp/mixed/gpu_mixed_load.log >> $L
tar czf $OUT/mixed.tgz -C /tmp mixed
}
[ $(left) -gt 100 ] && sweep 512
t done
