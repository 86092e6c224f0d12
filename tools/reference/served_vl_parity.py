#!/usr/bin/env python3
"""Screenshot answers of a running `instinct serve` against real_vl_goldens.py's references (DESIGN.md's rule),
and the end-to-end latency of screenshot requests.

    served_vl_parity.py --goldens DIR/real_vl_goldens.json --url http://127.0.0.1:8000 --out vl_parity.json

The server must serve the same checkpoint with its multimodal adapter (`instinct serve --model REAL
--multimodal-adapter REAL/adapter-multimodal ...`). Standard library only.

Parity: each corpus image is posted once with all its questions (POST /v1/systemone, `state.image` a data URL of
the image file's own bytes), exactly the `questions` object the goldens were computed for. Per question:
max |p − p_fp32| over its options, the choice, the fp32 margin. The rule: max over the corpus ≤ 2 × (the bf16
reference's largest |p_bf16 − p_fp32|) + 0.01, and the fp32 choice kept wherever its margin is ≥ 0.05. The
request's `usage.input_tokens` must equal the sum of the goldens' prompt lengths (the prompts are the same).

Latency (after parity, so the server is warm): the goldens' latency images, 1024×1024 PNGs the server has not
seen. For each, one client on one kept-alive connection: the first request (an image-cache miss: decode,
preprocess, vision tower, language model), then the same image again twice (cache hits), with one question
(the 1024×1024 corpus request's first) or its four questions, alternating which comes first. Medians of the
client's wall time per request and of the server's `Server-Timing`; the image-cache hit and miss counters
from /metrics before and after.

Exit 0 on PASS, 1 on FAIL, 2 when the server could not be reached.
"""

import argparse
import base64
import http.client
import json
import statistics
import sys
import time
import urllib.parse
from pathlib import Path

MARGIN_FOR_CHOICE = 0.05


class Client:
    """One kept-alive HTTP/1.1 connection (re-opened if the server closes it)."""

    def __init__(self, url: str, timeout: float):
        parsed = urllib.parse.urlsplit(url)
        self.host, self.port, self.timeout = parsed.hostname, parsed.port or 80, timeout
        self.conn = None

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, dict, bytes, float]:
        headers = {"content-type": "application/json"} if body is not None else {}
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            started = time.perf_counter()
            try:
                self.conn.request(method, path, body=body, headers=headers)
                response = self.conn.getresponse()
                data = response.read()
            except (ConnectionError, http.client.HTTPException, OSError):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise
                continue
            ms = (time.perf_counter() - started) * 1e3
            if response.getheader("connection", "").lower() == "close":
                self.conn.close()
                self.conn = None
            return response.status, {k.lower(): v for k, v in response.getheaders()}, data, ms
        raise AssertionError("unreachable")


def wait_ready(client: Client, seconds: float) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            if client.request("GET", "/readyz")[0] == 200:
                return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


def screenshot_body(image_bytes: bytes, mime: str, questions: dict) -> bytes:
    url = f"data:{mime};base64," + base64.b64encode(image_bytes).decode("ascii")
    return json.dumps({"state": {"image": url}, "questions": questions}, ensure_ascii=False).encode("utf-8")


def server_timing(headers: dict) -> dict:
    """`Server-Timing: prepare;dur=1.2, queue;dur=…` as {name: ms}."""
    timing = {}
    for part in headers.get("server-timing", "").split(","):
        name, _, rest = part.strip().partition(";dur=")
        if rest:
            timing[name] = float(rest)
    return timing


def metric(client: Client, name: str) -> float | None:
    status, _, data, _ = client.request("GET", "/metrics")
    if status != 200:
        return None
    total = 0.0  # a counter not yet incremented has no line
    for line in data.decode("utf-8", "replace").splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def first_argmax(p: list[float]) -> int:
    return max(range(len(p)), key=lambda i: (p[i], -i))


