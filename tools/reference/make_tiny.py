"""Writes model/assets/tiny: a tiny random Qwen3.5 vision-language checkpoint with the real layout.

Run with /opt/refenv/bin/python (transformers 5.17.0, peft 0.21.0, torch 2.11.0). Deterministic: the same
seeds give the same tensors. After it, run tiny_adapters.py and goldens.py (see README.md).
"""

import json
import math
import re
import shutil
import sys
import time
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer, Qwen3_5Config, Qwen3_5ForConditionalGeneration

from tiny_common import (
    LETTER_IDS,
    QWEN35_TEXT_ARCHITECTURE,
    QWEN35_VISION_ARCHITECTURE,
    SPECIAL_IDS,
    TINY_DIR,
    VOCAB_ROWS,
    assert_reference_kernels_absent,
    chat_messages,
    letter_readout,
    named_golden_prompts,
    qwen35_config,
    qwen35_rope,
    use_strict_fp32,
)
from tiny_tokenizer import write_tokenizer

WEIGHT_SEED = 1234
SHARD_SIZE = "1MB"
FIXTURES_FILE = Path("/work/shared/fixtures/cua-s1-4b-0.2-text.json")
# Tensor kinds the real Qwen3.5 checkpoints store as F32 while everything else is bf16.
F32_SUFFIXES = (".linear_attn.A_log", ".linear_attn.norm.weight")
# Letter-row scales tried; the one whose golden margins cover [0, 1] most evenly wins.
LETTER_SCALES = [0.025 * i for i in range(4, 41)]

HIDDEN = 64
TEXT_CONFIG = {
    "vocab_size": VOCAB_ROWS,
    "hidden_size": HIDDEN,
    "intermediate_size": 2 * HIDDEN,
    "num_hidden_layers": 8,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"],
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
    # rotary dim = 64 * 0.25 = 16, i.e. 8 frequencies split T/H/W like the real [11, 11, 10].
    "rope_parameters": qwen35_rope([3, 3, 2]),
    "eos_token_id": SPECIAL_IDS["<|endoftext|>"],
    **QWEN35_TEXT_ARCHITECTURE,
}
VISION_CONFIG = {
    "depth": 2,
    "hidden_size": 32,
    "num_heads": 2,
    "intermediate_size": 64,
    "out_hidden_size": HIDDEN,
    "num_position_embeddings": 64,
    **QWEN35_VISION_ARCHITECTURE,
}


def tiny_config() -> Qwen3_5Config:
    return qwen35_config(TEXT_CONFIG, VISION_CONFIG, SPECIAL_IDS)


def random_value(name: str, shape: torch.Size, gen: torch.Generator) -> torch.Tensor:
    """Random but realistic values per tensor kind, so every part of the forward pass matters."""

    def normal(std: float) -> torch.Tensor:
        return torch.randn(shape, generator=gen) * std

    def uniform(low: float, high: float) -> torch.Tensor:
        return low + (high - low) * torch.rand(shape, generator=gen)

    if name.endswith("embed_tokens.weight"):
        return normal(1.0)
    if name.endswith("linear_attn.A_log"):
        # A in [1, 16]: with dt below, per-step decays exp(-A dt) spread over about (0.2, 0.999).
        return uniform(1.0, 16.0).log()
    if name.endswith("linear_attn.dt_bias"):
        dt = uniform(math.log(1e-3), math.log(1e-1)).exp()
        return dt + torch.log(-torch.expm1(-dt))  # inverse softplus
    if name.endswith("linear_attn.norm.weight"):
        return 1.0 + normal(0.1)  # the gated norm multiplies by w itself
    if name.endswith("linear_attn.conv1d.weight"):
        return normal(0.5)
    if name.startswith("model.language_model.") and name.endswith("norm.weight"):
        return normal(0.1)  # zero-centred RMSNorms apply (1 + w)
    if name.startswith("model.visual.") and (".norm" in name):
        return 1.0 + normal(0.1) if name.endswith("weight") else normal(0.02)
    if name.endswith("pos_embed.weight"):
        return normal(0.5)
    if name.endswith(".bias"):
        return normal(0.02)
    if name.endswith(".weight") and len(shape) >= 2:
        fan_in = math.prod(shape[1:])
        return normal(fan_in**-0.5)
    raise ValueError(f"no initialisation rule for {name} {tuple(shape)}")


