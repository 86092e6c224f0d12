#!/usr/bin/env python3
"""Answers of one server against another's, request by request (issue 19's GPU exactness).

  answers_diff.py post URL BODIES.jsonl OUT.jsonl
      POSTs every body of BODIES.jsonl (instinct-loadtest --dump-workload lines, or one bare
      request body per line) to URL/v1/systemone, one at a time, and writes one line per request:
      {"i", "status", "answers"} (answers: question -> option -> probability).
  answers_diff.py compare BASE.jsonl OTHER.jsonl [--tol 2e-3]
      Max |Δp| over every option of every question, the questions whose choice changed, and any
      request answered in one file and not the other. Exit 1 when the max exceeds --tol, a choice
      changed or a request is missing; prints a one-line JSON summary either way.

Sending one request at a time keeps batching out of the comparison: both servers see each
question alone, so what differs is what the servers were configured to do differently (prefix
reuse, chunked prefill).
"""
import json
import sys
import urllib.error
import urllib.request


def post(url, bodies_path, out_path):
    with open(bodies_path) as f, open(out_path, "w") as out:
        for i, line in enumerate(f):
            line = line.strip()
            if not line:
                continue
            item = json.loads(line)
            body = item.get("body", item)
            req = urllib.request.Request(
                url.rstrip("/") + "/v1/systemone",
                data=json.dumps(body).encode(),
                headers={"content-type": "application/json"},
            )
            try:
                with urllib.request.urlopen(req, timeout=120) as resp:
                    status, payload = resp.status, json.load(resp)
            except urllib.error.HTTPError as e:
                status, payload = e.code, json.loads(e.read() or b"{}")
            answers = {
                q: a.get("probabilities", {}) for q, a in payload.get("answers", {}).items()
            }
            out.write(json.dumps({"i": i, "status": status, "answers": answers}) + "\n")


def load(path):
    with open(path) as f:
        return {r["i"]: r for r in map(json.loads, filter(str.strip, f))}


def choice(probs):
    return max(probs, key=probs.get) if probs else None


def compare(base_path, other_path, tol):
    base, other = load(base_path), load(other_path)
    worst, worst_at, changed, missing, questions = 0.0, None, [], [], 0
    for i, b in sorted(base.items()):
        o = other.get(i)
        if o is None or b["status"] != 200 or o["status"] != 200:
            missing.append({"i": i, "base": b["status"], "other": o and o["status"]})
            continue
        for q, pb in b["answers"].items():
            po = o["answers"].get(q)
            if po is None or set(po) != set(pb):
                missing.append({"i": i, "question": q})
                continue
            questions += 1
            for key, p in pb.items():
                d = abs(p - po[key])
                if d > worst:
                    worst, worst_at = d, {"i": i, "question": q, "option": key}
            # A changed choice only counts where the base's margin is not a tie at this tolerance.
            top = sorted(pb.values(), reverse=True)
            margin = top[0] - top[1] if len(top) > 1 else 1.0
            if choice(pb) != choice(po) and margin > 2 * tol:
                changed.append({"i": i, "question": q, "base": choice(pb), "other": choice(po)})
    summary = {
        "base": base_path, "other": other_path, "requests": len(base), "questions": questions,
        "max_abs_dp": worst, "at": worst_at, "choices_changed": changed, "missing": missing,
        "tol": tol, "pass": worst <= tol and not changed and not missing and questions > 0,
    }
    print(json.dumps(summary))
    return 0 if summary["pass"] else 1


def main(argv):
    if len(argv) == 4 and argv[0] == "post":
        post(*argv[1:])
        return 0
    if len(argv) in (3, 5) and argv[0] == "compare":
        tol = float(argv[4]) if len(argv) == 5 and argv[3] == "--tol" else 2e-3
        return compare(argv[1], argv[2], tol)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
