#!/usr/bin/env bash
# Soak: `instinct serve` held at a steady open-loop load (Poisson arrivals of the synthetic upstream
# mix) for MINUTES one-minute levels, while its resident memory (and, on a GPU, the device memory in
# use) is sampled every SAMPLE_S seconds. Summarised by soak_summary.py: errors and lost requests
# (sent - completed), p99 per minute, and the slope of resident and device memory after the first
# minute. Everything lands in $OUT (capacity.json, soak.json, memory.csv, serve.log, summary.json,
# summary.md).
#
# RATE (requests/s) is the load; without it, a 30 s closed loop at CLIENTS (16) clients measures
# capacity first and the soak runs at LOAD_FRACTION (0.7) of it. LOAD_FLAGS adds flags to both
# instinct-loadtest runs (e.g. a lighter mix for the CPU demo model).
#   OUT=/tmp/soak MINUTES=10 CLIENTS=4 LOAD_FLAGS="--questions 1 --prompt-tokens 300" \
#     tools/reference/soak.sh                                               # demo model on the CPU
#   OUT=$OUT/soak MINUTES=30 SERVE_FLAGS="--device cuda:0 --model /tmp/real/base \
#     --text-adapter /tmp/real/text" BIN=.carry/bin tools/reference/soak.sh   # on the GPU
set -euo pipefail

cd "$(dirname "$0")/../.."
ROOT=$(pwd)
OUT=${OUT:?set OUT to the results folder}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BIN=${BIN:-$ROOT/target/release}
PORT=${PORT:-8010}
MINUTES=${MINUTES:-30}
SAMPLE_S=${SAMPLE_S:-5}
LOAD_FRACTION=${LOAD_FRACTION:-0.7}
SEED=${SEED:-78}
PYTHON=${PYTHON:-python3}
SERVE_FLAGS=${SERVE_FLAGS:-}
LOAD_FLAGS=${LOAD_FLAGS:-}
CLIENTS=${CLIENTS:-16}
REVISION=${REVISION:-$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)}
URL="http://127.0.0.1:$PORT"

# shellcheck source=tools/reference/gpu_common.sh
source "$ROOT/tools/reference/gpu_common.sh"
require_carried "$BIN/instinct" "$BIN/instinct-loadtest"

# shellcheck disable=SC2086 # SERVE_FLAGS is a list of flags
"$BIN/instinct" serve --bind "127.0.0.1:$PORT" $SERVE_FLAGS >"$OUT/serve.log" 2>&1 &
server_pid=$!
for _ in $(seq 1 600); do
  curl -sf "$URL/readyz" >/dev/null && break
  kill -0 "$server_pid" 2>/dev/null || { echo "the server exited; see $OUT/serve.log"; exit 1; }
  sleep 1
done
curl -sf "$URL/readyz" >/dev/null || { echo "the server never became ready"; exit 1; }

load() {  # load JSON ARGS...: one instinct-loadtest run against the server
  local json=$1
  shift
  # shellcheck disable=SC2086 # LOAD_FLAGS is a list of flags
  "$BIN/instinct-loadtest" --target "$URL" --seed "$SEED" --synthetic-count 512 --quiet \
    --json "$json" $LOAD_FLAGS "$@"
}

if [[ -z ${RATE:-} ]]; then
  load "$OUT/capacity.json" --concurrency "$CLIENTS" --duration 30 --requests 1000000
  RATE=$("$PYTHON" -c 'import json,sys; r=json.load(open(sys.argv[1]))["levels"][0]; print(round(r["request_throughput"]*float(sys.argv[2]), 1))' \
    "$OUT/capacity.json" "$LOAD_FRACTION")
fi
echo "soak: $MINUTES min at $RATE requests/s against $REVISION (serve: ${SERVE_FLAGS:-demo}; load: ${LOAD_FLAGS:-upstream mix})"

# Memory sampler: seconds since start, resident KiB, device bytes in use (0 without a GPU).
sample_memory() {
  local t0 now rss used
  t0=$(date +%s)
  echo "t_s,rss_kib,device_used_bytes" >"$OUT/memory.csv"
  while kill -0 "$server_pid" 2>/dev/null; do
    now=$(date +%s)
    rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$server_pid/status" 2>/dev/null || echo 0)
    used=$(curl -sf "$URL/metrics" | awk '
      /^instinct_device_memory_bytes\{/ && /kind="total"/ {total += $NF}
      /^instinct_device_memory_bytes\{/ && /kind="free"/ {free += $NF}
      END {printf "%.0f", total - free}')
    echo "$((now - t0)),${rss:-0},${used:-0}" >>"$OUT/memory.csv"
    sleep "$SAMPLE_S"
  done
}
sample_memory &
sampler_pid=$!

rates=$("$PYTHON" -c 'import sys; print(",".join([sys.argv[1]] * int(sys.argv[2])))' "$RATE" "$MINUTES")
load "$OUT/soak.json" --rate "$rates" --duration 60 --requests 100000000 --warmup 0
kill "$sampler_pid" 2>/dev/null || true
wait "$sampler_pid" 2>/dev/null || true

"$PYTHON" "$ROOT/tools/reference/soak_summary.py" "$OUT" --rate "$RATE" --revision "$REVISION" \
  --serve-flags "$SERVE_FLAGS" --load-flags "$LOAD_FLAGS" --hardware "$(hardware_of cuda:0 2>/dev/null || true) / $(nproc) CPUs"
