#!/usr/bin/env bash
# Planned first device call of the next session (not run yet: the seventh session was lent no
# device). Main as it stands, on an H200 if one is lent (the issues' hardware; the sixth
# session's figures are all H100):
#   1. GPU tests of what landed without a GPU run: cuda_carried (with
#      a_snapshot_inside_a_pass_is_the_prefixs_own_on_the_gpu: DeltaState::final_at and
#      ConvWindow::output_at bit for bit against a pass of the prefix alone), prefix_states (with
#      on_the_gpu_a_question_leaves_a_prefix_snapshot_on_its_way), cuda_attention (the shared flash
#      shape rule), cuda_vision, cuda_ops, vision_tiny (with
#      on_the_gpu_several_images_in_one_tower_pass_get_the_features_each_gets_alone);
#   2. whole-model parity (84 questions);
#   3. tools/reference/gpu_vl_check.sh (screenshot parity and 1024x1024 latency);
#   3b. the same with `--snapshots-within on` (a new screenshot's single question in one pass);
# (the prefix benchmark and the mixed load are call2.sh: the two together would pass 600 s).
# if 1 and 3b pass, set SNAPSHOTS_WITHIN = true for CudaBackend (runtime/src/engine.rs).
# Carries .carry (bin: instinct, instinct-loadtest; tests: cuda_carried, prefix_states,
# cuda_attention, cuda_vision, cuda_ops, vision_tiny), .cache/qwen-tokenizer, .cache/fixtures.
# Results in $OUT: call.log, tests.log, check.json, vl.tgz.
#   REV=<sha> bash docs/benchmarks/gpu-calls/next/call1.sh
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
t done