def check_parity(client: Client, goldens: dict, base: Path) -> dict:
    images = {image["name"]: image for image in goldens["images"]}
    gold = {q["prompt"]: q for q in goldens["questions"]}
    bf16_error = max(q["max_abs_diff"] for q in goldens["questions"])
    allowance = 2 * bf16_error + 0.01
    rows, failures, requests = [], [], []
    for request in goldens["requests"]:
        image = images[request["image"]]
        data = (base / image["file"]).read_bytes()
        body = screenshot_body(data, image["mime"], request["questions"])
        status, headers, raw, ms = client.request("POST", "/v1/systemone", body)
        want_tokens = sum(gold[f"{request['image']}/{q}"]["ids_length"] for q in request["questions"])
        entry = {"image": request["image"], "status": status, "ms": round(ms, 2),
                 "questions": len(request["questions"]), "server_timing_ms": server_timing(headers),
                 "input_tokens_expected": want_tokens}
        requests.append(entry)
        if status != 200:
            entry["error"] = raw.decode("utf-8", "replace")[:2000]
            failures.append(f"{request['image']}: HTTP {status}")
            print(f"[vl_parity] {request['image']}: HTTP {status}: {entry['error'][:300]}", flush=True)
            continue
        answer = json.loads(raw)
        entry["input_tokens"] = answer["usage"]["input_tokens"]
        if entry["input_tokens"] != want_tokens:
            failures.append(
                f"{request['image']}: {entry['input_tokens']} input tokens, the goldens' prompts have {want_tokens}"
            )
        first_row = len(rows)
        for qname, question in request["questions"].items():
            g = gold[f"{request['image']}/{qname}"]
            probabilities = answer["answers"][qname]["probabilities"]
            keys = list(question["criteria"])
            if list(probabilities) != keys:
                failures.append(f"{g['prompt']}: option keys {list(probabilities)} != {keys}")
                continue
            p = [float(probabilities[k]) for k in keys]
            diff = max(abs(a - b) for a, b in zip(p, g["p_fp32"]))
            choice = first_argmax(p)
            rows.append({
                "prompt": g["prompt"], "kind": image["kind"], "ids": g["ids_length"],
                "image_tokens": g["image_tokens"], "n_options": g["n_options"],
                "max_abs_diff": diff, "bf16_max_abs_diff": g["max_abs_diff"],
                "choice": choice, "choice_fp32": g["argmax_fp32"], "margin_fp32": g["margin_fp32"],
                "choice_checked": g["n_options"] > 1 and g["margin_fp32"] >= MARGIN_FOR_CHOICE,
                "p": p, "p_fp32": g["p_fp32"],
            })
        worst_here = max((r["max_abs_diff"] for r in rows[first_row:]), default=float("nan"))
        print(f"[vl_parity] {request['image']}: {len(request['questions'])} questions, {entry['input_tokens']} "
              f"tokens, {ms:.1f} ms, worst |dp| {worst_here:.2e}", flush=True)
    worst = max((r["max_abs_diff"] for r in rows), default=float("nan"))
    checked = [r for r in rows if r["choice_checked"]]
    kept = sum(r["choice"] == r["choice_fp32"] for r in checked)
    by_kind = {}
    for r in rows:
        by_kind[r["kind"]] = max(by_kind.get(r["kind"], 0.0), r["max_abs_diff"])
    passed = (not failures and len(rows) == len(goldens["questions"]) and worst <= allowance
              and kept == len(checked))
    return {
        "questions": len(rows),
        "questions_in_goldens": len(goldens["questions"]),
        "max_abs_diff": worst,
        "bf16_reference_max_abs_diff": bf16_error,
        "allowance": allowance,
        "choices_checked_margin_ge_0.05": len(checked),
        "choices_kept": kept,
        "choice_changed": [r["prompt"] for r in checked if r["choice"] != r["choice_fp32"]],
        "max_abs_diff_by_kind": by_kind,
        "failures": failures,
        "passed": passed,
        "requests": requests,
        "rows": rows,
    }


