#!/usr/bin/env bash
# How much the GEMM kernel picked for one row count costs at another: for each row count R (ROWS),
# `instinct bench` in a process of its own with an empty cache, so the bucket holding R is tuned at
# R itself, with the tuner's candidate times logged (every candidate that gives the reference's
# bits, by algorithm tag). Then per GEMM family (in_dim x out_dim), the time of each algorithm at
# each R where it was a candidate and the winner at each R. (Written when buckets were 128 rows
# wide; since 544e877 every multiple of 8 up to 2,048 rows is a bucket of its own.)
# Run on the GPU machine from the repository root with the real-shape checkpoint in $REAL:
#   OUT=/tmp/sweep [REAL=/tmp/real] [BIN=.carry/bin] [ROWS=520,584,640,648,704,712,768] \
#     bash tools/reference/gemm_sweep.sh
# Writes $OUT/rows_R.log (the bench's log), $OUT/rows_R.json and $OUT/sweep.md.
set -euo pipefail
REAL=${REAL:-/tmp/real}
BIN=${BIN:-.carry/bin}
ROWS=${ROWS:-520,584,640,648,704,712,768}
mkdir -p "$OUT"
for r in ${ROWS//,/ }; do
  cache=$(mktemp -d)
  XDG_CACHE_HOME=$cache INSTINCT_LOG=info,instinct_kernels::cuda::blas=debug \
    "$BIN/instinct" bench --model "$REAL" --text-adapter "$REAL/adapter-text" --device cuda:0 \
    --lengths 16 --batch-sizes 1 --batch-prompt-tokens "$r" --runs 10 --batch-runs 20 --warmup 2 \
    --out "$OUT/rows_$r.json" > "$OUT/rows_$r.log" 2>&1 || echo "rows $r: bench failed" >&2
  rm -rf "$cache"
done
python3 - "$OUT" "$ROWS" > "$OUT/sweep.md" <<'PY'
import json, re, sys
out, rows = sys.argv[1], [int(r) for r in sys.argv[2].split(",")]
ansi = re.compile(r"\x1b\[[0-9;]*m")
times = {}  # (in, out) -> {tag: {rows: us}}
winner = {}  # (in, out) -> {rows: tag}
forward = {}
for r in rows:
    try:
        rep = json.load(open(f"{out}/rows_{r}.json"))
        forward[r] = rep["batch"][-1]["median_ms"]
    except Exception:
        pass
    for line in open(f"{out}/rows_{r}.log"):
        line = ansi.sub("", line)
        if "gemm tuned" not in line:
            continue
        f = dict(re.findall(r"(\w+)=(\[[^\]]*\]|\S+)", line))
        n = int(f["rows"])
        if n != r:
            continue
        fam = (int(f["in_dim"]), int(f["out_dim"]))
        us = json.loads(f["candidates_us"])
        tags = re.findall(r'"(\w+)"', f["algos"])
        for tag, t in zip(tags, us):
            times.setdefault(fam, {}).setdefault(tag, {})[n] = t
        m = re.search(r"Some\((\d+)\)", f["chosen"])
        if m:
            winner.setdefault(fam, {})[n] = tags[int(m.group(1))]
print("# GEMM kernels across row counts (us a call; * the winner at that row count)\n")
print("forward ms, the bucket tuned at its own row count: " + ", ".join(f"{r}: {forward.get(r, 'n/a')}" for r in rows) + "\n")
for fam in sorted(times):
    print(f"## {fam[0]} -> {fam[1]}\n")
    print("| algorithm | " + " | ".join(str(r) for r in rows) + " |")
    print("| --- |" + " ---: |" * len(rows))
    for tag, at in sorted(times[fam].items()):
        cells = []
        for r in rows:
            t = at.get(r)
            cells.append("" if t is None else f"{t:.0f}{'*' if winner.get(fam, {}).get(r) == tag else ''}")
        print(f"| `{tag}` | " + " | ".join(cells) + " |")
    print()
PY
echo "wrote $OUT/sweep.md"
