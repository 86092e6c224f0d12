"""The markdown table of a benchmark run: instinct beside transformers eager and transformers + FLA.

Reads the JSON reports of one `gpu_bench.sh` run (standard library only; runs anywhere):
  instinct.json       `instinct bench` forward rows (latency at 139/712/15,446 ids, packed batches)
  instinct_http.json  `instinct bench --http` rows (one question over HTTP at the same lengths)
  peer_torch.json     `peer_bench.py --backend torch`
  peer_fla.json       `peer_bench.py --backend fla`
  serve.log           `instinct serve`'s log (its load and warm-up line), optional

Columns: each system's median; instinct's speed-up over each peer (peer time / instinct time, or instinct
tokens/s / peer tokens/s: above 1 means instinct is faster); the ceiling (the larger of the bandwidth-bound
time, weight bytes / measured copy rate, and the FLOP-bound time, model FLOPs / measured bf16 GEMM rate; for
batches as tokens/s), and instinct's share of it. The ceilings are the peer run's measurements (same GPU, same
call); the FLOPs and weight bytes are the analytic counts in instinct's rows.

    python3 bench_table.py DIR [--out DIR/README-table.md]
    python3 bench_table.py --instinct a.json --http b.json --torch c.json --fla d.json
"""

import argparse
import json
import re
import sys
from pathlib import Path

LATENCY = ["139", "712", "15446"]
BATCHES = [8, 32, 128]


def load(path):
    if path is None or not Path(path).exists():
        return None
    return json.loads(Path(path).read_text())


def num(x, digits=None) -> str:
    if x is None:
        return "not measured"
    if digits is not None:
        return f"{x:,.{digits}f}"
    if abs(x) >= 100:
        return f"{x:,.1f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    if abs(x) >= 1 or x == 0:
        return f"{x:.2f}"
    return f"{x:.3g}"


def ratio(x) -> str:
    return "" if x is None else f"{x:.2f}×"


def percent(x) -> str:
    if x is None:
        return ""
    return f"{100 * x:.1f} %" if 100 * x >= 1 else f"{100 * x:.2g} %"


def rows_by_name(report, key) -> dict:
    if not report:
        return {}
    return {row["name"]: row for row in report.get(key, []) if "error" not in row}


def batch_row(report, questions):
    for row in (report or {}).get("batch", []):
        if row.get("questions") == questions and "error" not in row:
            return row
    return None


def ceilings_of(*reports) -> dict | None:
    """The measured copy rate and GEMM rate: instinct's own (from --ceilings), else a peer report's."""
    for report in reports:
        if not report:
            continue
        c = report.get("ceilings") or {}
        c = c.get("measured", c)
        if c.get("copy_GBps_read_plus_write") and c.get("gemm_bf16_TFLOPs"):
            return {"copy_GBps": c["copy_GBps_read_plus_write"], "gemm_TFLOPs": c["gemm_bf16_TFLOPs"]}
    return None


def bound_ms(row, ceilings):
    """(bound ms, bandwidth ms, FLOP ms) of an instinct row, or Nones."""
    if not row or not ceilings or "flops" not in row:
        return None, None, None
    bandwidth = row["weight_bytes"] / (ceilings["copy_GBps"] * 1e9) * 1e3
    flops = row["flops"]["total"] / (ceilings["gemm_TFLOPs"] * 1e12) * 1e3
    return max(bandwidth, flops), bandwidth, flops


def serve_times(log_path):
    """(load ms, warm-up ms) from `instinct serve`'s ready line."""
    if log_path is None or not Path(log_path).exists():
        return None
    text = re.sub(r"\x1b\[[0-9;]*m", "", Path(log_path).read_text(errors="replace"))
    found = re.search(r"load_ms=([\d.]+)\s+warmup_ms=([\d.]+)", text)
    return (float(found.group(1)), float(found.group(2))) if found else None


def peer_latency(peer, name):
    return ((peer or {}).get("latency") or {}).get(name, {}).get("median_ms")


def peer_rate(peer, questions):
    return ((peer or {}).get("batch") or {}).get(str(questions), {}).get("prompt_tokens_per_s")


