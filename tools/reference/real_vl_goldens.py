"""Screenshot goldens on the real-shape checkpoint: a random multimodal adapter with the real Cua-S1 config, seeded
screenshot images written as files, and the fp32 and bf16 transformers references for every screenshot question.

The checkpoint is real_shapes.py's (Qwen3_5ForConditionalGeneration: its vision tower is saved with the real
shapes, 24 blocks of hidden 1024, merger to 2560). This script:

1. writes `<model>/adapter-multimodal`: LoRA r 16, alpha 32 on `q/k/v/o_proj gate/up/down_proj linear_fc1
   linear_fc2` of Qwen3_5ForConditionalGeneration (178 modules at the real shapes: the 128 language modules, the
   24 vision block MLPs and the merger), tiny_adapters' value rules and seed, F32 (`--adapter keep` reuses one);
2. writes the corpus images (PNG/JPEG bytes, seeded) under `<out>/images/` and eight more 1024×1024 PNGs under
   `<out>/latency/` (latency only, no goldens: each is a first sight for the server's image cache);
3. builds each question's prompt exactly as `instinct serve` does for a System1-Omni screenshot request
   (model/src/prompt.rs `omni_screenshot_user_text`, the checkpoint's chat template with the image item first,
   the placeholder expanded to grid_h·grid_w/4 image tokens), and records the ids;
4. runs the fp32 reference (fp32 weights, TF32 off, eager attention, torch delta rule and conv) and the bf16
   reference (bf16 weights, as upstream runs it), both with the multimodal adapter through PEFT, unmerged, on
   `Image.open(bytes).convert("RGB")` (Cua's FourBModel) and transformers' Qwen2-VL image processor with the
   Qwen3.5 settings; only the last position's logits are computed (`logits_to_keep=1`).

    python3 real_vl_goldens.py --model /tmp/real --out DIR [--small] [--adapter write|keep|only]

`--adapter only` writes the adapter and stops (so a server can load it while the references run). Writes
`DIR/real_vl_goldens.json`: the requests (image file, MIME, SHA-256, the `questions` object to post), the
questions with their ids, p_fp32, p_bf16 and |p_bf16 − p_fp32|, and a summary in real_goldens.json's form.
`served_vl_parity.py` checks a running `instinct serve` against it.
"""

import argparse
import gc
import hashlib
import io
import json
import platform
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

from real_common import (
    LETTER_IDS,
    REAL_SPECIAL_IDS,
    cuda_sync,
    delta_rule_implementations,
    letter_probabilities,
    release_gpu,
    require_torch_fallbacks,
    top_two_margin,
    with_adapter,
)

require_torch_fallbacks()  # before anything imports transformers

import tiny_adapters  # noqa: E402  (after real_common: it installs the tokenizer-package placeholders)
from PIL import Image  # noqa: E402
from real_goldens import MARGIN_FOR_ARGMAX_CHECK, quantiles  # noqa: E402
from tiny_common import reference_versions, use_strict_fp32  # noqa: E402
from vl_goldens import image_chat_ids, image_processor  # noqa: E402

SCRIPTS = [
    "real_vl_goldens.py", "real_common.py", "real_goldens.py", "vl_goldens.py", "tiny_adapters.py", "tiny_common.py"
]
IMAGE_TOKEN_ID = REAL_SPECIAL_IDS["<|image_pad|>"]
IMAGE_SEED = 20261206
QUESTION_SEED = 20261207
LATENCY_IMAGES = 8

# What instinct puts in a System1-Omni screenshot prompt (model/src/prompt.rs; the system prompt is Cua's four_b.py).
SYSTEM_PROMPT = (
    "You are a one-pass computer-use decision model. You are shown the current state of a screen and a fixed, "
    "closed list of candidate (element, action) options, each given a single letter. Choose exactly one option: "
    "the single best next action to take. Answer with ONLY that option's letter -- no words, no punctuation, no "
    "explanation."
)
OMNI_APP, OMNI_TASK_FAMILY, OMNI_ROLE, OMNI_ACTION = "Cua Driver", "closed-candidate decision", "Decision", "select"
SCREENSHOT_LINE = "The current screenshot is attached."
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

