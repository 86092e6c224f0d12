"""Settings of one `instinct bench` row set side by side: medians and answers' bits per row.

Reads several `instinct bench --out` reports of the same rows run under different settings (in one
GPU call, alternated), named LABEL=PATH, and prints a markdown table: each row's median per label,
the ratio of each setting's median to the first setting's (below 1: faster than the first), and
how many labels' answers (`probs_26`, latency rows) are the first label's bit for bit. Labels with
a trailing digit after a letter (off1, off2) or a letter after a digit (w8a, w8b) are runs of one
setting: their medians are listed apart, and the ratio takes the median of the setting's runs.
Standard library only.

    python3 bench_ab.py off1=a.json on1=b.json off2=c.json on2=d.json
"""

import json
import re
import statistics
import sys


def rows(path):
    with open(path) as f:
        report = json.load(f)
    out = {}
    for kind in ("latency", "batch"):
        for row in report.get(kind, []):
            out[row["name"]] = row
    return out


def setting(label):
    """off1, off2 -> off; w8a, w8b -> w8; anything else is its own setting."""
    if re.search(r"[a-z][0-9]$", label) or re.search(r"[0-9][a-z]$", label):
        return label[:-1]
    return label


def main(args):
    runs = []
    for arg in args:
        label, _, path = arg.partition("=")
        if not path:
            sys.exit(f"expected LABEL=PATH, got {arg!r}")
        runs.append((label, rows(path)))
    if not runs:
        sys.exit(__doc__)
    names = [name for name in runs[0][1] if all(name in r for _, r in runs)]
    settings = list(dict.fromkeys(setting(label) for label, _ in runs))
    base = settings[0]
    head = ["row"] + [f"{label} ms" for label, _ in runs]
    head += [f"{s} / {base}" for s in settings[1:]] + ["answers = first's"]
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" + " ---: |" * (len(head) - 2) + " --- |")
    for name in names:
        medians = {label: r[name]["median_ms"] for label, r in runs}
        by_setting = {
            s: statistics.median(m for label, m in medians.items() if setting(label) == s)
            for s in settings
        }
        first = runs[0][1][name].get("probs_26")
        same = [label for label, r in runs[1:] if r[name].get("probs_26") == first]
        cells = [name] + [f"{medians[label]:.3f}" for label, _ in runs]
        cells += [f"{by_setting[s] / by_setting[base]:.3f}" for s in settings[1:]]
        cells.append(f"{len(same)} of {len(runs) - 1}" if first is not None else "n/a")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
