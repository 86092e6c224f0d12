#!/usr/bin/env bash
# Captured passes (CUDA graphs) off against on, on one GPU in one call: `instinct bench` forward
# rows (one question at 16/139/300/712/2,000 ids; 4 questions of 300 ids in one pass: plain
# passes), then the same lengths over HTTP against `instinct serve` as deployed (prefix reuse on:
# each question resumes from the cached system turn, a carried pass). Each pair runs back to
# back with the same seeded prompts. Writes bench_{off,on}.json, http_{off,on}.json,
# serve_{off,on}.log and summary.txt (medians, ratios, the servers' graph metrics) into $OUT.
#
#   OUT=/tmp/graphs [REAL=/tmp/real] [BIN=.carry/bin] [REVISION=...] [RUNS=40] [STAGES=forward,http] \
#     [LENGTHS=16,139,300,712,2000] [BATCHES=4] [SERVE_FLAGS="--prefix-cache-mib 0"] \
#     bash tools/reference/gpu_graphs_bench.sh
# SERVE_FLAGS adds flags to both servers (with "--prefix-cache-mib 0" a question runs whole, not
# resumed from the system turn).
# Needs the seeded real-shape checkpoint in $REAL (it is built when missing: real_shapes.py).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:?set OUT}
REAL=${REAL:-/tmp/real}
BIN=${BIN:-.carry/bin}
PYTHON=${PYTHON:-python3}
REVISION=${REVISION:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
RUNS=${RUNS:-40}
PORT=${PORT:-8089}
STAGES=${STAGES:-forward,http}
mkdir -p "$OUT"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/summary.txt"; }
# shellcheck source=tools/reference/gpu_common.sh
source "$ROOT/tools/reference/gpu_common.sh"
require_carried "$BIN/instinct"
ensure_checkpoint "$BIN/instinct" "$PYTHON"
HARDWARE=$(hardware_of cuda:0)
stamp "hardware: $HARDWARE; revision: $REVISION"

lengths=${LENGTHS:-16,139,300,712,2000}
common=(--model "$REAL" --text-adapter "$REAL/adapter-text" --device cuda:0 --hardware "$HARDWARE"
  --revision "$REVISION" --runs "$RUNS" --warmup 2 --max-row-s 10)
if [[ $STAGES == *forward* ]]; then
  for g in off on; do
    stamp "forward, graphs $g"
    timeout 120 "$BIN/instinct" bench "${common[@]}" --lengths "$lengths" --batch-sizes "${BATCHES:-4}" --batch-runs "$RUNS" \
      --max-batch-tokens 2048 --cuda-graphs "$g" --out "$OUT/bench_$g.json" > "$OUT/bench_$g.log" 2>&1
    stamp "exit $?"
  done
fi
if [[ $STAGES == *http* ]]; then
  # Over HTTP a question holds at least the system turn (78 ids): shorter rows cannot be sent.
  http_lengths=$(echo "$lengths" | tr ',' '\n' | awk '$1 >= 100' | paste -sd,)
  for g in off on; do
    # shellcheck disable=SC2086 # SERVE_FLAGS is a list of flags
    serve_real "$g" 90 --cuda-graphs "$g" ${SERVE_FLAGS:-} || continue
    timeout 120 "$BIN/instinct" bench --http "http://127.0.0.1:$PORT" "${common[@]}" \
      --lengths "$http_lengths" --out "$OUT/http_$g.json" > "$OUT/http_$g.log" 2>&1
    stamp "http $g exit $?"
    curl -s "http://127.0.0.1:$PORT/metrics" | grep -E "^instinct_graph|kind=\"graphs\"" \
      > "$OUT/metrics_$g.txt"
    stop_server
  done
fi

$PYTHON - "$OUT" <<'EOF' | tee -a "$OUT/summary.txt"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def rows(path):
    if not path.exists():
        return {}
    d = json.loads(path.read_text())
    return {r["name"]: r for r in d.get("latency", []) + d.get("batch", [])}
for kind in ("bench", "http"):
    off, on = rows(out / f"{kind}_off.json"), rows(out / f"{kind}_on.json")
    for name, r in off.items():
        a, b = r.get("median_ms"), on.get(name, {}).get("median_ms")
        ratio = f"{a / b:.3f}x" if a and b else "-"
        print(f"{kind:5} {name:6} median off {a} ms, on {b} ms, off/on {ratio}")
        # The same question's 26 letter probabilities with and without graphs: the same bits?
        pa, pb = r.get("probs_26"), on.get(name, {}).get("probs_26")
        if pa and pb:
            d = max(abs(x - y) for x, y in zip(pa, pb))
            print(f"      {name:6} probabilities {'identical' if pa == pb else f'differ, max {d:.3e}'}")
for g in ("off", "on"):
    m = out / f"metrics_{g}.txt"
    if m.exists():
        print(f"metrics, graphs {g}:\n" + m.read_text())
EOF
stamp done
