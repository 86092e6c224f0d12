"""Screenshot preprocessing goldens for `instinct_model::image` (model/tests/image_*.rs).

Writes deterministic test images to model/tests/data/images/ and records, for each, what the
reference computes: transformers 5.17.0's Qwen2VLImageProcessor (the class AutoImageProcessor
picks for qwen3_5 when torchvision is installed) with Qwen3.5's settings, fed
`PIL.Image.open(path).convert("RGB")` as Cua-S1's FourBModel does. Full tensors are not stored:
a SHA-256 of the little-endian f32 pixel_values plus sums and end values, enough to diagnose.

Also records torch's uint8 antialiased bicubic resize (the op torchvision's resize calls) on a
formula-generated pattern for many size pairs, as SHA-256 of the uint8 output.

Run from the repository root: /opt/refenv/bin/python tools/reference/image_goldens.py
Needs torch 2.11, torchvision 0.26 (the version paired with torch 2.11), transformers 5.17.0, Pillow.
"""

import hashlib
import io
import json
import struct
import zlib
from pathlib import Path

import numpy as np
import torch
import torchvision
import transformers
from PIL import Image
from transformers import AutoImageProcessor
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "model" / "tests" / "data" / "images"

SIZES = [(1, 1), (200, 1), (33, 47), (320, 240), (640, 480), (1040, 736), (1024, 1024), (1920, 1080)]
# Variants written only for a few sizes, to keep the committed files small.
VARIANT_SIZES = [(33, 47), (320, 240), (1040, 736)]
JPEG_SIZES = [(33, 47), (320, 240), (640, 480), (1040, 736)]
SMALL_SIZES = [(33, 47), (320, 240)]

# (in_w, in_h, out_w, out_h) for the bare resize goldens: up, down, one axis, large ratios.
RESIZE_CASES = [
    (1, 1, 256, 256), (200, 1, 3648, 32), (33, 47, 224, 320), (320, 240, 320, 256),
    (640, 480, 640, 480), (1040, 736, 1024, 736), (1920, 1080, 1920, 1088), (97, 61, 13, 7),
    (2048, 512, 32, 32), (5, 300, 320, 96), (123, 457, 416, 1536), (1000, 3, 200, 600),
]


def processor() -> Qwen2VLImageProcessor:
    proc = Qwen2VLImageProcessor(
        size={"shortest_edge": 65_536, "longest_edge": 16_777_216},
        patch_size=16,
        temporal_patch_size=2,
        merge_size=2,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
        rescale_factor=1 / 255,
        do_convert_rgb=True,
    )
    return proc


def check_auto_class() -> str:
    """The class transformers maps qwen3_5 to, so the goldens use what AutoProcessor would."""
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES

    entry = IMAGE_PROCESSOR_MAPPING_NAMES["qwen3_5"]
    chosen = entry["torchvision"] if isinstance(entry, dict) else entry
    assert chosen == "Qwen2VLImageProcessor", entry
    return chosen


