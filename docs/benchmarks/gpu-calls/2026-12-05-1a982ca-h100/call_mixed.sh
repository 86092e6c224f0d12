#!/usr/bin/env bash
# Screenshots and preparation (issues 20 and 18), one GPU call after call_prefix.sh on the same
# machine (its /tmp/real checkpoint is reused when there):
#   1. the host CPU's preparation times: preprocess_time on the committed test images (as
#      tools/reference/preprocess_bench.sh), prepare_timing on the 60 fixtures (as prepare_bench.sh);
#   2. tools/reference/gpu_mixed_load.sh: half text, half 1024x1024 screenshots;
#   3. tools/reference/gpu_vl_check.sh: screenshot parity and latency on this build.
# Carries .carry (bin: instinct, instinct-loadtest, preprocess_time, prepare_timing),
# .cache/qwen-tokenizer, .cache/fixtures. Results in $OUT: call.log, preprocess.tsv,
# prepare.tsv, mixed.tgz, vl.tgz.
#   NEW=<sha> bash docs/benchmarks/gpu-calls/next/call_mixed.sh
export INSTINCT_CUDA_HOME=/usr/local/cuda HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
L=$OUT/call.log
T0=$(date +%s); t() { echo "=== [$(( $(date +%s) - T0 )) s] $*" >> $L; }
t "rev $NEW; $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i 0); $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
I=model/tests/data/images
timeout 60 .carry/bin/preprocess_time $I/png_rgb_1024x1024.png $I/png_rgb_1040x736.png $I/png_rgba_1040x736.png \
  $I/png_palette_1040x736.png $I/png_gray_1040x736.png $I/jpeg_rgb_1040x736.jpg $I/jpeg_rgb_640x480.jpg \
  $I/png_rgb_320x240.png > $OUT/preprocess.tsv 2>&1; t "preprocess_time exit $?"
INSTINCT_QWEN_VOCAB=$PWD/.cache/qwen-tokenizer/qwen3_6.tiktoken INSTINCT_FIXTURES=$PWD/.cache/fixtures \
  timeout 60 .carry/bin/prepare_timing 41 > $OUT/prepare.tsv 2>&1; t "prepare_timing exit $?"
cat $OUT/preprocess.tsv >> $L
OUT=/tmp/mixed REVISION=$NEW timeout 330 bash tools/reference/gpu_mixed_load.sh > /dev/null 2>&1
t "mixed exit $?"
grep -E "^(text_closed|mixed_)|image stages|===" /tmp/mixed/gpu_mixed_load.log >> $L
OUT=/tmp/vl timeout 200 bash tools/reference/gpu_vl_check.sh > /dev/null 2>&1
t "vl exit $?"
grep -E "vl_parity\]" /tmp/vl/gpu_vl_check.log | tail -3 >> $L
tar czf $OUT/mixed.tgz -C /tmp mixed; tar czf $OUT/vl.tgz -C /tmp vl
t done
