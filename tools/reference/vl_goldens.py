"""Writes model/assets/tiny/vl_goldens.json (+ vl_pixels.u8): fp32 CPU reference outputs of the tiny
checkpoint's vision-language path.

For a few seeded synthetic images, run through transformers' own Qwen2-VL image processor with the
Qwen3.5 settings, records:
- the processor's `image_grid_thw` and its `pixel_values`, stored compactly: every pixel value is one
  of 256 floats (one per uint8 level), so the file keeps a 256-entry table and one byte per value
  (`vl_pixels.u8`, all images back to back); the script checks the table reproduces every value exactly;
- the vision tower's image features (`get_image_features`), base and with the multimodal adapter;
- a Cua-shaped multimodal prompt (image first, then text, through the chat template, the image
  placeholder expanded to grid_h·grid_w/4 image tokens), transformers' own 3-D position ids for it,
  and the final-normed hidden state + letter probabilities (n = 26 and 3) at the last position, for
  the base model and with the multimodal adapter (PEFT unmerged, fp32);
- one extra position-id case with two images and text around them (positions only).
Run after make_tiny.py and tiny_adapters.py.
"""

import json
import time

import numpy as np
import torch
from peft import PeftModel
from PIL import Image
from transformers import AutoTokenizer, Qwen3_5ForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

from tiny_common import (
    LETTER_IDS,
    MULTIMODAL_ADAPTER_DIR,
    SPECIAL_IDS,
    TINY_DIR,
    assert_reference_kernels_absent,
    goldens_provenance,
    sha256_of,
    top_two_margin,
    use_strict_fp32,
)

SCRIPTS = ["vl_goldens.py", "tiny_common.py", "make_tiny.py", "tiny_tokenizer.py", "tiny_adapters.py"]
PIXELS_FILE = "vl_pixels.u8"
IMAGE_SEED = 20261202
# (width, height): square at the minimum size, a landscape one, and a small portrait one that the
# processor upscales to min_pixels.
IMAGE_SIZES = [(256, 256), (320, 240), (90, 150)]
IMAGE_TOKEN_ID = SPECIAL_IDS["<|image_pad|>"]
# A random adapter that barely moves the answers would not test the LoRA path.
MIN_ADAPTER_EFFECT = 0.02


def image_processor() -> Qwen2VLImageProcessor:
    """Qwen3.5-4B's preprocessor_config values (see docs/reference §1.3)."""
    return Qwen2VLImageProcessor(
        size={"shortest_edge": 65536, "longest_edge": 16777216},
        patch_size=16,
        temporal_patch_size=2,
        merge_size=2,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )


def synthetic_image(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """Smooth gradients plus noise and a few rectangles, so resizing and positions matter."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    base = np.stack(
        [128 + 100 * np.sin(x / 17.0), 128 + 100 * np.cos(y / 11.0), (x + 2 * y) % 256],
        axis=-1,
    )
    base += rng.normal(0, 20, size=base.shape)
    for _ in range(4):
        x0, y0 = rng.integers(0, width - 8), rng.integers(0, height - 8)
        base[y0 : y0 + rng.integers(4, height // 3), x0 : x0 + rng.integers(4, width // 3)] = rng.integers(0, 256, 3)
    return Image.fromarray(np.clip(base, 0, 255).astype(np.uint8), mode="RGB")


def encode_levels(pixel_values: torch.Tensor, table: dict) -> np.ndarray:
    """One byte per value: the uint8 level it came from. Fills `table` (level -> exact float) and
    checks that every level always maps to the same float."""
    values = pixel_values.numpy().astype(np.float32).ravel()
    levels = np.rint((values.astype(np.float64) * 0.5 + 0.5) * 255.0).astype(np.int64)
    if levels.min() < 0 or levels.max() > 255:
        raise RuntimeError("pixel values are not rescaled uint8 levels")
    for level in np.unique(levels):
        observed = np.unique(values[levels == level])
        if len(observed) != 1:
            raise RuntimeError(f"level {level} maps to several floats: {observed}")
        if table.setdefault(int(level), float(observed[0])) != float(observed[0]):
            raise RuntimeError(f"level {level} maps to different floats across images")
    return levels.astype(np.uint8)


def prompt_text(n_options: int) -> str:
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    options = [f'{letters[i]}. button "Item {i}" -> click' for i in range(n_options)]
    return (
        "App: Notes\nTask family: save_file\n\nThe current screenshot is attached.\n\nOptions:\n"
        + "\n".join(options)
        + "\n\nAnswer with a single letter."
    )


def multimodal_ids(tokenizer, grid_thw: list[int], n_options: int) -> list[int]:
    """Cua's multimodal prompt: [system, user(image, text)], the image placeholder expanded."""
    system = "You are a one-pass computer-use decision model. Answer with ONLY a letter."
    return image_chat_ids(tokenizer, system, prompt_text(n_options), grid_thw, IMAGE_TOKEN_ID)[1]


def image_chat_ids(tokenizer, system: str, user: str, grid_thw: list[int], image_token_id: int) -> tuple[str, list[int]]:
    """[system, user(image, text)] through the checkpoint's chat template (the rendered string, one
    placeholder), tokenized, the placeholder expanded the way the processor does (t·h·w / merge²
    copies of <|image_pad|>). Shared with real_vl_goldens.py."""
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": user}]},
    ]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    if ids.count(image_token_id) != 1:
        raise RuntimeError("the rendered prompt must hold exactly one image placeholder")
    at = ids.index(image_token_id)
    copies = grid_thw[0] * grid_thw[1] * grid_thw[2] // 4
    return rendered, ids[:at] + [image_token_id] * copies + ids[at + 1 :]


