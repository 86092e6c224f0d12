"""The benchmark's prompts, shared by `peer_bench.py` (transformers) and `instinct bench` (--prompts FILE).

Both runs take their token ids from the functions here, so they measure the same ids by construction:
  latency: one question per length (139, 712 and 15,446 ids; --small: 139, 712, 2,000); the i-th length is
           fixture i's prompt cut or repeated to that length (`real_common.prompt_of_length`)
  batches: 8, 32 and 128 questions (--small: 2, 4, 8), each a random fixture cut to a random length in
           [280, 320], from random.Random(7 + batch size)

The file also carries, per latency row, the fixture's text fields (app, task family, goal, accessibility tree,
options) so that `instinct bench --http` can build a `cua-s1-native` request of the same length: a request's
ids cannot be chosen freely (the system prompt and template are fixed), so over HTTP the length is matched,
not the ids.

`sha256` is the digest of the ids (see `digest`); `instinct bench` recomputes it, `peer_bench.py` records it.

    python3 bench_prompts.py --out prompts.json [--small]
"""

import argparse
import hashlib
import json
import random
import sys
from pathlib import Path

FORMAT = "instinct-bench-prompts/1"
LATENCY_LENGTHS = {False: [139, 712, 15446], True: [139, 712, 2000]}
BATCH_SIZES = {False: [8, 32, 128], True: [2, 4, 8]}
BATCH_LENGTH_RANGE = (280, 320)  # "about 300 ids" per question, varied as real prompts are
BATCH_SEED = 7
TEXT_FIELDS = ("app", "family", "goal", "ax_tree", "options")


def latency_prompts(bodies: list[list[int]], lengths: list[int]) -> list[list[int]]:
    """The i-th length from the i-th fixture."""
    from real_common import prompt_of_length

    return [prompt_of_length(bodies[index], length) for index, length in enumerate(lengths)]


def batch_prompts(bodies: list[list[int]], batch_size: int) -> list[list[int]]:
    """`batch_size` questions of ~300 ids: random fixtures cut to random lengths, seeded by the batch size."""
    from real_common import prompt_of_length

    rng = random.Random(BATCH_SEED + batch_size)
    return [prompt_of_length(rng.choice(bodies), rng.randint(*BATCH_LENGTH_RANGE)) for _ in range(batch_size)]


def digest(latency: list[tuple[str, list[int]]], batches: list[tuple[str, list[list[int]]]]) -> str:
    """SHA-256 of lines `latency NAME id,id,...` then `batch NAME id,...;id,...` (one per row, '\\n'-ended)."""
    lines = [f"latency {name} {','.join(map(str, ids))}\n" for name, ids in latency]
    for name, prompts in batches:
        lines.append(f"batch {name} {';'.join(','.join(map(str, ids)) for ids in prompts)}\n")
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def text_source(fixture: dict) -> dict:
    """The fixture's request fields, in `cua-s1-native` terms."""
    return {
        "source": fixture["id"],
        "app": fixture["app"],
        "task_family": fixture["family"],
        "goal": fixture["goal"] or "",
        "accessibility_tree": fixture["ax_tree"],
        "options": [
            {"role": o["role"], "label": o["label"], "action": o["action"], "entity_id": o.get("entity_id")}
            for o in fixture["options"]
        ],
    }


def build(fixtures: dict, small: bool) -> dict:
    """The whole prompts document for `instinct bench --prompts`."""
    entries = fixtures["fixtures"]
    bodies = [fixture["input_ids"] for fixture in entries]
    lengths = LATENCY_LENGTHS[small]
    latency = [
        {"name": str(length), "source": entries[index]["id"], "ids": ids, "text": text_source(entries[index])}
        for index, (length, ids) in enumerate(zip(lengths, latency_prompts(bodies, lengths)))
    ]
    batches = []
    for size in BATCH_SIZES[small]:
        prompts = batch_prompts(bodies, size)
        batches.append({"name": f"{size}x300", "questions": size, "prompts": prompts})
    return {
        "format": FORMAT,
        "generator": "tools/reference/bench_prompts.py",
        "small": small,
        "fixtures": fixtures.get("path"),
        "fixtures_run": fixtures.get("run"),
        "batch_length_range": list(BATCH_LENGTH_RANGE),
        "batch_seed": BATCH_SEED,
        "sha256": digest(
            [(row["name"], row["ids"]) for row in latency], [(b["name"], b["prompts"]) for b in batches]
        ),
        "latency": latency,
        "batches": batches,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--small", action="store_true", help="the lengths and batches of peer_bench.py --small")
    args = parser.parse_args()
    from real_common import load_fixtures

    document = build(load_fixtures(), args.small)
    args.out.write_text(json.dumps(document) + "\n")
    tokens = [len(row["ids"]) for row in document["latency"]]
    batch_tokens = {b["name"]: sum(map(len, b["prompts"])) for b in document["batches"]}
    print(f"[bench_prompts] {args.out}: latency {tokens}, batches {batch_tokens}, sha256 {document['sha256']}")


if __name__ == "__main__":
    sys.exit(main())