def summarize(values: list[float]) -> dict:
    ordered = sorted(values)
    return {"runs": len(ordered), "median_ms": round(statistics.median(ordered), 2),
            "min_ms": round(ordered[0], 2), "max_ms": round(ordered[-1], 2)}


def measure_latency(client: Client, goldens: dict, base: Path, repeats: int) -> dict:
    request = next(r for r in goldens["requests"] if r["image"] == "rgb_1024x1024")
    four = request["questions"]
    first = next(iter(four))
    one = {first: four[first]}
    samples = {"miss_1q": [], "miss_4q": [], "hit_1q": [], "hit_4q": []}
    server = {key: [] for key in samples}
    errors = []
    hits_before = metric(client, "instinct_image_cache_hits_total")
    misses_before = metric(client, "instinct_image_cache_misses_total")
    stages = ("preprocess", "encode")
    stage_sums = {st: [metric(client, f"instinct_image_{st}_seconds_{x}") for x in ("sum", "count")] for st in stages}
    for k, image in enumerate(goldens["latency_images"]):
        data = (base / image["file"]).read_bytes()
        order = [("1q", one), ("4q", four)] if k % 2 == 0 else [("4q", four), ("1q", one)]
        plan = [("miss_" + order[0][0], order[0][1])]
        plan += [("hit_" + label, questions) for label, questions in order for _ in range(repeats)]
        for key, questions in plan:
            body = screenshot_body(data, image["mime"], questions)
            status, headers, raw, ms = client.request("POST", "/v1/systemone", body)
            if status != 200:
                errors.append(f"{image['file']} {key}: HTTP {status} {raw[:200]!r}")
                continue
            samples[key].append(ms)
            server[key].append(server_timing(headers))
    hits_after = metric(client, "instinct_image_cache_hits_total")
    misses_after = metric(client, "instinct_image_cache_misses_total")
    # The server's own split of a miss (histograms it records per encoded image): mean ms.
    image_stages = {}
    for st in stages:
        after = [metric(client, f"instinct_image_{st}_seconds_{x}") for x in ("sum", "count")]
        before = stage_sums[st]
        if None not in after and None not in before and after[1] > before[1]:
            image_stages[f"{st}_ms_mean"] = round(1e3 * (after[0] - before[0]) / (after[1] - before[1]), 3)
    result = {
        "image": "1024x1024 PNG (1,024 image tokens), a different image each round: "
        + ", ".join(f"{i['file']} ({i['bytes']} B)" for i in goldens["latency_images"]),
        "one_question": f"{first} ({len(four[first]['criteria'])} options)",
        "four_questions": list(four),
        "body_bytes_4q": len(screenshot_body((base / goldens["latency_images"][0]["file"]).read_bytes(), "image/png",
                                             four)),
        "errors": errors,
        "miss_stages": image_stages,
        "image_cache": {
            "hits": None if hits_after is None or hits_before is None else hits_after - hits_before,
            "misses": None if misses_after is None or misses_before is None else misses_after - misses_before,
            "expected_misses": len(goldens["latency_images"]),
        },
    }
    for key, values in samples.items():
        if not values:
            continue
        entry = summarize(values)
        names = sorted({name for timing in server[key] for name in timing})
        entry["server_timing_median_ms"] = {
            name: round(statistics.median(t[name] for t in server[key] if name in t), 3) for name in names
        }
        entry["runs_ms"] = [round(v, 2) for v in values]
        result[key] = entry
    if "hit_1q" in result and "hit_4q" in result:
        result["ratio_4q_over_1q_hit"] = round(result["hit_4q"]["median_ms"] / result["hit_1q"]["median_ms"], 3)
    if "miss_1q" in result and "miss_4q" in result:
        result["ratio_4q_over_1q_miss"] = round(result["miss_4q"]["median_ms"] / result["miss_1q"]["median_ms"], 3)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--goldens", type=Path, required=True, help="real_vl_goldens.py's real_vl_goldens.json")
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--out", type=Path, help="the report (JSON)")
    parser.add_argument("--wait-ready-s", type=float, default=300)
    parser.add_argument("--timeout-s", type=float, default=120, help="per request")
    parser.add_argument("--hit-repeats", type=int, default=2, help="cache-hit requests per latency image and shape")
    parser.add_argument("--no-latency", action="store_true")
    parser.add_argument("--label", default="", help="what served it (device, revision), recorded in the report")
    args = parser.parse_args()

    goldens = json.loads(args.goldens.read_text(encoding="utf-8"))
    base = args.goldens.resolve().parent
    client = Client(args.url, args.timeout_s)
    started = time.time()
    if not wait_ready(client, args.wait_ready_s):
        print(f"[vl_parity] {args.url} not ready within {args.wait_ready_s} s", file=sys.stderr)
        return 2
    ready_s = time.time() - started
    # Every request below is a screenshot question: the captured passes counted over them are the
    # multimodal language copy's (0 replays where it runs as launched).
    graph_counters = ("instinct_graph_replays_total", "instinct_graph_captures_total", "instinct_graph_misses_total")
    try:
        graphs_before = {name: metric(client, name) for name in graph_counters}
        parity = check_parity(client, goldens, base)
        latency = None if args.no_latency else measure_latency(client, goldens, base, args.hit_repeats)
        graphs_after = {name: metric(client, name) for name in graph_counters}
        graphs = {name.removeprefix("instinct_graph_").removesuffix("_total"): graphs_after[name] - before
                  for name, before in graphs_before.items()
                  if before is not None and graphs_after[name] is not None}
    except OSError as error:  # the server went away
        print(f"[vl_parity] {args.url}: {error!r}", file=sys.stderr)
        return 2
    report = {
        "description": "instinct serve's screenshot answers against transformers' fp32/bf16 references "
        "(real_vl_goldens.py), DESIGN.md's rule, and end-to-end screenshot latency",
        "label": args.label,
        "url": args.url,
        "goldens": str(args.goldens),
        "goldens_device": goldens.get("device"),
        "goldens_small": goldens.get("small"),
        "waited_for_ready_s": round(ready_s, 1),
        "rule": "max |p - p_fp32| <= 2 x max |p_bf16 - p_fp32| + 0.01, and the fp32 choice kept where its "
        "margin >= 0.05",
        "summary": {k: v for k, v in parity.items() if k not in ("rows", "requests")},
        "latency": latency,
        "captured_passes_during_run": graphs,
        "parity_requests": parity["requests"],
        "rows": parity["rows"],
    }
    if args.out:
        args.out.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(
        f"[vl_parity] {parity['questions']}/{parity['questions_in_goldens']} screenshot questions: max |p - p_fp32| = "
        f"{parity['max_abs_diff']:.5f} (allowance {parity['allowance']:.5f} = 2 x "
        f"{parity['bf16_reference_max_abs_diff']:.5f} + 0.01); choice kept on {parity['choices_kept']}/"
        f"{parity['choices_checked_margin_ge_0.05']} with margin >= 0.05;"
        f" by kind {json.dumps({k: float(f'{v:.3g}') for k, v in parity['max_abs_diff_by_kind'].items()})}: "
        f"{'PASS' if parity['passed'] else 'FAIL'}"
    )
    for failure in parity["failures"]:
        print(f"[vl_parity]   {failure}")
    if latency:
        shown = {k: latency[k]["median_ms"] for k in ("miss_1q", "hit_1q", "miss_4q", "hit_4q") if k in latency}
        print(f"[vl_parity] latency medians (ms) on 1024x1024 PNGs: {json.dumps(shown)}; 4q/1q hit "
              f"{latency.get('ratio_4q_over_1q_hit')}, miss {latency.get('ratio_4q_over_1q_miss')}; "
              f"image cache {json.dumps(latency['image_cache'])}; a miss's stages {json.dumps(latency['miss_stages'])}; "
              f"errors {len(latency['errors'])}")
    print(f"[vl_parity] captured passes over the screenshot questions: {json.dumps(graphs)}")
    return 0 if parity["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
