"""fp32 and bf16 transformers references on the real-shape checkpoint, over a fixed corpus of questions.

Corpus: every real Cua-S1 fixture prompt (`input_ids`, 17 or 18 options), the same prompts read with 2 and 26
options, and prompts cut or repeated to 139, 712, ~4k, ~8k and 15,446 ids (1, 2, 17, 26 options), each
ending with the fixture's `<|im_start|>assistant\\n<think>\\n` ids. For each question: the fp32 reference
(fp32 weights, TF32 off, eager attention, transformers' torch delta rule and conv; fla must not be
importable) and the bf16 reference (bf16 weights as upstream runs them; bf16 logits, fp32 softmax), both
with the text adapter through PEFT, unmerged. Only the last position's logits are computed.

    python3 real_goldens.py --model /tmp/real --out goldens.json [--small]
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from real_common import (
    delta_rule_implementations,
    last_letter_logits,
    letter_probabilities,
    load_fixtures,
    prompt_of_length,
    release_gpu,
    require_torch_fallbacks,
    top_two_margin,
    with_adapter,
)

require_torch_fallbacks()  # before anything imports transformers
from tiny_common import reference_versions, use_strict_fp32  # noqa: E402

# (name, fixture index the body comes from, length, option counts). --small shortens the long ones.
LENGTH_PROMPTS = [
    ("short_139", 0, 139, [1, 2]),
    ("toolbar_712", 1, 712, [26]),
    ("long_4000", 2, 4000, [2, 17]),
    ("long_8000", 3, 8000, [26]),
    ("long_15446", 4, 15446, [17, 26]),
]
SMALL_LENGTHS = {"long_4000": 1000, "long_8000": 1500, "long_15446": 2000}
# Fixtures also read with these option counts (the readout takes the first n letters of one pass).
EXTRA_OPTION_COUNTS = {2: range(0, 8), 26: range(8, 16)}
SMALL_FIXTURES = 4
MARGIN_FOR_ARGMAX_CHECK = 0.05


def build_corpus(fixtures: dict, small: bool) -> tuple[dict[str, list[int]], list[tuple[str, int]]]:
    """Unique prompts by name, and the questions: (prompt name, number of options)."""
    items = fixtures["fixtures"][:SMALL_FIXTURES] if small else fixtures["fixtures"]
    prompts, questions = {}, []
    for index, fixture in enumerate(items):
        name = f"fixture_{fixture['id']}"
        prompts[name] = fixture["input_ids"]
        questions.append((name, len(fixture["options"])))
        for n_options, indices in EXTRA_OPTION_COUNTS.items():
            if index in indices:
                questions.append((name, n_options))
    for name, source, length, option_counts in LENGTH_PROMPTS:
        length = SMALL_LENGTHS.get(name, length) if small else length
        prompts[name] = prompt_of_length(fixtures["fixtures"][source]["input_ids"], length)
        questions += [(name, n) for n in option_counts]
    return prompts, questions


def load_reference(model_dir: Path, dtype: torch.dtype, device: torch.device):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="eager", device_map=device)
    if type(base).__name__ != "Qwen3_5ForCausalLM" or base.config._attn_implementation != "eager":
        raise RuntimeError(f"unexpected model {type(base).__name__} / {base.config._attn_implementation}")
    model, _, lora_dtype = with_adapter(base, model_dir / "adapter-text", dtype)
    return model, lora_dtype


def run_pass(model_dir: Path, dtype: torch.dtype, device: torch.device, prompts: dict) -> dict:
    started = time.time()
    model, lora_dtype = load_reference(model_dir, dtype, device)
    load_seconds = time.time() - started
    letter_logits, seconds = {}, {}
    for name, ids in prompts.items():
        began = time.time()
        letter_logits[name] = last_letter_logits(model, ids, device)
        seconds[name] = round(time.time() - began, 3)
        print(f"[real_goldens] {dtype} {name} ({len(ids)} ids): {seconds[name]} s", flush=True)
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else None
    del model
    release_gpu(device)
    return {
        "letter_logits": letter_logits,
        "load_seconds": round(load_seconds, 2),
        "forward_seconds": seconds,
        "lora_dtype": lora_dtype,
        "peak_gpu_bytes": peak,
    }


def tokenizer_counts(model_dir: Path, fixtures: dict) -> dict:
    """The fixture chat strings' token counts with the snapshot's tokenizer.json, and whether ids match."""
    path = model_dir / "tokenizer.json"
    counts = {fixture["id"]: len(fixture["input_ids"]) for fixture in fixtures["fixtures"]}
    result = {"fixture_input_ids_lengths": counts}
    if not path.exists() or path.stat().st_size == 0:
        result["tokenizer"] = "absent"
        return result
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path))
    encoded = {f["id"]: tokenizer.encode(f["chat"], add_special_tokens=False).ids for f in fixtures["fixtures"]}
    result["chat_token_counts"] = {key: len(ids) for key, ids in encoded.items()}
    result["ids_equal_fixture"] = sum(encoded[f["id"]] == f["input_ids"] for f in fixtures["fixtures"])
    result["fixtures"] = len(fixtures["fixtures"])
    return result


def quantiles(values: list[float]) -> dict:
    ordered = torch.tensor(sorted(values), dtype=torch.float64)
    points = {"min": 0.0, "p10": 0.1, "p25": 0.25, "median": 0.5, "p75": 0.75, "p90": 0.9, "max": 1.0}
    return {key: round(float(torch.quantile(ordered, q)), 4) for key, q in points.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--small", action="store_true", help="4 fixtures and long prompts of 1-2k ids, CPU")
    args = parser.parse_args()

    started = time.time()
    use_strict_fp32()
    torch.manual_seed(0)
    implementations = delta_rule_implementations()
    if any(not value.startswith("transformers.") for value in implementations.values()):
        raise RuntimeError(f"not the torch fallbacks: {implementations}")
    device = torch.device("cuda" if torch.cuda.is_available() and not args.small else "cpu")
    fixtures = load_fixtures()
    prompts, questions = build_corpus(fixtures, args.small)

    passes = {}
    for label, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        passes[label] = run_pass(args.model, dtype, device, prompts)

    records, differences, margins, argmax_checked, argmax_mismatches = [], [], [], 0, []
    for name, n_options in questions:
        p32 = letter_probabilities(passes["fp32"]["letter_logits"][name], n_options)
        p16 = letter_probabilities(passes["bf16"]["letter_logits"][name], n_options)
        difference = float((p16 - p32).abs().max())
        margin = top_two_margin(p32) if n_options > 1 else 1.0
        differences.append(difference)
        if n_options > 1:
            margins.append(margin)
        if n_options > 1 and margin >= MARGIN_FOR_ARGMAX_CHECK:
            argmax_checked += 1
            if int(p16.argmax()) != int(p32.argmax()):
                argmax_mismatches.append(f"{name}/n{n_options}")
        records.append({
            "prompt": name,
            "ids_length": len(prompts[name]),
            "n_options": n_options,
            "p_fp32": p32.tolist(),
            "p_bf16": p16.tolist(),
            "margin_fp32": margin,
            "argmax_fp32": int(p32.argmax()),
            "argmax_bf16": int(p16.argmax()),
            "max_abs_diff": difference,
        })

    max_difference = max(differences)
    report = {
        "description": "real-shape checkpoint: fp32 and bf16 transformers references with the text adapter",
        "model": str(args.model),
        "small": args.small,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "versions": reference_versions(),
        "settings": {
            "fp32": "fp32 weights (A_log and gated-norm weight at full F32), TF32 off, eager attention",
            "bf16": "bf16 weights (from_pretrained dtype=bf16 rounds the F32 tensors), eager attention",
            "adapter": "PEFT LoRA unmerged, adapter dtype " + passes["bf16"]["lora_dtype"] + " in the bf16 pass",
            "readout": "logits_to_keep=1; letter logits in the model dtype; fp32 softmax over the first n",
            "delta_rule_and_conv": implementations,
            "fixtures": fixtures["path"],
        },
        "summary": {
            "questions": len(records),
            "prompts": len(prompts),
            "max_abs_diff_bf16_vs_fp32": max_difference,
            "allowance_for_ours": 2 * max_difference + 0.01,
            "margin_fp32_quantiles": quantiles(margins),
            "margin_fp32_histogram_0.1": [sum(min(int(m * 10), 9) == b for m in margins) for b in range(10)],
            "questions_with_margin_ge_0.05": argmax_checked,
            "bf16_argmax_mismatches_where_margin_ge_0.05": argmax_mismatches,
            "option_counts": sorted({n for _, n in questions}),
            "ids_lengths": sorted({len(ids) for ids in prompts.values()}),
        },
        "timing": {
            label: {k: v for k, v in result.items() if k in ("load_seconds", "forward_seconds", "peak_gpu_bytes")}
            for label, result in passes.items()
        },
        "tokenizer": tokenizer_counts(args.model, fixtures),
        "questions": records,
        "seconds": round(time.time() - started, 1),
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: report[k] for k in ("summary", "settings", "seconds")}, indent=1))
    tokenizer = report["tokenizer"]
    if "ids_equal_fixture" in tokenizer:
        matched = f"{tokenizer['ids_equal_fixture']}/{tokenizer['fixtures']}"
        print(f"[real_goldens] tokenizer.json reproduces {matched} fixture ids")


if __name__ == "__main__":
    sys.exit(main())
