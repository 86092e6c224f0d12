#!/usr/bin/env python3
"""Per-kernel time of the last forward pass in an Nsight Compute CSV.

Reads `ncu --metrics gpu__time_duration.sum --csv` output (optionally gzipped), keeps the kernels
from the last `embedding` launch on (the last forward of the run), and prints a markdown table of
calls, total and per-call microseconds per kernel name and grid, largest first. With `--passes N`
(a profile with no `embedding` launch, such as the vision tower's in `instinct bench
--image-sizes`), every kernel of the profile is kept and the figures are per pass, the profile
holding N passes.

    python3 tools/reference/ncu_forward.py ncu-712.csv.gz
    python3 tools/reference/ncu_forward.py --passes 2 ncu-tower.csv.gz
"""
import csv
import gzip
import io
import sys
from collections import OrderedDict


def rows(path):
    raw = open(path, "rb").read()
    if path.endswith(".gz"):
        raw = gzip.decompress(raw)
    text = raw.decode("utf-8", "replace")
    start = text.find('"ID"')
    return list(csv.DictReader(io.StringIO(text[start:])))


def main():
    args = sys.argv[1:]
    passes = 1
    if args[:1] == ["--passes"]:
        passes, args = int(args[1]), args[2:]
    data = [r for r in rows(args[0]) if r.get("Metric Name") == "gpu__time_duration.sum"]
    if passes > 1:
        last = data
    else:
        starts = [i for i, r in enumerate(data) if r["Kernel Name"].startswith("embedding")]
        if not starts:
            sys.exit("no embedding kernel in the profile (a profile of N whole passes: --passes N)")
        last = data[starts[-1]:]
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
    by = OrderedDict()
    total = 0.0
    for r in last:
        us = float(r["Metric Value"].replace(",", "")) * scale[r["Metric Unit"]] / passes
        name = r["Kernel Name"]
        if not name[0].isalpha() or "nvjet" in name or "cublas" in name.lower():
            name = f"{name[:60]} grid {r.get('Grid Size', '')}"
        else:
            name = name.split("(")[0]
        calls, t = by.get(name, (0, 0.0))
        by[name] = (calls + 1 / passes, t + us)
        total += us
    print(f"kernels per pass: {len(last) / passes:g}, sum of durations per pass: {total / 1e3:.3f} ms\n")
    print("| kernel | calls | µs total | µs per call | share |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, (calls, t) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"| `{name}` | {calls:g} | {t:.1f} | {t / calls:.1f} | {100 * t / total:.1f} % |")


if __name__ == "__main__":
    main()