def round_to_bf16(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to(torch.bfloat16).to(torch.float32)


def is_f32_on_disk(name: str) -> bool:
    return name.endswith(F32_SUFFIXES)


def fill_weights(model: Qwen3_5ForConditionalGeneration) -> None:
    """Sets every parameter to the value the goldens will see: bf16-representable except the F32 kinds."""
    gen = torch.Generator().manual_seed(WEIGHT_SEED)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            value = random_value(name, param.shape, gen)
            param.copy_(value if is_f32_on_disk(name) else round_to_bf16(value))


def distance_from_uniform(margins: list[float]) -> float:
    """Kolmogorov-Smirnov distance between the margins and the uniform law on [0, 1]; 0 is a perfect spread."""
    points = sorted(margins)
    n = len(points)
    return max(max(abs((i + 1) / n - v), abs(i / n - v)) for i, v in enumerate(points))


def scale_letter_rows(model, prompts: list[tuple[str, list[int]]]) -> tuple[float, list[dict]]:
    """Chooses one scale for embedding rows 32..57 so the letter margins spread over [0, 1]."""
    embed = model.get_input_embeddings().weight
    original = embed[LETTER_IDS].clone()
    best = None
    with torch.no_grad():
        for scale in LETTER_SCALES:
            embed[LETTER_IDS] = round_to_bf16(original * scale)
            results = [letter_readout(model, ids) for _, ids in prompts]
            margins = [r["margin_26"] for r in results] + [r["margin_3"] for r in results]
            distance = distance_from_uniform(margins)
            if best is None or distance < best[0]:
                best = (distance, scale, results)
        distance, scale, results = best
        embed[LETTER_IDS] = round_to_bf16(original * scale)
    summary = [
        {"prompt": name, "margin_26": round(r["margin_26"], 4), "margin_3": round(r["margin_3"], 4)}
        for (name, _), r in zip(prompts, results)
    ]
    print(f"letter scale {scale:.3f}, KS distance of margins from uniform {distance:.3f}")
    return scale, summary


def save_sharded(model, expected: dict[str, torch.Tensor]) -> None:
    """save_pretrained in bf16, then put the F32 kinds back at full precision as the real shards have them."""
    model.to(torch.bfloat16).save_pretrained(TINY_DIR, max_shard_size=SHARD_SIZE)
    index_path = TINY_DIR / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shards = sorted(set(index["weight_map"].values()))
    if len(shards) != 2:
        raise RuntimeError(f"expected 2 shards, got {shards}; adjust SHARD_SIZE")
    total_bytes = 0
    for shard in shards:
        tensors = load_file(TINY_DIR / shard)
        for name in tensors:
            if is_f32_on_disk(name):
                tensors[name] = expected[name].to(torch.float32).contiguous()
        save_file(tensors, TINY_DIR / shard, metadata={"format": "pt"})
        total_bytes += sum(t.numel() * t.element_size() for t in tensors.values())
    index["metadata"]["total_size"] = total_bytes
    index_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


def verify_saved(expected: dict[str, torch.Tensor]) -> dict:
    """Reloads the shards and the model; every tensor must come back exactly, in the intended dtype."""
    index = json.loads((TINY_DIR / "model.safetensors.index.json").read_text())
    dtypes = {}
    for name, shard in index["weight_map"].items():
        with safe_open(TINY_DIR / shard, framework="pt") as f:
            tensor = f.get_tensor(name)
        want = torch.float32 if is_f32_on_disk(name) else torch.bfloat16
        if tensor.dtype != want:
            raise RuntimeError(f"{name} is {tensor.dtype}, expected {want}")
        kind = re.sub(r"\.\d+\.", ".N.", name)
        dtypes.setdefault(str(tensor.dtype).removeprefix("torch."), set()).add(kind)
    if "lm_head.weight" in index["weight_map"]:
        raise RuntimeError("tied checkpoint must not store lm_head.weight")
    reloaded = Qwen3_5ForConditionalGeneration.from_pretrained(TINY_DIR, dtype=torch.float32)
    for name, param in reloaded.named_parameters():
        if not torch.equal(param.detach(), expected[name]):
            raise RuntimeError(f"{name} differs after reload")
    return {dtype: sorted(kinds) for dtype, kinds in dtypes.items()}


def tokenizer_check_texts() -> list[str]:
    """Texts the tiny tokenizer is checked on; the real Cua-S1 fixture prompts too where this checkout has them."""
    texts = [
        "Hello, World! It's 2026: résumé naïve café — 東京 Ünïcödé\n\n\tTabs  and   spaces  \r\n",
        "<|im_start|>user\nA. button \"Save\" -> click<|im_end|>\n<|im_start|>assistant\n<think>\n",
        "don't WE'LL they've I'M x'd 12345 3.14 ((nested)) [[brackets]]\u00a0nbsp",
    ]
    if FIXTURES_FILE.exists():
        texts += [fixture["chat"] for fixture in json.loads(FIXTURES_FILE.read_text())["fixtures"]]
    return texts


def check_chat_template() -> None:
    tokenizer = AutoTokenizer.from_pretrained(TINY_DIR)
    system, user = chat_messages()
    rendered = tokenizer.apply_chat_template([system, user], tokenize=False, add_generation_prompt=True)
    want = (
        f"<|im_start|>system\n{system['content']}<|im_end|>\n<|im_start|>user\n{user['content']}<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )
    if rendered != want:
        raise RuntimeError(f"chat template renders {rendered!r}")
    image_turn = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " Look. "}]}]
    rendered = tokenizer.apply_chat_template(image_turn, tokenize=False, add_generation_prompt=True)
    image_want = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|> Look.<|im_end|>\n"
    if rendered != image_want + "<|im_start|>assistant\n<think>\n":
        raise RuntimeError(f"image turn renders {rendered!r}")
    for letter_id, letter in zip(LETTER_IDS, "ABCDEFGHIJKLMNOPQRSTUVWXYZ"):
        if tokenizer.encode(letter, add_special_tokens=False) != [letter_id]:
            raise RuntimeError(f"letter {letter} is not the single token {letter_id}")


