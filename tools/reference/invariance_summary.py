#!/usr/bin/env python3
"""Summarises a gpu_invariance.sh run (its results folder as the one argument) as JSON:

- per server: of the fixture questions answered alone and again beside the load, how many are
  bit-identical, and the largest |dp| between the two;
- across servers, alone: the largest |dp| between invariant and variant (what the mode changes)
  and between default and invariant (prefix reuse on against off, both invariant);
- per server: the upstream mix's decisions/s and mean latency at 1 and 64 clients, and the
  invariant mode's throughput against the variant one.
"""
import json
import os
import sys


def load(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return {r["i"]: r for r in map(json.loads, filter(str.strip, f))}


def questions(a, b):
    """(questions in both, bit-identical ones, largest |dp|), over requests answered 200 by both."""
    total, same, worst = 0, 0, 0.0
    for i, ra in a.items():
        rb = b.get(i)
        if rb is None or ra["status"] != 200 or rb["status"] != 200:
            continue
        for q, pa in ra["answers"].items():
            pb = rb["answers"].get(q)
            if pb is None or set(pa) != set(pb):
                continue
            total += 1
            same += all(pa[k] == pb[k] for k in pa)
            worst = max([worst] + [abs(pa[k] - pb[k]) for k in pa])
    return {"questions": total, "bit_identical": same, "max_abs_dp": worst}


def throughput(path):
    if not os.path.exists(path):
        return None
    levels = json.load(open(path))["levels"]
    return {
        str(l["load"].get("concurrency")): {
            "decisions_per_s": round(l["decision_throughput"], 1),
            "mean_ms": round((l.get("latency_ms") or {}).get("mean") or 0, 2),
            "p99_ms": round((l.get("latency_ms") or {}).get("p99") or 0, 2),
            "completed": l["completed"],
            "errors": l["errors"],
        }
        for l in levels
    }


def main(out):
    summary = {"alone_vs_loaded": {}, "across": {}, "throughput": {}}
    alone = {}
    for name in ["variant", "invariant", "default"]:
        a = load(os.path.join(out, f"alone_{name}.jsonl"))
        b = load(os.path.join(out, f"loaded_{name}.jsonl"))
        if a is not None:
            alone[name] = a
        if a is not None and b is not None:
            summary["alone_vs_loaded"][name] = questions(a, b)
        t = throughput(os.path.join(out, f"tput_{name}.json"))
        if t is not None:
            summary["throughput"][name] = t
    for x, y in [("invariant", "variant"), ("default", "invariant")]:
        if x in alone and y in alone:
            summary["across"][f"{x}_vs_{y}"] = questions(alone[y], alone[x])
    t = summary["throughput"]
    if "invariant" in t and "variant" in t:
        summary["invariant_over_variant"] = {
            c: round(t["invariant"][c]["decisions_per_s"] / t["variant"][c]["decisions_per_s"], 3)
            for c in t["invariant"]
            if c in t["variant"] and t["variant"][c]["decisions_per_s"] > 0
        }
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
