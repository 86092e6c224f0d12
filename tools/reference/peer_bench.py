"""Speed of transformers itself on the real-shape checkpoint: the peer our engine is compared with.

Run once per backend, each in its own process, because transformers binds the delta-rule kernels when its
Qwen3.5 module is imported:
  --backend torch  transformers' torch fallbacks for the delta rule and the conv (fla must not be importable)
  --backend fla    flash-linear-attention's Triton kernels for the delta rule (fla on PYTHONPATH); the conv
                   stays transformers' torch fallback unless the `causal_conv1d` package is importable
Both: bf16 weights, eager attention, the text adapter through PEFT unmerged (as upstream's reference runs it).

Measures: load and warm-up time separately; warm latency of one question at ~139, 712 and 15,446 ids (median
of >= 20 runs, CUDA events); prompt tokens/s for batches of 8, 32 and 128 questions of ~300 ids. transformers
has no varlen packing, so a batch is right-padded with an attention mask, and each row's last real position
is read from the hidden states. Ceilings: device-to-device copy bandwidth and an 8192^3 bf16 GEMM.
The prompts come from bench_prompts.py, which also writes them for `instinct bench --prompts`; the report's
`prompt_ids_sha256` is their digest.

    python3 peer_bench.py --model /tmp/real --backend torch --out peer_torch.json [--small]
"""

import argparse
import importlib.metadata
import importlib.util
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from bench_prompts import BATCH_SIZES, LATENCY_LENGTHS, batch_prompts, digest, latency_prompts
from real_common import (
    delta_rule_implementations,
    last_letter_logits,
    letter_probabilities,
    load_fixtures,
)
from tiny_common import LETTER_IDS

SIZES = {
    False: {
        "latency_lengths": LATENCY_LENGTHS[False],
        "latency_runs": 20,
        "batch_sizes": BATCH_SIZES[False],
        "batch_runs": 5,
        "copy_bytes": 4 << 30,
        "gemm": 8192,
    },
    True: {
        "latency_lengths": LATENCY_LENGTHS[True],
        "latency_runs": 3,
        "batch_sizes": BATCH_SIZES[True],
        "batch_runs": 2,
        "copy_bytes": 64 << 20,
        "gemm": 1024,
    },
}
WARMUP_RUNS = 2


class Clock:
    """Elapsed milliseconds of a callable: CUDA events on a GPU, perf_counter on a CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def time_ms(self, work) -> tuple[float, object]:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            result = work()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end), result
        began = time.perf_counter()
        result = work()
        return (time.perf_counter() - began) * 1e3, result


def describe_runs(times_ms: list[float]) -> dict:
    ordered = sorted(times_ms)
    return {
        "runs": len(ordered),
        "median_ms": round(statistics.median(ordered), 3),
        "min_ms": round(ordered[0], 3),
        "p90_ms": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 3),
        "max_ms": round(ordered[-1], 3),
    }


def ceilings(device: torch.device, sizes: dict, clock: Clock) -> dict:
    """What the hardware allows: copy bandwidth (read + write bytes) and a square bf16 GEMM rate."""
    source = torch.empty(sizes["copy_bytes"], dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    copies = [clock.time_ms(lambda: target.copy_(source))[0] for _ in range(6)][1:]
    del source, target
    n = sizes["gemm"]
    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    gemms = [clock.time_ms(lambda: a @ b)[0] for _ in range(6)][1:]
    return {
        "copy_bytes": sizes["copy_bytes"],
        "copy_GBps_read_plus_write": round(2 * sizes["copy_bytes"] / (min(copies) / 1e3) / 1e9, 1),
        "gemm_n": n,
        "gemm_bf16_TFLOPs": round(2 * n**3 / (min(gemms) / 1e3) / 1e12, 1),
    }


def check_backend(backend: str) -> dict:
    chosen = delta_rule_implementations()
    fla_used = chosen["torch_chunk_gated_delta_rule"].startswith("fla.")
    if backend == "torch" and (importlib.util.find_spec("fla") is not None or fla_used):
        raise RuntimeError(f"--backend torch but fla is importable: {chosen}")
    if backend == "fla" and not fla_used:
        raise RuntimeError(f"--backend fla but transformers did not pick fla: {chosen}")
    return chosen


def versions() -> dict:
    found = {"python": platform.python_version(), "torch": torch.__version__}
    for distribution in ("transformers", "peft", "triton", "fla-core", "flash-linear-attention", "causal-conv1d"):
        try:
            found[distribution] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            found[distribution] = None
    return found


def load_model(model_dir: Path, device: torch.device):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.bfloat16, attn_implementation="eager", device_map=device
    )
    return PeftModel.from_pretrained(base, model_dir / "adapter-text", is_trainable=False).eval()


def batch_inputs(bodies: list[list[int]], batch_size: int, device: torch.device):
    """Right-padded ids and mask for `batch_size` questions of ~300 ids, and each row's last real position."""
    prompts = batch_prompts(bodies, batch_size)
    width = max(len(p) for p in prompts)
    ids = torch.zeros(batch_size, width, dtype=torch.long)
    mask = torch.zeros(batch_size, width, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)] = torch.tensor(prompt)
        mask[row, : len(prompt)] = 1
    last = torch.tensor([len(p) - 1 for p in prompts])
    return ids.to(device), mask.to(device), last.to(device), sum(len(p) for p in prompts)


