"""Summarises a soak run (tools/reference/soak.sh): requests sent, answered and failed, p99 per
minute, and the least-squares slope of resident and device memory after the first minute (the
warm-up fills caches and allocators). Writes summary.json and summary.md into the run's folder."""

import argparse
import csv
import json
import statistics
from pathlib import Path


def slope_per_hour(points):
    """Least-squares slope of (seconds, value) points, per hour; None with fewer than 3 points."""
    if len(points) < 3:
        return None
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx * 3600


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--rate", type=float, required=True)
    ap.add_argument("--revision", default="unknown")
    ap.add_argument("--serve-flags", default="")
    ap.add_argument("--load-flags", default="")
    ap.add_argument("--hardware", default="unknown")
    a = ap.parse_args()

    report = json.loads((a.out / "soak.json").read_text())
    levels = report["levels"]
    minutes = []
    for i, level in enumerate(levels):
        lat = level.get("latency_ms") or {}
        minutes.append(
            {
                "minute": i + 1,
                "sent": level["sent"],
                "completed": level["completed"],
                "rejected_503": level["rejected_503"],
                "errors": level["errors"],
                "errors_by_status": level["errors_by_status"],
                "p50_ms": lat.get("p50"),
                "p99_ms": lat.get("p99"),
                "decisions_per_s": level["decision_throughput"],
            }
        )
    with open(a.out / "memory.csv") as f:
        rows = [(float(r["t_s"]), float(r["rss_kib"]), float(r["device_used_bytes"])) for r in csv.DictReader(f)]
    warm = [r for r in rows if r[0] >= 60] or rows
    rss_slope = slope_per_hour([(t, kib / 1024) for t, kib, _ in warm])
    dev_slope = slope_per_hour([(t, used / 2**20) for t, _, used in warm])
    p99s = [m["p99_ms"] for m in minutes if m["p99_ms"] is not None]
    summary = {
        "revision": a.revision,
        "serve_flags": a.serve_flags,
        "load_flags": a.load_flags,
        "hardware": a.hardware,
        "rate_rps": a.rate,
        "minutes": len(minutes),
        "sent": sum(m["sent"] for m in minutes),
        "completed": sum(m["completed"] for m in minutes),
        "errors": sum(m["errors"] for m in minutes),
        "rejected_503": sum(m["rejected_503"] for m in minutes),
        # Sent = completed + rejected + errors by the load tester's accounting; "unfinished"
        # requests (no answer by the hard deadline) are errors, listed in errors_by_status.
        "unanswered": sum(m["errors_by_status"].get("unfinished", 0) for m in minutes),
        "p99_ms_first_last_max": [p99s[0], p99s[-1], max(p99s)] if p99s else None,
        "rss_mib_first_last": [rows[0][1] / 1024, rows[-1][1] / 1024] if rows else None,
        "rss_slope_mib_per_hour_after_1min": rss_slope,
        "device_used_slope_mib_per_hour_after_1min": dev_slope,
        "per_minute": minutes,
    }
    (a.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    lines = [
        f"# Soak at {a.rate} requests/s for {len(minutes)} min ({a.revision})",
        "",
        f"- hardware: {a.hardware}; serve flags: `{a.serve_flags or '(demo model, cpu)'}`; load "
        f"flags: `{a.load_flags or '(synthetic upstream mix)'}`",
        f"- sent {summary['sent']}, completed {summary['completed']}, rejected (503) "
        f"{summary['rejected_503']}, errors {summary['errors']}, never answered "
        f"{summary['unanswered']}",
        f"- resident memory {summary['rss_mib_first_last']} MiB (first, last sample); slope after "
        f"the first minute {rss_slope} MiB/h",
        f"- device memory in use: slope after the first minute {dev_slope} MiB/h",
        "",
        "| minute | sent | completed | 503 | errors | p50 ms | p99 ms | decisions/s |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for m in minutes:
        lines.append(
            f"| {m['minute']} | {m['sent']} | {m['completed']} | {m['rejected_503']} | {m['errors']} | "
            f"{m['p50_ms']} | {m['p99_ms']} | {m['decisions_per_s']:.1f} |"
        )
    (a.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