def rope_index(model, ids: list[int], grids: list[list[int]]) -> list[list[int]]:
    """transformers' own M-RoPE position ids, as [t, h, w] per token."""
    input_ids = torch.tensor([ids])
    mm_types = (input_ids == IMAGE_TOKEN_ID).int()
    positions, _ = model.model.get_rope_index(input_ids, mm_types, image_grid_thw=torch.tensor(grids))
    return positions[:, 0, :].T.tolist()


@torch.no_grad()
def readout(model, decoder_norm, ids, pixel_values, grid) -> dict:
    captured = {}
    handle = decoder_norm.register_forward_hook(lambda _m, _i, out: captured.__setitem__("h", out))
    try:
        input_ids = torch.tensor([ids])
        out = model(
            input_ids=input_ids,
            pixel_values=pixel_values,
            image_grid_thw=torch.tensor([grid]),
            mm_token_type_ids=(input_ids == IMAGE_TOKEN_ID).int(),
            use_cache=False,
        )
    finally:
        handle.remove()
    logits = out.logits[0, -1].float()
    letter_logits = logits[LETTER_IDS]
    probs_26 = torch.softmax(letter_logits, dim=-1)
    probs_3 = torch.softmax(letter_logits[:3], dim=-1)
    return {
        "final_hidden": captured["h"][0, -1].float().tolist(),
        "letter_logits": letter_logits.tolist(),
        "probs_26": probs_26.tolist(),
        "probs_3": probs_3.tolist(),
        "margin_26": top_two_margin(probs_26),
        "margin_3": top_two_margin(probs_3),
    }


@torch.no_grad()
def image_features(model, pixel_values, grid) -> torch.Tensor:
    out = model.model.get_image_features(pixel_values, torch.tensor([grid]), return_dict=True)
    return torch.cat(out.pooler_output, dim=0).float()


def load_vlm():
    model = Qwen3_5ForConditionalGeneration.from_pretrained(TINY_DIR, dtype=torch.float32, attn_implementation="eager")
    return model.eval()


