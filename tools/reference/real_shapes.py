"""Writes a random checkpoint with the exact Qwen3.5-4B shapes, plus a random Cua-S1-shaped text adapter.

Weights are made directly on the GPU in bf16 (on the CPU with --small, which uses make_tiny's sizes with the
real vocabulary). Value rules, the letter-row scaling and the adapter are make_tiny.py's and
tiny_adapters.py's. `tokenizer.json` is not written here: gpu_run.sh builds it with `instinct build-tokenizer`
(or pass --tokenizer-json to copy one).

    python3 real_shapes.py --out /tmp/real [--small] [--tokenizer-json FILE]
"""

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path

import torch

from real_common import (
    FIRST_SPECIAL_ID,
    REAL_SPECIAL_IDS,
    REPO_ROOT,
    last_letter_logits,
    letter_probabilities,
    load_fixtures,
    real_config,
    top_two_margin,
)

import make_tiny  # noqa: E402  (after real_common: it installs the tokenizer-package placeholders)
import tiny_adapters  # noqa: E402
from safetensors import safe_open  # noqa: E402
from tiny_common import NUM_RANKS  # noqa: E402
from transformers import Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration  # noqa: E402

WEIGHT_SEED = make_tiny.WEIGHT_SEED
# Hidden 2560 makes random letter logits ~sqrt(2560) wide; the right scale is far below make_tiny's 0.1..1.
LETTER_SCALES = [0.005 * 200 ** (i / 16) for i in range(17)]  # 0.005 .. 1.0, geometric
SCALE_SEARCH_PROMPTS = {False: 8, True: 3}
TINY_ASSETS = REPO_ROOT / "model" / "assets" / "tiny"


class StepTimer:
    def __init__(self, device: torch.device):
        self.device = device
        self.seconds: dict[str, float] = {}

    def run(self, name: str, step, *args):
        started = time.time()
        result = step(*args)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.seconds[name] = round(time.time() - started, 2)
        print(f"[real_shapes] {name}: {self.seconds[name]} s", flush=True)
        return result


def build_model(config, device: torch.device) -> Qwen3_5ForConditionalGeneration:
    with torch.device(device):
        model = Qwen3_5ForConditionalGeneration._from_config(config, dtype=torch.bfloat16)
    return model.eval()


def fill_weights(model, device: torch.device) -> None:
    """make_tiny's per-kind random values, drawn on the model's device; A_log and the gated norm stay F32."""
    gen = torch.Generator(device=device).manual_seed(WEIGHT_SEED)
    with torch.no_grad(), torch.device(device):
        for name, param in sorted(model.named_parameters()):
            value = make_tiny.random_value(name, param.shape, gen)
            if make_tiny.is_f32_on_disk(name):
                param.data = value.to(torch.float32)  # save_pretrained keeps a parameter's own dtype
            else:
                param.copy_(value)  # rounds to bf16 to nearest even, as round_to_bf16 does


def scaling_prompts(fixtures: dict, small: bool) -> list[tuple[str, list[int]]]:
    chosen = fixtures["fixtures"][: SCALE_SEARCH_PROMPTS[small]]
    return [(fixture["id"], fixture["input_ids"]) for fixture in chosen]


def letter_margins(model, ids: list[int], device: torch.device) -> dict:
    """Top-two margins of the n=26 and n=3 readouts, computing only the last position's logits."""
    letter_logits = last_letter_logits(model, ids, device)
    return {
        "margin_26": top_two_margin(letter_probabilities(letter_logits, 26)),
        "margin_3": top_two_margin(letter_probabilities(letter_logits, 3)),
    }


def scale_letters(model, prompts, device: torch.device) -> tuple[float, list[dict]]:
    """make_tiny's letter-row search on a bf16 model: the scale whose n=26 and n=3 margins are closest to uniform."""
    from tiny_common import LETTER_IDS

    embed = model.get_input_embeddings().weight
    original = embed[LETTER_IDS].clone()
    best = None
    with torch.no_grad():
        for scale in LETTER_SCALES:
            embed[LETTER_IDS] = (original.float() * scale).to(embed.dtype)
            results = [letter_margins(model, ids, device) for _, ids in prompts]
            margins = [r["margin_26"] for r in results] + [r["margin_3"] for r in results]
            distance = make_tiny.distance_from_uniform(margins)
            print(f"[real_shapes]   letter scale {scale:.4f}: KS distance {distance:.3f}", flush=True)
            if best is None or distance < best[0]:
                best = (distance, scale, results)
        distance, scale, results = best
        embed[LETTER_IDS] = (original.float() * scale).to(embed.dtype)
    summary = [
        {"prompt": name, "margin_26": round(r["margin_26"], 4), "margin_3": round(r["margin_3"], 4)}
        for (name, _), r in zip(prompts, results)
    ]
    print(f"[real_shapes] letter scale {scale:.4f}, KS distance of margins from uniform {distance:.3f}")
    return scale, distance, summary


def save_checkpoint(model, out: Path, small: bool) -> None:
    for stale in out.glob("model*.safetensors*"):
        stale.unlink()
    model.save_pretrained(out, max_shard_size="2MB" if small else "5GB")


