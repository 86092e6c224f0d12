"""Writes random LoRA adapters with the real Cua-S1-4B-0.2 adapter configs next to the tiny checkpoint.

adapter-text: trained on the Qwen3_5ForCausalLM view (keys base_model.model.model.layers.N...).
adapter-multimodal: on Qwen3_5ForConditionalGeneration, adding linear_fc1/linear_fc2 (vision MLPs and merger).
Run after make_tiny.py with /opt/refenv/bin/python.
"""

import json
import re
import sys
import time
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from safetensors import safe_open
from transformers import AutoModelForCausalLM, Qwen3_5ForConditionalGeneration

from tiny_common import MULTIMODAL_ADAPTER_DIR, TEXT_ADAPTER_DIR, TINY_DIR, assert_reference_kernels_absent

ADAPTER_SEED = 4321
MULTIMODAL_ADAPTER_SEED = ADAPTER_SEED + 1
# Standard deviation of the random lora_B entries: large enough that the adapter moves the letter answers.
LORA_B_STD = 0.04
TEXT_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
MULTIMODAL_TARGETS = TEXT_TARGETS + ["linear_fc1", "linear_fc2"]
# Recorded instead of this machine's absolute path; relative to the repository root.
BASE_MODEL_NAME = "model/assets/tiny"


def lora_config(targets: list[str]) -> LoraConfig:
    return LoraConfig(
        r=16,
        lora_alpha=32,
        lora_dropout=0.05,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )


def randomize_lora(peft_model, seed: int) -> None:
    """PEFT starts lora_B at zero (a no-op adapter); give A and B seeded random values instead."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(peft_model.named_parameters()):
            if ".lora_A." in name:
                param.copy_(torch.randn(param.shape, generator=gen) * param.shape[1] ** -0.5)
            elif ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=gen) * LORA_B_STD)


def check_modules(what: str, modules: list[str], want: set[str]) -> None:
    got = set(modules)
    if got != want:
        raise RuntimeError(f"{what} adapter modules: extra {sorted(got - want)}, missing {sorted(want - got)}")


def adapted_modules(adapter_dir: Path) -> list[str]:
    with safe_open(adapter_dir / "adapter_model.safetensors", framework="pt") as f:
        keys = list(f.keys())
        dtypes = {f.get_tensor(k).dtype for k in keys}
    if dtypes != {torch.float32}:
        raise RuntimeError(f"{adapter_dir} stores {dtypes}, expected float32 only")
    modules = sorted({k.rsplit(".lora_", 1)[0] for k in keys})
    if len(keys) != 2 * len(modules):
        raise RuntimeError(f"{adapter_dir}: keys are not lora_A/lora_B pairs")
    return modules


def expected_text_modules(prefix: str, layer_types: list[str]) -> set[str]:
    modules = set()
    for i, layer_type in enumerate(layer_types):
        modules |= {f"{prefix}layers.{i}.mlp.{p}" for p in ("gate_proj", "up_proj", "down_proj")}
        if layer_type == "full_attention":
            modules |= {f"{prefix}layers.{i}.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj", "o_proj")}
    return modules


def save_adapter(peft_model, out_dir: Path) -> None:
    peft_model.save_pretrained(out_dir)
    config_path = out_dir / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = BASE_MODEL_NAME
    config["target_modules"] = sorted(config["target_modules"])  # PEFT keeps a set: fix the order
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    readme = out_dir / "README.md"
    if readme.exists():
        readme.unlink()  # PEFT's model-card boilerplate


def make_text_adapter() -> list[str]:
    base = AutoModelForCausalLM.from_pretrained(TINY_DIR, dtype=torch.float32)
    if type(base).__name__ != "Qwen3_5ForCausalLM":
        raise RuntimeError(f"AutoModelForCausalLM gave {type(base).__name__}")
    peft_model = get_peft_model(base, lora_config(TEXT_TARGETS))
    randomize_lora(peft_model, ADAPTER_SEED)
    save_adapter(peft_model, TEXT_ADAPTER_DIR)
    modules = adapted_modules(TEXT_ADAPTER_DIR)
    want = expected_text_modules("base_model.model.model.", base.config.layer_types)
    check_modules("text", modules, want)
    return modules


def make_multimodal_adapter() -> list[str]:
    base = Qwen3_5ForConditionalGeneration.from_pretrained(TINY_DIR, dtype=torch.float32)
    peft_model = get_peft_model(base, lora_config(MULTIMODAL_TARGETS))
    randomize_lora(peft_model, MULTIMODAL_ADAPTER_SEED)
    save_adapter(peft_model, MULTIMODAL_ADAPTER_DIR)
    modules = adapted_modules(MULTIMODAL_ADAPTER_DIR)
    check_modules("multimodal", modules, expected_multimodal_modules(base.config))
    return modules


def expected_multimodal_modules(config) -> set[str]:
    """The multimodal adapter's modules on Qwen3_5ForConditionalGeneration: the text adapter's in the language
    model, plus every vision block's MLP and the merger (`linear_fc1`/`linear_fc2` match both)."""
    want = expected_text_modules("base_model.model.model.language_model.", config.text_config.layer_types)
    vision = "base_model.model.model.visual."
    want |= {f"{vision}blocks.{j}.mlp.linear_fc{k}" for j in range(config.vision_config.depth) for k in (1, 2)}
    want |= {f"{vision}merger.linear_fc{k}" for k in (1, 2)}
    return want


def summarize(modules: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for module in modules:
        kind = re.sub(r"\.\d+\.", ".N.", module)
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def main() -> None:
    started = time.time()
    assert_reference_kernels_absent()
    text = make_text_adapter()
    multimodal = make_multimodal_adapter()
    report = {
        "text_modules": len(text),
        "text_kinds": summarize(text),
        "multimodal_modules": len(multimodal),
        "multimodal_kinds": summarize(multimodal),
        "files": {
            str(p.relative_to(TINY_DIR)): p.stat().st_size
            for d in (TEXT_ADAPTER_DIR, MULTIMODAL_ADAPTER_DIR)
            for p in sorted(d.glob("*"))
        },
        "seconds": round(time.time() - started, 1),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    sys.exit(main())
