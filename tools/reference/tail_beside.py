#!/usr/bin/env python3
"""Lines the slow requests of one load up with a second load sent beside it.

Reads two `instinct-loadtest --samples` files (JSON lines with `at_unix_ms` and `latency_ms`):
the short requests (e.g. the upstream mix) and the long ones sent beside them. For the short
requests over the latency cut (their p99 by default) and for all of them, reports how many long
requests were in flight when each was sent, and the short requests' server phases. A tail that
comes from the long requests shows as more of them in flight for the slow ones.

    python3 tools/reference/tail_beside.py long_chunked_with.samples.jsonl \
        long_chunked_beside.samples.jsonl [--cut-ms 100]
"""

import argparse
import json
import statistics


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def in_flight(at, longs):
    """Long requests sent before `at` and not answered by then."""
    return sum(1 for s, e in longs if s <= at < e)


def percentile(values, q):
    values = sorted(values)
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(q * len(values)))]


def describe(name, rows, longs):
    if not rows:
        return f"{name}: none"
    flights = [in_flight(r["at_unix_ms"], longs) for r in rows]
    phases = {}
    for r in rows:
        for k, v in (r.get("server_ms") or {}).items():
            phases.setdefault(k, []).append(v)
    parts = [
        f"{name}: {len(rows)} requests, latency mean {statistics.mean(r['latency_ms'] for r in rows):.1f} ms",
        f"long requests in flight at send: mean {statistics.mean(flights):.2f}, "
        f"none for {sum(f == 0 for f in flights) / len(flights):.0%}",
    ]
    for k in sorted(phases):
        parts.append(f"server {k} mean {statistics.mean(phases[k]):.1f} ms")
    return "; ".join(parts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("short", help="samples of the short requests")
    ap.add_argument("long", help="samples of the long requests sent beside them")
    ap.add_argument("--cut-ms", type=float, help="latency over which a short request is slow (default: their p99)")
    args = ap.parse_args()
    short = [r for r in read(args.short) if r["outcome"] == "ok"]
    longs = [(r["at_unix_ms"], r["at_unix_ms"] + r["latency_ms"]) for r in read(args.long)]
    cut = args.cut_ms if args.cut_ms is not None else percentile([r["latency_ms"] for r in short], 0.99)
    slow = [r for r in short if r["latency_ms"] >= cut]
    print(f"cut {cut:.1f} ms; {len(longs)} long requests")
    print(describe("slow", slow, longs))
    print(describe("all", short, longs))


if __name__ == "__main__":
    main()