def table(ours, http, torch, fla, serve_log) -> str:
    ceilings = ceilings_of(ours, torch, fla)
    head = [
        "| measurement | instinct | transformers eager | transformers + FLA | instinct speed-up vs eager "
        "| vs FLA | ceiling | instinct % of ceiling |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines = list(head)

    def line(label, mine, eager, flash, faster, ceiling="", share=""):
        """`faster(a, b)`: instinct's speed-up given its value a and a peer's b."""
        vs = [ratio(faster(mine, peer)) if mine is not None and peer is not None else "" for peer in (eager, flash)]
        cells = [label, num(mine), num(eager), num(flash), *vs, ceiling, share]
        lines.append("| " + " | ".join(cells) + " |")

    time_faster = lambda mine, peer: peer / mine  # noqa: E731
    rate_faster = lambda mine, peer: mine / peer  # noqa: E731

    load = (ours or {}).get("load") or {}
    line(
        "load, s (instinct: backend start + read, merge, upload)",
        load.get("total_s"),
        (torch or {}).get("load_seconds"),
        (fla or {}).get("load_seconds"),
        time_faster,
    )
    warmup = (ours or {}).get("warmup") or {}
    first, first_row = warmup.get("first_call_ms"), warmup.get("first_call_row")
    peer_first = [((p or {}).get("warmup_ms") or {}).get("single_139", [None])[0] for p in (torch, fla)]
    label = "first call after load (warm-up), 139 ids, ms"
    if first_row not in (None, "139"):
        label += f" (instinct: row {first_row})"
    line(label, first, *peer_first, time_faster)
    served = serve_times(serve_log)
    if served:
        lines.append(
            f"| `instinct serve`: load, then warm-up decision, ms | {num(served[0])} / {num(served[1])} "
            "| | | | | | |"
        )

    forward, over_http = rows_by_name(ours, "latency"), rows_by_name(http, "latency")
    for mode, rows in (("forward", forward), ("HTTP", over_http)):
        for name in LATENCY:
            row = rows.get(name)
            bound, _, _ = bound_ms(row, ceilings)
            mine = row and row["median_ms"]
            label = f"{int(name):,} ids, {mode}, warm median ms"
            # An HTTP request is fitted to the row's length; the label says where the fit missed.
            if mode == "HTTP" and row and row.get("tokens") != int(name):
                label += f" ({row.get('tokens'):,} ids sent)"
            line(
                label,
                mine,
                peer_latency(torch, name),
                peer_latency(fla, name),
                time_faster,
                num(bound) + " ms" if bound else "",
                percent(bound / mine) if bound and mine else "",
            )
    for questions in BATCHES:
        row = batch_row(ours, questions)
        bound, _, _ = bound_ms(row, ceilings)
        mine = row and row["tokens_per_s"]
        ceiling_rate = row["tokens"] / (bound / 1e3) if row and bound else None
        line(
            f"{questions} × ~300 ids, prompt tokens/s",
            mine,
            peer_rate(torch, questions),
            peer_rate(fla, questions),
            rate_faster,
            num(ceiling_rate, 0) + " tok/s" if ceiling_rate else "",
            percent(mine / ceiling_rate) if ceiling_rate and mine else "",
        )
    return "\n".join(lines)


def details(ours, http, ceilings) -> str:
    """Every instinct row: runs, median, p10, p90, tokens, FLOPs, weight bytes and both bounds."""
    lines = [
        "| instinct row | runs | median ms | p10 ms | p90 ms | tokens | tokens/s | GFLOP | weight GB "
        "| bandwidth-bound ms | FLOP-bound ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, report, key in (("forward", ours, "latency"), ("forward", ours, "batch"), ("HTTP", http, "latency")):
        for row in (report or {}).get(key, []):
            if "error" in row:
                continue
            _, bandwidth, flops = bound_ms(row, ceilings)
            cells = [
                f"{label} {row['name']}",
                str(row["runs"]),
                num(row["median_ms"]),
                num(row["p10_ms"]),
                num(row["p90_ms"]),
                f"{row['tokens']:,}",
                num(row["tokens_per_s"], 0),
                num(row["flops"]["total"] / 1e9, 1),
                num(row["weight_bytes"] / 1e9, 3),
                num(bandwidth) if bandwidth is not None else "",
                num(flops) if flops is not None else "",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def notes(ours, http, torch, fla, ceilings) -> list[str]:
    out = []
    if ceilings:
        out.append(
            f"Ceilings measured in the peer run: device copy {ceilings['copy_GBps']:,.0f} GB/s (read + write), "
            f"bf16 GEMM {ceilings['gemm_TFLOPs']:,.0f} TFLOP/s."
        )
    digests = {
        "instinct": ((ours or {}).get("prompts") or {}).get("sha256"),
        "eager": (torch or {}).get("prompt_ids_sha256"),
        "FLA": (fla or {}).get("prompt_ids_sha256"),
    }
    known = {k: v for k, v in digests.items() if v}
    if len(set(known.values())) == 1 and len(known) == 3:
        out.append(f"Same prompt ids in all three runs (SHA-256 `{next(iter(known.values()))[:16]}…`).")
    elif known:
        shown = ", ".join(f"{k} `{v[:16]}…`" for k, v in known.items())
        missing = [k for k in digests if k not in known]
        out.append(
            f"Prompt-id digests: {shown}"
            + (f"; not recorded by {', '.join(missing)}" if missing else "")
            + ("" if len(set(known.values())) == 1 else " — **they differ**")
            + "."
        )
    forward = rows_by_name(ours, "latency")
    if "synthetic" in ((ours or {}).get("prompts") or {}):
        forward = {}  # other ids than the peers': answers are not comparable
    for peer_name, peer in (("eager", torch), ("FLA", fla)):
        diffs = {}
        for name in LATENCY:
            mine = (forward.get(name) or {}).get("probs_26")
            theirs = ((peer or {}).get("latency") or {}).get(name, {}).get("probs_26")
            if mine and theirs and len(mine) == len(theirs):
                diffs[name] = max(abs(a - b) for a, b in zip(mine, theirs))
        if diffs:
            shown = ", ".join(f"{int(k):,} ids {v:.4f}" for k, v in diffs.items())
            out.append(f"Answers, max |p_instinct − p_{peer_name}| over the 26 letters: {shown}.")
    if http:
        inexact = [r["name"] for r in http.get("latency", []) if not r.get("exact_tokens", True)]
        out.append(
            "HTTP rows: one `cua-s1-native` question per request built from the same fixture's text, its "
            "accessibility tree cut or repeated to the row's exact token count (the ids differ from the forward "
            "rows'; the count is checked against the server's `usage.input_tokens`); single client, one kept-alive "
            "connection. Peer columns on HTTP rows are the peers' forward pass (they have no server)."
            + (f" Rows not at their exact count: {', '.join(inexact)}." if inexact else "")
        )
    for label, report in (("instinct", ours), ("instinct HTTP", http)):
        skipped = (report or {}).get("skipped") or []
        cut = [r["name"] for key in ("latency", "batch") for r in (report or {}).get(key, []) if r.get("cut_by_max_row_s")]
        errors = [f"{r['name']} ({r['error']})" for key in ("latency", "batch") for r in (report or {}).get(key, [])
                  if "error" in r]
        if skipped:
            out.append(f"{label}: rows skipped past the time budget: {', '.join(skipped)}.")
        if errors:
            out.append(f"{label}: rows that failed: {'; '.join(errors)}.")
        if cut:
            out.append(f"{label}: rows cut short by --max-row-s (fewer runs): {', '.join(cut)}.")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", nargs="?", type=Path, help="folder with the standard file names")
    parser.add_argument("--instinct", type=Path)
    parser.add_argument("--http", type=Path)
    parser.add_argument("--torch", type=Path)
    parser.add_argument("--fla", type=Path)
    parser.add_argument("--serve-log", type=Path)
    parser.add_argument("--out", type=Path, help="write the markdown here (default: stdout)")
    args = parser.parse_args()

    def pick(given, name):
        return given if given is not None else (args.dir / name if args.dir else None)

    ours = load(pick(args.instinct, "instinct.json"))
    http = load(pick(args.http, "instinct_http.json"))
    torch = load(pick(args.torch, "peer_torch.json"))
    fla = load(pick(args.fla, "peer_fla.json"))
    serve_log = pick(args.serve_log, "serve.log")
    if not any((ours, http, torch, fla)):
        parser.error("no report found")
    ceilings = ceilings_of(ours, torch, fla)

    parts = []
    meta = ours or http or {}
    if meta:
        parts.append(
            f"- Hardware: {meta.get('hardware')}. Revision: `{meta.get('revision')}`. "
            f"instinct device: `{meta.get('device')}`."
        )
    for label, peer in (("transformers eager", torch), ("transformers + FLA", fla)):
        if peer:
            versions = peer.get("versions") or {}
            shown = ", ".join(f"{k} {v}" for k, v in versions.items() if v)
            parts.append(f"- {label}: {peer.get('device')}; {shown}.")
    parts += ["", table(ours, http, torch, fla, serve_log), ""]
    parts += [f"- {note}" for note in notes(ours, http, torch, fla, ceilings)]
    parts += ["", "Every instinct row (raw runs in the JSON):", "", details(ours, http, ceilings), ""]
    text = "\n".join(parts)
    if args.out:
        args.out.write_text(text)
        print(f"wrote {args.out}")
    else:
        print(text)


if __name__ == "__main__":
    sys.exit(main())