# (name, width, height, kind, option counts of its questions). Image tokens: 1040×736 → 1024×736 → 736;
# 1024×1024 → 1,024; the small ones are scaled up to min_pixels (64 tokens); 12×1600 is 133:1.
CORPUS = [
    ("rgb_1x1", 1, 1, "png_rgb", [2, 1]),
    ("rgb_200x1", 200, 1, "png_rgb", [3]),
    ("rgb_640x480", 640, 480, "png_rgb", [5, 26]),
    ("rgb_1040x736", 1040, 736, "png_rgb", [2, 17, 26]),
    ("rgb_1024x1024", 1024, 1024, "png_rgb", [2, 3, 8, 26]),
    ("rgb_12x1600", 12, 1600, "png_rgb", [6]),
    ("rgba_320x240", 320, 240, "png_rgba", [3, 12]),
    ("gray_500x400", 500, 400, "png_gray", [7]),
    ("jpeg_640x480", 640, 480, "jpeg", [4, 20]),
]
EXPECTED_IMAGE_TOKENS = {"rgb_1040x736": 736, "rgb_1024x1024": 1024}

WORDS = [
    "Save", "Cancel", "Open", "File", "Edit", "View", "Help", "Close", "Back", "Next", "Search", "Settings",
    "Print", "Share", "Delete", "Rename", "Copy", "Paste", "Undo", "Redo", "Zoom in", "Zoom out", "Refresh",
    "Home", "Download", "Upload", "Sign in", "Menu", "Insert table", "Bold", "Font size", "Send", "Reply all",
]
# Labels that exercise the prompt's escaping (json.dumps(label, ensure_ascii=False) without its quotes).
ODD_LABELS = ['Save "draft"', "Café – Größe", "C:\\Users\\me", "Tab\there", "日本語の設定"]
GOALS = [
    "Save the document under a new name",
    "Open the settings and turn on dark mode",
    "Reply to the last message",
    "Close the dialog without saving",
]


# ---------------------------------------------------------------------------------------------- images


