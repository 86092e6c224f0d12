#!/usr/bin/env python3
"""Served answers to the real fixtures against the real-shape checkpoint's goldens (DESIGN.md's rule).

  served_parity.py ANSWERS.jsonl [ANSWERS.jsonl ...]

Each ANSWERS file is `answers_diff.py post` output for the fixtures workload (`instinct-loadtest
--fixtures ... --dump-workload`, native format, one question per request, in fixture order),
answered by `instinct serve` on the seeded real-shape checkpoint (`real_shapes.py`). Every
fixture question with a golden of the same option count is checked: max |p − p_fp32| against the
allowance 2 × (the bf16 reference's largest error) + 0.01, and the fp32 choice kept wherever the
fp32 margin is at least 0.05. Prints one line per file; exit 1 if any file misses the rule.
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GOLDENS = ROOT / "docs/validation/real-shapes/real_goldens.json"
FIXTURES = ROOT.parent / "shared/fixtures/cua-s1-4b-0.2-text.json"


def main(paths):
    goldens = json.load(open(GOLDENS))["questions"]
    by_prompt = {}
    for q in goldens:
        by_prompt.setdefault(q["prompt"], []).append(q)
    fixtures = json.load(open(FIXTURES))["fixtures"]
    allowance = 2 * max(q["max_abs_diff"] for q in goldens) + 0.01
    ok = True
    for path in paths:
        worst, kept, checked, n = 0.0, 0, 0, 0
        for line in open(path):
            row = json.loads(line)
            if row["status"] != 200:
                continue
            probs = list(row["answers"]["q0"].values())
            fixture = fixtures[row["i"]]
            gold = next((q for q in by_prompt.get("fixture_" + fixture["id"], [])
                         if q["n_options"] == len(probs)), None)
            if gold is None:
                continue
            n += 1
            worst = max(worst, max(abs(a - b) for a, b in zip(probs, gold["p_fp32"])))
            if gold["margin_fp32"] >= 0.05:
                checked += 1
                kept += int(max(range(len(probs)), key=probs.__getitem__) == gold["argmax_fp32"])
        passed = n > 0 and worst <= allowance and kept == checked
        ok &= passed
        print(f"{path}: {n} fixture questions, max |p - p_fp32| {worst:.4f} "
              f"(allowance {allowance:.4f}), choice kept {kept}/{checked}: "
              f"{'PASS' if passed else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1:]))