def verify_checkpoint(out: Path, config) -> dict:
    """Reads the shard headers only: dtypes per kind, no lm_head, every parameter present, index total_size."""
    index_path = out / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    weight_map = index["weight_map"]
    if "lm_head.weight" in weight_map:
        raise RuntimeError("tied checkpoint must not store lm_head.weight")
    total_bytes, parameters, f32_names = 0, 0, []
    for shard in sorted(set(weight_map.values())):
        with safe_open(out / shard, framework="pt") as f:
            for name in f.keys():
                tensor_slice = f.get_slice(name)
                dtype = tensor_slice.get_dtype()
                count = math.prod(tensor_slice.get_shape())
                want = "F32" if make_tiny.is_f32_on_disk(name) else "BF16"
                if dtype != want:
                    raise RuntimeError(f"{name} is {dtype} on disk, expected {want}")
                if dtype == "F32":
                    f32_names.append(name)
                parameters += count
                total_bytes += count * (4 if dtype == "F32" else 2)
    text = config.text_config
    linear_layers = sum(t == "linear_attention" for t in text.layer_types)
    if len(f32_names) != 2 * linear_layers:
        raise RuntimeError(f"{len(f32_names)} F32 tensors, expected {2 * linear_layers}")
    if index["metadata"].get("total_size") != total_bytes:
        index["metadata"]["total_size"] = total_bytes
        index_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    shards = {shard: (out / shard).stat().st_size for shard in sorted(set(weight_map.values()))}
    return {"parameters": parameters, "tensors": len(weight_map), "f32_tensors": len(f32_names), "shards": shards}


def make_text_adapter(config, out: Path, device: torch.device) -> dict:
    """tiny_adapters' text adapter on a Qwen3_5ForCausalLM of the same text config (the view Cua trains on)."""
    from peft import get_peft_model

    with torch.device(device):
        base = Qwen3_5ForCausalLM._from_config(config.text_config, dtype=torch.bfloat16)
    peft_model = get_peft_model(base, tiny_adapters.lora_config(tiny_adapters.TEXT_TARGETS))
    tiny_adapters.randomize_lora(peft_model, tiny_adapters.ADAPTER_SEED)  # CPU generator, copied to device
    adapter_dir = out / "adapter-text"
    tiny_adapters.save_adapter(peft_model, adapter_dir)
    adapter_config_path = adapter_dir / "adapter_config.json"
    adapter_config = json.loads(adapter_config_path.read_text())
    adapter_config["base_model_name_or_path"] = "real-shapes (random Qwen3.5-4B shapes, tools/reference/real_shapes.py)"
    adapter_config_path.write_text(json.dumps(adapter_config, indent=2, sort_keys=True) + "\n")
    modules = tiny_adapters.adapted_modules(adapter_dir)
    want = tiny_adapters.expected_text_modules("base_model.model.model.", config.text_config.layer_types)
    tiny_adapters.check_modules("text", modules, want)
    del peft_model, base
    return {
        "modules": len(modules),
        "kinds": tiny_adapters.summarize(modules),
        "bytes": (adapter_dir / "adapter_model.safetensors").stat().st_size,
    }


def write_tokenizer_files(out: Path, tokenizer_json: Path | None) -> list[str]:
    """tokenizer_config.json (the tiny one with the special ids moved to 248044..) and our chat template."""
    tiny = json.loads((TINY_ASSETS / "tokenizer_config.json").read_text())
    shift = FIRST_SPECIAL_ID - NUM_RANKS
    tiny["added_tokens_decoder"] = {
        str(int(key) + shift): value for key, value in tiny["added_tokens_decoder"].items()
    }
    for key, value in tiny["added_tokens_decoder"].items():
        if REAL_SPECIAL_IDS[value["content"]] != int(key):
            raise RuntimeError(f"special token {value['content']} renumbered to {key}")
    (out / "tokenizer_config.json").write_text(json.dumps(tiny, indent=2) + "\n")
    shutil.copy(TINY_ASSETS / "chat_template.jinja", out / "chat_template.jinja")
    written = ["tokenizer_config.json", "chat_template.jinja"]
    if tokenizer_json is not None:
        shutil.copy(tokenizer_json, out / "tokenizer.json")
        written.append("tokenizer.json")
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--small", action="store_true", help="make_tiny sizes with the real vocabulary, CPU")
    parser.add_argument("--tokenizer-json", type=Path, help="copy this tokenizer.json into the snapshot")
    args = parser.parse_args()

    started = time.time()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.small else "cpu")
    torch.manual_seed(WEIGHT_SEED)
    args.out.mkdir(parents=True, exist_ok=True)
    timer = StepTimer(device)
    config = real_config(args.small)
    config._attn_implementation = "eager"  # the letter search's attention; not saved to config.json

    model = timer.run("build", build_model, config, device)
    timer.run("fill_weights", fill_weights, model, device)
    prompts = scaling_prompts(load_fixtures(), args.small)
    scale, ks_distance, margins = timer.run("letter_scale_search", scale_letters, model, prompts, device)
    timer.run("save_pretrained", save_checkpoint, model, args.out, args.small)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    checkpoint = timer.run("verify", verify_checkpoint, args.out, config)
    adapter = timer.run("text_adapter", make_text_adapter, config, args.out, device)
    tokenizer_files = timer.run("tokenizer_files", write_tokenizer_files, args.out, args.tokenizer_json)

    report = {
        "out": str(args.out),
        "small": args.small,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "letter_scale": round(scale, 5),
        "letter_scales_tried": [round(s, 5) for s in LETTER_SCALES],
        "letter_scale_ks_distance": round(ks_distance, 4),
        "base_margins_bf16": margins,
        "checkpoint": checkpoint,
        "adapter_text": adapter,
        "tokenizer_files": tokenizer_files,
        "seconds": dict(timer.seconds, total=round(time.time() - started, 2)),
    }
    (args.out / "real_shapes_report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    sys.exit(main())