@torch.no_grad()
def batch_letter_probabilities(model, ids, mask, last) -> torch.Tensor:
    """One padded forward; the letter probabilities at each row's last real position."""
    causal_lm = model.get_base_model()
    hidden = causal_lm.model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
    final = hidden[torch.arange(ids.shape[0], device=ids.device), last]
    logits = causal_lm.lm_head(final)[:, LETTER_IDS]
    return torch.softmax(logits.float(), dim=-1)


def padding_check(model, ids, mask, last, device) -> float:
    """Right padding must not change a row's answer: each row of the batch against the row alone."""
    batched = batch_letter_probabilities(model, ids, mask, last).cpu()
    alone = [
        letter_probabilities(last_letter_logits(model, ids[row, : int(last[row]) + 1].tolist(), device), 26)
        for row in range(ids.shape[0])
    ]
    return float((batched - torch.stack(alone)).abs().max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--backend", choices=["torch", "fla"], required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--small", action="store_true", help="short prompts, small batches, CPU")
    parser.add_argument("--budget-s", type=float, default=240, help="cut later runs to 5 past this")
    args = parser.parse_args()

    started = time.time()
    sizes = SIZES[args.small]
    device = torch.device("cuda" if torch.cuda.is_available() and not args.small else "cpu")
    clock = Clock(device)
    report = {
        "backend": args.backend,
        "small": args.small,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "versions": versions(),
        "implementations": check_backend(args.backend),
        "settings": "bf16 weights, eager attention, PEFT text adapter unmerged, logits_to_keep=1 for one question",
    }

    def save() -> None:
        report["seconds_total"] = round(time.time() - started, 1)
        args.out.write_text(json.dumps(report, indent=1) + "\n")

    report["ceilings"] = ceilings(device, sizes, clock)
    save()

    began = time.time()
    model = load_model(args.model, device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    report["load_seconds"] = round(time.time() - began, 2)
    print(f"[peer_bench {args.backend}] load {report['load_seconds']} s", flush=True)

    bodies = [fixture["input_ids"] for fixture in load_fixtures()["fixtures"]]
    singles = latency_prompts(bodies, sizes["latency_lengths"])
    report["prompt_ids_sha256"] = digest(
        [(str(length), ids) for length, ids in zip(sizes["latency_lengths"], singles)],
        [(f"{size}x300", batch_prompts(bodies, size)) for size in sizes["batch_sizes"]],
    )
    report["warmup_ms"], report["latency"], report["batch"] = {}, {}, {}
    for length, ids in zip(sizes["latency_lengths"], singles):
        warmups = [clock.time_ms(lambda: last_letter_logits(model, ids, device))[0] for _ in range(WARMUP_RUNS)]
        report["warmup_ms"][f"single_{length}"] = [round(t, 1) for t in warmups]
        runs = sizes["latency_runs"] if time.time() - started < args.budget_s else 5
        times, letter_logits = [], None
        for _ in range(runs):
            elapsed, letter_logits = clock.time_ms(lambda: last_letter_logits(model, ids, device))
            times.append(elapsed)
        report["latency"][str(length)] = dict(
            describe_runs(times), ids=length, probs_26=letter_probabilities(letter_logits, 26).tolist()
        )
        print(f"[peer_bench {args.backend}] {length} ids: {report['latency'][str(length)]['median_ms']} ms", flush=True)
        save()

    for batch_size in sizes["batch_sizes"]:
        ids, mask, last, real_tokens = batch_inputs(bodies, batch_size, device)
        first, _ = clock.time_ms(lambda: batch_letter_probabilities(model, ids, mask, last))
        report["warmup_ms"][f"batch_{batch_size}"] = round(first, 1)
        runs = sizes["batch_runs"] if time.time() - started < args.budget_s else 2
        times = [clock.time_ms(lambda: batch_letter_probabilities(model, ids, mask, last))[0] for _ in range(runs)]
        summary = describe_runs(times)
        if batch_size == sizes["batch_sizes"][0]:
            report["padding_check_max_abs_diff"] = padding_check(model, ids, mask, last, device)
        report["batch"][str(batch_size)] = dict(
            summary,
            questions=batch_size,
            real_tokens=real_tokens,
            padded_tokens=int(ids.numel()),
            prompt_tokens_per_s=round(real_tokens / (summary["median_ms"] / 1e3), 1),
            questions_per_s=round(batch_size / (summary["median_ms"] / 1e3), 2),
        )
        rate = report["batch"][str(batch_size)]["prompt_tokens_per_s"]
        print(f"[peer_bench {args.backend}] batch {batch_size}: {rate} tok/s", flush=True)
        save()

    if device.type == "cuda":
        report["peak_gpu_bytes"] = torch.cuda.max_memory_allocated()
    save()
    print(json.dumps({k: report[k] for k in ("backend", "load_seconds", "latency", "batch", "ceilings")}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