def main() -> None:
    started = time.time()
    assert_reference_kernels_absent()
    use_strict_fp32()
    torch.manual_seed(0)

    tokenizer = AutoTokenizer.from_pretrained(TINY_DIR)
    processor = image_processor()
    rng = np.random.default_rng(IMAGE_SEED)

    base = load_vlm()
    adapted = PeftModel.from_pretrained(load_vlm(), MULTIMODAL_ADAPTER_DIR, is_trainable=False).eval()
    if any(p.dtype != torch.float32 for p in adapted.parameters()):
        raise RuntimeError("adapter or base not fp32")
    adapted_inner = adapted.base_model.model

    table: dict[int, float] = {}
    level_chunks = []
    offset = 0
    images = []
    adapter_effect = 0.0
    for index, (width, height) in enumerate(IMAGE_SIZES):
        image = synthetic_image(rng, width, height)
        batch = processor(images=[image], return_tensors="pt")
        pixel_values = batch["pixel_values"].float()
        grid = batch["image_grid_thw"][0].tolist()
        levels = encode_levels(pixel_values, table)
        level_chunks.append(levels)

        feats_base = image_features(base, pixel_values, grid)
        feats_adapted = image_features(adapted_inner, pixel_values, grid)
        record = {
            "name": f"image_{width}x{height}",
            "source_size": [width, height],
            "grid_thw": grid,
            "pixel_rows": pixel_values.shape[0],
            "pixel_cols": pixel_values.shape[1],
            "pixel_offset": offset,
            "features_shape": list(feats_base.shape),
            "features_base": feats_base.ravel().tolist(),
            "features_adapter": feats_adapted.ravel().tolist(),
            "prompts": [],
        }
        offset += levels.size
        for n_options in ([3, 26] if index == 0 else [3]):
            ids = multimodal_ids(tokenizer, grid, n_options)
            positions = rope_index(base, ids, [grid])
            base_out = readout(base, base.model.language_model.norm, ids, pixel_values, grid)
            adapted_out = readout(adapted, adapted_inner.model.language_model.norm, ids, pixel_values, grid)
            adapter_effect = max(
                adapter_effect, max(abs(a - b) for a, b in zip(base_out["probs_26"], adapted_out["probs_26"]))
            )
            record["prompts"].append(
                {
                    "n_options": n_options,
                    "input_ids": ids,
                    "positions": positions,
                    "base": base_out,
                    "adapter": adapted_out,
                }
            )
        images.append(record)
    if adapter_effect < MIN_ADAPTER_EFFECT:
        raise RuntimeError(f"the multimodal adapter moves letter probabilities by only {adapter_effect}")

    # Positions only: two images with text before, between and after.
    grids = [images[1]["grid_thw"], images[2]["grid_thw"]]
    two_ids = [5, 6, 7, SPECIAL_IDS["<|vision_start|>"]]
    two_ids += [IMAGE_TOKEN_ID] * (grids[0][1] * grids[0][2] // 4)
    two_ids += [SPECIAL_IDS["<|vision_end|>"], 8, 9, SPECIAL_IDS["<|vision_start|>"]]
    two_ids += [IMAGE_TOKEN_ID] * (grids[1][1] * grids[1][2] // 4)
    two_ids += [SPECIAL_IDS["<|vision_end|>"], 10]
    rope_cases = [{"name": "two_images", "input_ids": two_ids, "grids": grids, "positions": rope_index(base, two_ids, grids)}]

    level_table = [table.get(level) for level in range(256)]
    pixels_path = TINY_DIR / PIXELS_FILE
    pixels_path.write_bytes(np.concatenate(level_chunks).tobytes())

    checkpoint_files = sorted(TINY_DIR.glob("*.safetensors")) + sorted(MULTIMODAL_ADAPTER_DIR.glob("*"))
    goldens = {
        **goldens_provenance(
            "fp32 CPU reference outputs of the tiny Qwen3.5 vision-language path, written by vl_goldens.py",
            SCRIPTS,
            checkpoint_files,
        ),
        "settings": {
            "dtype": "float32",
            "device": "cpu",
            "attn_implementation": "eager",
            "image_processor": "Qwen2VLImageProcessor (torchvision), min_pixels 65536, patch 16, merge 2, mean/std 0.5",
            "pixels": f"{PIXELS_FILE}: one uint8 level per pixel value; value = level_table[level]",
            "features": "get_image_features pooler output, [grid_h*grid_w/4, out_hidden], row-major",
            "adapter": "PEFT LoRA unmerged, fp32, scale lora_alpha / r = 2 (multimodal adapter)",
            "positions": "transformers get_rope_index, [t, h, w] per token",
        },
        "image_token_id": IMAGE_TOKEN_ID,
        "letter_ids": LETTER_IDS,
        "pixels_file": PIXELS_FILE,
        "pixels_sha256": sha256_of(pixels_path),
        "level_table": level_table,
        "images": images,
        "rope_cases": rope_cases,
        "adapter_effect": adapter_effect,
    }
    (TINY_DIR / "vl_goldens.json").write_text(json.dumps(goldens, indent=1) + "\n")
    print(f"wrote {TINY_DIR / 'vl_goldens.json'} and {pixels_path} in {time.time() - started:.1f} s")


if __name__ == "__main__":
    main()