def screenshot_like(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """An RGB screen: a soft background, a title bar, filled boxes with borders and dark 'text' speckle, and one
    noisy 'photo' box (so the file is not all flat colour)."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    img = np.stack([225 + 20 * np.sin(x / 53.0), 228 + 18 * np.cos(y / 41.0), 236 - (x + y) % 24], axis=-1)
    img[: max(1, height // 20)] = rng.integers(30, 90, 3)
    for _ in range(12 + (width * height) // 40_000):
        bw, bh = rng.integers(1, max(2, width // 3)), rng.integers(1, max(2, height // 5))
        x0, y0 = rng.integers(0, max(1, width - bw)), rng.integers(0, max(1, height - bh))
        img[y0 : y0 + bh, x0 : x0 + bw] = rng.integers(0, 256, 3)
        img[y0 : y0 + bh, x0 : x0 + 1] = img[y0 : y0 + 1, x0 : x0 + bw] = 60
        text = rng.random((bh, bw)) < 0.15
        img[y0 : y0 + bh, x0 : x0 + bw][text] = rng.integers(0, 60)
    pw, ph = max(1, width // 4), max(1, height // 4)
    img[height - ph :, width - pw :] += rng.normal(0, 40, size=(ph, pw, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def image_bytes(rng: np.random.Generator, width: int, height: int, kind: str) -> tuple[bytes, str, str]:
    """The encoded file, its MIME type and suffix."""
    rgb = screenshot_like(rng, width, height)
    buffer = io.BytesIO()
    if kind == "png_rgb":
        Image.fromarray(rgb, "RGB").save(buffer, "PNG")
    elif kind == "png_rgba":
        yy, xx = np.mgrid[0:height, 0:width]
        alpha = (40 + (xx * 7 + yy * 3) % 216).astype(np.uint8)  # Pillow's convert("RGB") drops it
        Image.fromarray(np.dstack([rgb, alpha]), "RGBA").save(buffer, "PNG")
    elif kind == "png_gray":
        Image.fromarray(rgb.mean(axis=-1).round().astype(np.uint8), "L").save(buffer, "PNG")
    elif kind == "jpeg":
        Image.fromarray(rgb, "RGB").save(buffer, "JPEG", quality=90)
        return buffer.getvalue(), "image/jpeg", "jpg"
    else:
        raise ValueError(kind)
    return buffer.getvalue(), "image/png", "png"


def write_images(out: Path) -> tuple[list[dict], list[dict]]:
    """The corpus images and the latency images, written under `out`; records name, file, MIME, SHA-256."""
    (out / "images").mkdir(parents=True, exist_ok=True)
    (out / "latency").mkdir(parents=True, exist_ok=True)
    corpus = []
    for index, (name, width, height, kind, option_counts) in enumerate(CORPUS):
        data, mime, suffix = image_bytes(np.random.default_rng(IMAGE_SEED + index), width, height, kind)
        path = out / "images" / f"{name}.{suffix}"
        path.write_bytes(data)
        corpus.append({
            "name": name, "file": f"images/{path.name}", "mime": mime, "size": [width, height], "kind": kind,
            "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "option_counts": option_counts,
        })
    latency = []
    for k in range(LATENCY_IMAGES):
        data, mime, _ = image_bytes(np.random.default_rng(IMAGE_SEED + 1000 + k), 1024, 1024, "png_rgb")
        path = out / "latency" / f"rgb_1024x1024_{k}.png"
        path.write_bytes(data)
        latency.append({"file": f"latency/{path.name}", "mime": mime, "bytes": len(data),
                        "sha256": hashlib.sha256(data).hexdigest()})
    return corpus, latency


# --------------------------------------------------------------------------------------------- prompts


def question_body(rng: random.Random, n_options: int, with_goal: bool) -> dict:
    """A System1-Omni screenshot question: instructions (or null) and `n_options` criteria, some labels null
    (the key is the label then), some with characters the prompt escapes."""
    words = rng.sample(WORDS, min(n_options, len(WORDS)))
    criteria = {}
    for i in range(n_options):
        label = words[i] if i < len(words) else f"Item {i}"
        if i % 7 == 3:
            label = ODD_LABELS[(i // 7) % len(ODD_LABELS)]
        slug = "".join(c for c in label.split()[0].lower() if c.isascii() and c.isalnum()) or "item"
        key = f"{slug}_{i}"
        criteria[key] = None if i % 5 == 4 else label
    return {"type": "choice", "instructions": rng.choice(GOALS) if with_goal else None, "criteria": criteria}


def omni_screenshot_user_text(question: dict) -> str:
    """model/src/prompt.rs' screenshot layout with System1-Omni's fixed app, family, role and action."""
    goal = question["instructions"] or ""
    lines = []
    for letter, (key, value) in zip(LETTERS, question["criteria"].items()):
        label = json.dumps(key if value is None else value, ensure_ascii=False)[1:-1]
        lines.append(f'{letter}. {OMNI_ROLE} "{label}" -> {OMNI_ACTION}')
    text = f"Goal: {goal}\n\n" if goal else ""
    text += f"App: {OMNI_APP}\nTask family: {OMNI_TASK_FAMILY}\n\n{SCREENSHOT_LINE}\n\nOptions:\n"
    return text + "\n".join(lines) + "\n\nAnswer with a single letter."


def build_requests(corpus: list[dict]) -> list[dict]:
    rng = random.Random(QUESTION_SEED)
    requests = []
    for image in corpus:
        questions = {}
        for j, n_options in enumerate(image["option_counts"]):
            questions[f"q{j}_n{n_options}"] = question_body(rng, n_options, with_goal=(len(requests) + j) % 3 != 1)
        requests.append({"image": image["name"], "questions": questions})
    return requests


def preprocess(processor, data: bytes) -> tuple[torch.Tensor, list[int], str]:
    """Cua's FourBModel: PIL open + convert("RGB"), then the image processor."""
    image = Image.open(io.BytesIO(data))
    mode = image.mode
    batch = processor(images=[image.convert("RGB")], return_tensors="pt")
    return batch["pixel_values"].float(), batch["image_grid_thw"][0].tolist(), mode


# ----------------------------------------------------------------------------------------------- adapter


def write_multimodal_adapter(model_dir: Path, device: torch.device) -> dict:
    """tiny_adapters' multimodal adapter (config, value rules, seed) on Qwen3_5ForConditionalGeneration of the
    checkpoint's own config, built in bf16 on `device` (the LoRA weights are F32, as PEFT makes them)."""
    from peft import get_peft_model
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    started = time.time()
    config = Qwen3_5Config.from_pretrained(model_dir)
    with torch.device(device):
        base = Qwen3_5ForConditionalGeneration._from_config(config, dtype=torch.bfloat16)
    peft_model = get_peft_model(base, tiny_adapters.lora_config(tiny_adapters.MULTIMODAL_TARGETS))
    tiny_adapters.randomize_lora(peft_model, tiny_adapters.MULTIMODAL_ADAPTER_SEED)
    adapter_dir = model_dir / "adapter-multimodal"
    tiny_adapters.save_adapter(peft_model, adapter_dir)
    config_path = adapter_dir / "adapter_config.json"
    adapter_config = json.loads(config_path.read_text())
    adapter_config["base_model_name_or_path"] = "real-shapes (random Qwen3.5-4B shapes, tools/reference/real_shapes.py)"
    config_path.write_text(json.dumps(adapter_config, indent=2, sort_keys=True) + "\n")
    del peft_model, base
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    summary = check_multimodal_adapter(model_dir)
    summary["seconds"] = round(time.time() - started, 2)
    return summary


def check_multimodal_adapter(model_dir: Path) -> dict:
    from transformers import Qwen3_5Config

    adapter_dir = model_dir / "adapter-multimodal"
    config = Qwen3_5Config.from_pretrained(model_dir)
    modules = tiny_adapters.adapted_modules(adapter_dir)
    tiny_adapters.check_modules("multimodal", modules, tiny_adapters.expected_multimodal_modules(config))
    adapter_config = json.loads((adapter_dir / "adapter_config.json").read_text())
    return {
        "modules": len(modules),
        "kinds": tiny_adapters.summarize(modules),
        "r": adapter_config["r"],
        "lora_alpha": adapter_config["lora_alpha"],
        "target_modules": adapter_config["target_modules"],
        "bytes": (adapter_dir / "adapter_model.safetensors").stat().st_size,
    }


# ------------------------------------------------------------------------------------------- references


def load_reference(model_dir: Path, dtype: torch.dtype, device: torch.device):
    from transformers import Qwen3_5ForConditionalGeneration

    base = Qwen3_5ForConditionalGeneration.from_pretrained(
        model_dir, dtype=dtype, attn_implementation="eager", device_map=device
    )
    attention = {base.config._attn_implementation, base.config.vision_config._attn_implementation}
    if attention != {"eager"}:
        raise RuntimeError(f"attention implementations {attention}, expected eager")
    model, lora_names, lora_dtype = with_adapter(base, model_dir / "adapter-multimodal", dtype)
    if not any(".visual." in n for n in lora_names):
        raise RuntimeError("the multimodal adapter adapted nothing in the vision tower")
    return model, lora_dtype


@torch.no_grad()
def letter_logits(model, ids: list[int], pixel_values: torch.Tensor, grid: list[int], device) -> torch.Tensor:
    """One forward pass of a screenshot prompt; the 26 letter logits at the last position, in the model's dtype."""
    input_ids = torch.tensor([ids], dtype=torch.long, device=device)
    logits = model(
        input_ids=input_ids,
        pixel_values=pixel_values.to(device),
        image_grid_thw=torch.tensor([grid], device=device),
        mm_token_type_ids=(input_ids == IMAGE_TOKEN_ID).int(),
        use_cache=False,
        logits_to_keep=1,
    ).logits
    if logits.shape[1] != 1:
        raise RuntimeError(f"logits_to_keep=1 gave {logits.shape[1]} positions")
    return logits[0, -1, LETTER_IDS].cpu()


def run_pass(model_dir, dtype, device, prompts: dict, pixels: dict, base_too: set) -> dict:
    """Letter logits of every prompt (name -> (image, ids)); for the names in `base_too`, also with the adapter
    switched off (how much the adapter moves the answers)."""
    started = time.time()
    model, lora_dtype = load_reference(model_dir, dtype, device)
    cuda_sync()
    load_seconds = time.time() - started
    logits, base_logits, seconds = {}, {}, {}
    for name, (image, ids) in prompts.items():
        pixel_values, grid = pixels[image]
        began = time.time()
        logits[name] = letter_logits(model, ids, pixel_values, grid, device)
        cuda_sync()
        seconds[name] = round(time.time() - began, 3)
        print(f"[real_vl_goldens] {dtype} {name} ({len(ids)} ids): {seconds[name]} s", flush=True)
        if name in base_too:
            with model.disable_adapter():
                base_logits[name] = letter_logits(model, ids, pixel_values, grid, device)
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else None
    del model
    release_gpu(device)
    return {
        "letter_logits": logits,
        "base_letter_logits": base_logits,
        "load_seconds": round(load_seconds, 2),
        "forward_seconds": seconds,
        "lora_dtype": lora_dtype,
        "peak_gpu_bytes": peak,
    }


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="real_shapes.py's checkpoint directory")
    parser.add_argument("--out", type=Path, help="where the images and real_vl_goldens.json go")
    parser.add_argument("--small", action="store_true", help="a --small checkpoint, on the CPU")
    parser.add_argument("--adapter", choices=["write", "keep", "only"], default="write",
                        help="write the multimodal adapter (default), keep the one there, or write it and stop")
    args = parser.parse_args()
    if args.adapter != "only" and args.out is None:
        parser.error("--out is required unless --adapter only")

    started = time.time()
    use_strict_fp32()
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.small else "cpu")
    seconds = {}

    if args.adapter in ("write", "only"):
        adapter = write_multimodal_adapter(args.model, device)
    else:
        adapter = check_multimodal_adapter(args.model)
    seconds["adapter"] = round(time.time() - started, 2)
    print(f"[real_vl_goldens] adapter-multimodal: {adapter['modules']} modules, {seconds['adapter']} s", flush=True)
    if args.adapter == "only":
        return

    implementations = delta_rule_implementations()
    if any(not value.startswith("transformers.") for value in implementations.values()):
        raise RuntimeError(f"not the torch fallbacks: {implementations}")
    from transformers import AutoTokenizer

    began = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    corpus, latency = write_images(args.out)
    requests = build_requests(corpus)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    processor = image_processor()
    pixels, images = {}, {}
    for image in corpus:
        pixel_values, grid, mode = preprocess(processor, (args.out / image["file"]).read_bytes())
        pixels[image["name"]] = (pixel_values, grid)
        tokens = grid[0] * grid[1] * grid[2] // 4
        want = EXPECTED_IMAGE_TOKENS.get(image["name"])
        if want is not None and tokens != want:
            raise RuntimeError(f"{image['name']}: {tokens} image tokens, expected {want}")
        images[image["name"]] = dict(image, pillow_mode=mode, grid_thw=grid, image_tokens=tokens)
    prompts, chats, question_rows = {}, {}, []
    for request in requests:
        grid = pixels[request["image"]][1]
        for qname, question in request["questions"].items():
            name = f"{request['image']}/{qname}"
            user = omni_screenshot_user_text(question)
            chat, ids = image_chat_ids(tokenizer, SYSTEM_PROMPT, user, grid, IMAGE_TOKEN_ID)
            prompts[name], chats[name] = (request["image"], ids), chat
            question_rows.append((name, request["image"], qname, len(question["criteria"])))
    seconds["images_and_prompts"] = round(time.time() - began, 2)
    # The adapter's effect, measured on the first question of each image (fp32, adapter switched off).
    first_questions = {f"{r['image']}/{next(iter(r['questions']))}" for r in requests}

    passes = {}
    for label, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        began = time.time()
        base_too = first_questions if label == "fp32" else set()
        passes[label] = run_pass(args.model, dtype, device, prompts, pixels, base_too)
        seconds[f"{label}_pass"] = round(time.time() - began, 2)

    records, differences, margins, checked, mismatches, adapter_effect = [], [], [], 0, [], 0.0
    for name, image, qname, n_options in question_rows:
        p32 = letter_probabilities(passes["fp32"]["letter_logits"][name], n_options)
        p16 = letter_probabilities(passes["bf16"]["letter_logits"][name], n_options)
        difference = float((p16 - p32).abs().max())
        margin = top_two_margin(p32) if n_options > 1 else 1.0
        differences.append(difference)
        if n_options > 1:
            margins.append(margin)
            if margin >= MARGIN_FOR_ARGMAX_CHECK:
                checked += 1
                if int(p16.argmax()) != int(p32.argmax()):
                    mismatches.append(name)
        if name in passes["fp32"]["base_letter_logits"]:
            p_base = letter_probabilities(passes["fp32"]["base_letter_logits"][name], 26)
            adapter_effect = max(adapter_effect, float((p_base - letter_probabilities(
                passes["fp32"]["letter_logits"][name], 26)).abs().max()))
        ids = prompts[name][1]
        records.append({
            "prompt": name,
            "image": image,
            "question": qname,
            "ids_length": len(ids),
            "image_tokens": images[image]["image_tokens"],
            "n_options": n_options,
            "p_fp32": p32.tolist(),
            "p_bf16": p16.tolist(),
            "margin_fp32": margin,
            "argmax_fp32": int(p32.argmax()),
            "argmax_bf16": int(p16.argmax()),
            "max_abs_diff": difference,
            "fp32_seconds": passes["fp32"]["forward_seconds"][name],
            "bf16_seconds": passes["bf16"]["forward_seconds"][name],
            "chat": chats[name],
            "input_ids": ids,
        })

    max_difference = max(differences)
    report = {
        "description": "real-shape checkpoint: fp32 and bf16 transformers references of screenshot questions "
        "with the multimodal adapter (PEFT unmerged)",
        "model": str(args.model),
        "small": args.small,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "versions": reference_versions(pillow=Image.__version__, numpy=np.__version__),
        "platform": platform.platform(),
        "scripts_sha256": {s: sha256_file(Path(__file__).resolve().parent / s) for s in SCRIPTS},
        "settings": {
            "fp32": "fp32 weights (A_log and gated-norm weight at full F32), TF32 off, eager attention "
            "(text and vision)",
            "bf16": "bf16 weights (from_pretrained dtype=bf16), eager attention; pixel_values cast to bf16 by "
            "the model",
            "adapter": "multimodal adapter, PEFT LoRA unmerged, adapter dtype " + passes["bf16"]["lora_dtype"]
            + " in the bf16 pass",
            "readout": "logits_to_keep=1; letter logits in the model dtype; fp32 softmax over the first n",
            "image": "PIL Image.open(bytes).convert('RGB'), transformers Qwen2VLImageProcessor (Qwen3.5 settings)",
            "prompt": "System1-Omni screenshot mapping as instinct renders it: [system, user(image, text)] through "
            "the checkpoint's chat_template.jinja, tokenizer.json, <|image_pad|> expanded to t*h*w/4",
            "delta_rule_and_conv": implementations,
            "adapter_effect_fp32": "max |p_adapter - p_base| over 26 letters, first question of each image",
        },
        "adapter": adapter,
        "image_token_id": IMAGE_TOKEN_ID,
        "images": list(images.values()),
        "latency_images": latency,
        "requests": requests,
        "summary": {
            "questions": len(records),
            "images": len(images),
            "max_abs_diff_bf16_vs_fp32": max_difference,
            "allowance_for_ours": 2 * max_difference + 0.01,
            "margin_fp32_quantiles": quantiles(margins),
            "margin_fp32_histogram_0.1": [sum(min(int(m * 10), 9) == b for m in margins) for b in range(10)],
            "questions_with_margin_ge_0.05": checked,
            "bf16_argmax_mismatches_where_margin_ge_0.05": mismatches,
            "option_counts": sorted({n for *_, n in question_rows}),
            "ids_lengths": sorted({len(ids) for _, ids in prompts.values()}),
            "adapter_effect_fp32": adapter_effect,
        },
        "timing": {
            label: {k: v for k, v in result.items() if k in ("load_seconds", "peak_gpu_bytes")}
            for label, result in passes.items()
        },
        "questions": records,
    }
    seconds["total"] = round(time.time() - started, 1)
    report["seconds"] = seconds
    (args.out / "real_vl_goldens.json").write_text(
        json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    print(json.dumps({k: report[k] for k in ("summary", "timing", "seconds")}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