def base_rgb(w: int, h: int) -> np.ndarray:
    """Smooth gradients with sharp shapes (edges exercise the resize; gradients compress well)."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 255 * x / max(w - 1, 1)
    g = 255 * y / max(h - 1, 1)
    b = 128 + 100 * np.sin(x / 23.0) * np.cos(y / 17.0)
    img = np.stack([r, g, b], axis=-1)
    # Rectangles and a disc of flat colour, like UI elements.
    img[(x // 40 + y // 30) % 7 == 0] = [250, 250, 250]
    disc = (x - w * 0.6) ** 2 + (y - h * 0.4) ** 2 < (min(w, h) * 0.2) ** 2
    img[disc] = [10, 40, 200]
    img[(y % 57 < 2) & (x > w / 4)] = [0, 0, 0]
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png16(arr: np.ndarray, color_type: int) -> bytes:
    """A 16-bit PNG (Pillow cannot write 16-bit colour), rows unfiltered."""
    h, w = arr.shape[:2]
    raw = b"".join(b"\x00" + arr[row].astype(">u2").tobytes() for row in range(h))
    ihdr = struct.pack(">IIBBBBB", w, h, 16, color_type, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", zlib.compress(raw, 9))
        + png_chunk(b"IEND", b"")
    )


def save(img: Image.Image, fmt: str, **kwargs) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kwargs)
    return buf.getvalue()


def variants(w: int, h: int) -> dict[str, bytes]:
    rgb = base_rgb(w, h)
    out = {"png_rgb": save(Image.fromarray(rgb), "PNG", optimize=True)}
    if (w, h) in VARIANT_SIZES:
        alpha = ((np.arange(w)[None, :] * 3 + np.arange(h)[:, None] * 5) % 256).astype(np.uint8)
        gray = rgb.mean(axis=-1).round().astype(np.uint8)
        out["png_rgba"] = save(Image.fromarray(np.dstack([rgb, alpha]), "RGBA"), "PNG", optimize=True)
        out["png_gray"] = save(Image.fromarray(gray, "L"), "PNG", optimize=True)
        out["png_gray_alpha"] = save(Image.fromarray(np.dstack([gray, alpha]), "LA"), "PNG", optimize=True)
        out["png_gray1"] = save(Image.fromarray(gray > 128), "PNG")
        # 16-bit gray spans the full range, so Pillow's clamp to 255 shows.
        gray16 = (rgb[..., 0].astype(np.uint32) * 257 // 3 + rgb[..., 1].astype(np.uint32) // 2).astype(np.uint16)
        out["png_gray16"] = save(Image.fromarray(gray16), "PNG")
        if (w, h) in SMALL_SIZES:
            # Low bytes that differ from the high ones, so taking the wrong byte shows.
            low = ((np.arange(w)[None, :, None] // 8) * 37 % 256).astype(np.uint16)
            rgb16 = rgb.astype(np.uint16) * 256 + low
            out["png_rgb16"] = png16(rgb16, 2)
            if (w, h) == (33, 47):
                out["png_rgba16"] = png16(np.dstack([rgb16, alpha.astype(np.uint16) * 257]), 6)
        if (w, h) == (33, 47):
            # tRNS on non-palette images: the decoder adds alpha, Pillow's convert("RGB") ignores it.
            out["png_gray_trns"] = save(Image.fromarray(gray, "L"), "PNG", transparency=int(gray[0, 0]))
            out["png_rgb_trns"] = save(Image.fromarray(rgb), "PNG", transparency=tuple(int(v) for v in rgb[0, 0]))
            out["png_gray16_trns"] = save(Image.fromarray(gray16), "PNG", transparency=int(gray16[0, 0]))
        pal = Image.fromarray(rgb).quantize(colors=64, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
        out["png_palette"] = save(pal, "PNG", optimize=True)
        out["png_palette_trns"] = save(pal, "PNG", transparency=3)
        pal16 = Image.fromarray(rgb).quantize(colors=16, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
        out["png_palette4"] = save(pal16, "PNG", bits=4)
    if (w, h) in JPEG_SIZES:
        out["jpeg_rgb"] = save(Image.fromarray(rgb), "JPEG", quality=90)
        if (w, h) in SMALL_SIZES:
            out["jpeg_rgb_q60_420"] = save(Image.fromarray(rgb), "JPEG", quality=60, subsampling=2)
            out["jpeg_gray"] = save(Image.fromarray(rgb[..., 1]), "JPEG", quality=85)
            out["jpeg_rgb_progressive_444"] = save(
                Image.fromarray(rgb), "JPEG", quality=90, progressive=True, subsampling=0
            )
    return out


def f32_stats(values: np.ndarray) -> dict:
    flat = values.astype("<f4").reshape(-1)
    return {
        "sha256": hashlib.sha256(flat.tobytes()).hexdigest(),
        "count": int(flat.size),
        "sum": float(flat.astype(np.float64).sum()),
        "sum_sq": float((flat.astype(np.float64) ** 2).sum()),
        "first": [float(v) for v in flat[:8]],
        "last": [float(v) for v in flat[-8:]],
    }


def pattern(w: int, h: int) -> np.ndarray:
    """High-frequency uint8 pattern, [3, h, w]; the Rust test computes the same formula."""
    y, x = np.mgrid[0:h, 0:w].astype(np.int64)
    planes = [((x * x * 7 + y * 13 + c * 71 + x * y * 3) ^ (x * 5 + y)) & 255 for c in range(3)]
    return np.stack(planes).astype(np.uint8)


def main() -> None:
    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    proc = processor()
    cases = []
    for w, h in SIZES:
        for name, data in variants(w, h).items():
            fname = f"{name}_{w}x{h}.{'jpg' if name.startswith('jpeg') else 'png'}"
            (OUT / fname).write_bytes(data)
            image = Image.open(OUT / fname)
            mode = image.mode
            rgb = image.convert("RGB")
            decoded = np.asarray(rgb)
            result = proc(images=[rgb], return_tensors="pt")
            pv = result["pixel_values"].numpy()
            grid = [int(v) for v in result["image_grid_thw"][0]]
            case = {
                "file": fname,
                "mime": "image/jpeg" if name.startswith("jpeg") else "image/png",
                "pillow_mode": mode,
                "size": [w, h],
                "decoded_rgb_sha256": hashlib.sha256(decoded.tobytes()).hexdigest(),
                "grid_thw": grid,
                "resized": [grid[2] * 16, grid[1] * 16],
                "pixel_values_shape": list(pv.shape),
                "pixel_values": f32_stats(pv),
            }
            if name.startswith("jpeg"):
                # Pillow's decoded pixels, lossless, so the Rust test can split decoder differences
                # from preprocessing differences.
                ref_name = f"{name}_{w}x{h}.pillow.png"
                (OUT / ref_name).write_bytes(save(rgb, "PNG", optimize=True))
                case["pillow_decoded_png"] = ref_name
            cases.append(case)
            print(f"{fname}: {mode} -> grid {grid}, {len(data)} bytes")
    resize_cases = []
    for in_w, in_h, out_w, out_h in RESIZE_CASES:
        src = torch.from_numpy(pattern(in_w, in_h))[None]
        out = torch.nn.functional.interpolate(src, size=(out_h, out_w), mode="bicubic", antialias=True, align_corners=False)
        assert out.dtype == torch.uint8
        hwc = out[0].permute(1, 2, 0).contiguous().numpy()
        resize_cases.append({
            "input": [in_w, in_h],
            "output": [out_w, out_h],
            "rgb_sha256": hashlib.sha256(hwc.tobytes()).hexdigest(),
        })
    goldens = {
        "generator": "tools/reference/image_goldens.py",
        "versions": {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "torchvision": torchvision.__version__,
            "pillow": Image.__version__,
            "numpy": np.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        },
        "image_processor": check_auto_class(),
        "cases": cases,
        "resize_cases": resize_cases,
    }
    (OUT / "goldens.json").write_text(json.dumps(goldens, indent=1) + "\n")


if __name__ == "__main__":
    main()
