#!/usr/bin/env bash
# What a row bucket's shared GEMM winner costs a forward pass: one question of R ids, forward with
# the winners a server has (each 128-row bucket timed at its top, as its warm-up does) against the
# winners timed at R itself. Per try, in processes of their own:
#   bucket: 128-row buckets (INSTINCT_GEMM_EXACT_ROWS=0, as before 544e877), a fresh cache;
#           `instinct bench` over the bucket tops (writes the tuning file), then a second bench
#           over the R list on that cache (every bucket already has its winner);
#   exact:  a fresh cache; bench over the R list (each R timed at its own rows: with the exact
#           buckets, the default since 544e877, or as the first row count of its 128-row bucket).
# Tries alternate (bucket, exact, bucket, exact ...), TRIES of each. R must be multiples of 8 (the
# captured passes' padding), each in a 128-row bucket of its own, from 129 to 4,096.
# Run on the GPU machine from the repository root with the real-shape checkpoint in $REAL:
#   OUT=/tmp/bucket [REAL=/tmp/real] [BIN=.carry/bin] [ROWS=304,456,...] [TRIES=2] \
#     bash tools/reference/gemm_bucket_cost.sh
# Writes $OUT/{bucket,exact}_N[_tops].{json,log} and $OUT/bucket_cost.md (medians, ms).
set -euo pipefail
REAL=${REAL:-/tmp/real}
BIN=${BIN:-.carry/bin}
ROWS=${ROWS:-304,456,648,904,1048,1304,1704,2248,3304}
TRIES=${TRIES:-2}
mkdir -p "$OUT"
tops=""
for r in ${ROWS//,/ }; do
  tops+="${tops:+,}$(( (r + 127) / 128 * 128 ))"
done
bench() {  # bench CACHE LENGTHS NAME [EXACT_ROWS]
  env XDG_CACHE_HOME="$1" ${4:+INSTINCT_GEMM_EXACT_ROWS=$4} INSTINCT_LOG=info,instinct_kernels::cuda::blas=debug \
    "$BIN/instinct" bench --model "$REAL" --text-adapter "$REAL/adapter-text" --device cuda:0 \
    --lengths "$2" --batch-sizes 1 --batch-prompt-tokens 16 --runs 10 --batch-runs 3 --warmup 2 \
    --out "$OUT/$3.json" > "$OUT/$3.log" 2>&1 || echo "$3: bench failed" >&2
}
for n in $(seq 1 "$TRIES"); do
  cache=$(mktemp -d)
  bench "$cache" "$tops" "bucket_${n}_tops" 0
  bench "$cache" "$ROWS" "bucket_$n" 0
  rm -rf "$cache"
  cache=$(mktemp -d)
  bench "$cache" "$ROWS" "exact_$n"
  rm -rf "$cache"
done
python3 - "$OUT" "$ROWS" "$TRIES" > "$OUT/bucket_cost.md" <<'PY'
import json, sys
out, rows, tries = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
def medians(name):
    try:
        rep = json.load(open(f"{out}/{name}.json"))
    except Exception:
        return {}
    return {r["name"]: r["median_ms"] for r in rep.get("latency", [])}
runs = {(kind, n): medians(f"{kind}_{n}") for kind in ("bucket", "exact") for n in range(1, tries + 1)}
print("# Forward ms (median) of one question of R ids: winners of the bucket's top vs timed at R\n")
head = [f"bucket {n}" for n in range(1, tries + 1)] + [f"exact {n}" for n in range(1, tries + 1)]
print("| R | top | " + " | ".join(head) + " | exact / bucket |")
print("| ---: | ---: |" + " ---: |" * (len(head) + 1))
for r in rows:
    b = [runs[("bucket", n)].get(r) for n in range(1, tries + 1)]
    e = [runs[("exact", n)].get(r) for n in range(1, tries + 1)]
    cells = ["n/a" if v is None else f"{v:.2f}" for v in b + e]
    ratio = "n/a"
    if all(v is not None for v in b + e):
        ratio = f"{(sum(e) / len(e)) / (sum(b) / len(b)):.3f}"
    top = (int(r) + 127) // 128 * 128
    print(f"| {r} | {top} | " + " | ".join(cells) + f" | {ratio} |")
PY
echo "wrote $OUT/bucket_cost.md"