def main() -> None:
    started = time.time()
    assert_reference_kernels_absent()
    use_strict_fp32()
    torch.manual_seed(WEIGHT_SEED)
    TINY_DIR.mkdir(parents=True, exist_ok=True)
    for stale_shard in TINY_DIR.glob("model*.safetensors*"):
        stale_shard.unlink()  # a different shard count must not leave old shards behind

    write_tokenizer(TINY_DIR, tokenizer_check_texts())
    shutil.copy(Path(__file__).resolve().parent / "chat_template.jinja", TINY_DIR / "chat_template.jinja")
    check_chat_template()

    config = tiny_config()
    config._attn_implementation = "eager"  # the goldens' attention; not saved to config.json
    model = Qwen3_5ForConditionalGeneration(config).to(torch.float32).eval()
    fill_weights(model)
    prompts = named_golden_prompts(AutoTokenizer.from_pretrained(TINY_DIR))
    scale, margins = scale_letter_rows(model, prompts)
    expected = {name: param.detach().clone() for name, param in model.named_parameters()}

    save_sharded(model, expected)
    dtypes = verify_saved(expected)
    report = {
        "letter_scale": round(scale, 3),
        "base_margins": margins,
        "dtypes": dtypes,
        "parameters": sum(t.numel() for t in expected.values()),
        "files": {p.name: p.stat().st_size for p in sorted(TINY_DIR.glob("*")) if p.is_file()},
        "seconds": round(time.time() - started, 1),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    sys.exit(main())
