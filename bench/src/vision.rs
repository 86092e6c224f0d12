//! `instinct bench --image-sizes WxH[,WxH...]`: the screenshot path's vision tower alone, for
//! timing and profiling it (Nsight Compute) without the language model.
//!
//! The tower is loaded as the screenshot path loads it ([`load_vision_tower`]: the snapshot's
//! `model.visual.*` weights, the vision modules of `--multimodal-adapter` merged in f32, uploaded;
//! the language weights are not read). For each size a deterministic PNG is drawn (RGB, seeded by
//! `--seed` and the size: random gradients under per-pixel noise, so it is not trivially
//! compressible), and each run times, separately, the host's
//! [`preprocess`](instinct_model::image::preprocess) of the PNG bytes (header checks under the
//! serving limits, decode, resize) and the device's [`VisionTower::forward_kept`] of the result
//! as the server runs it (the patch rows packed from the u8 image, on a GPU its bytes copied up
//! and packed by a kernel; the tower; the features left on the device once it is done), then the features read back to the host
//! (timed apart). `--warmup` untimed runs come first; `--runs` timed runs
//! follow, cut by `--max-row-s` (after `--min-runs`) as the text rows are. The tower keeps the
//! position table of recent grids on the device, so only the first (warm-up) run of a size
//! resamples and uploads it, as a server answering screenshots of one size does.
//!
//! FLOPs (2 per multiply-accumulate) are [`TowerFlops`]: the patch embedding GEMM, each block's
//! qkv, proj, fc1 and fc2 GEMMs, its attention (QKᵀ and PV within each frame, 4·n²·hidden per frame
//! of n patches) and the merger's fc1 and fc2; norms, GELU, the rotary and softmax not counted.

use std::fmt;
use std::str::FromStr;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use image::codecs::png::PngEncoder;
use image::{ExtendedColorType, ImageEncoder};
use instinct_kernels::backend::VisionBackend;
use instinct_kernels::CpuBackend;
use instinct_model::decider::load_vision_tower;
use instinct_model::image::preprocess;
use instinct_model::vision::{VisionConfig, VisionTower};
use serde_json::{json, Map, Value};

use crate::prompts::SplitMix;
use crate::{push, start_cuda, summarize, Bench, Device, ModelSource};

/// What the vision mode's load time covers.
const LOAD_WHAT: &str = "backend_start_s: CUDA context and kernel modules (compiled, or loaded \
    from the disk cache; 0 on the CPU); tower_load_s: read the model.visual.* safetensors, merge \
    the adapter's vision modules in f32, upload (bf16 on the GPU)";
/// How the vision rows are timed (written into the report).
pub(crate) const TIMING: &str = "per run, wall clock around each of: \
    instinct_model::image::preprocess of the PNG bytes (host: header checks, decode, resize), \
    VisionTower::forward_kept of its output (device, as the server runs it: the patch rows packed \
    from the u8 image, normalized and rounded to bf16 on the GPU, the tower, waiting for the \
    device; the features stay there) and the features \
    read back to the host (read_back); the tower keeps recent grids' position tables, so only a \
    size's first warm-up run resamples and uploads one";
/// The FLOP convention of the vision rows (written into the report).
pub(crate) const FLOPS_CONVENTION: &str = "2 per multiply-accumulate; patch_embed = the patch \
    GEMM (n x patch_dim x hidden); blocks = qkv, proj, fc1 and fc2 GEMMs of every block; \
    attention = QK^T and PV within each frame, 4*f^2*hidden per block and frame of f patches; \
    merger = fc1 and fc2 over the n/merge^2 merged rows; norms, GELU, rotary and softmax not \
    counted; achieved_TFLOPs = total / the encode median";

/// One `--image-sizes` entry: the PNG's width and height in pixels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageSize {
    pub width: u32,
    pub height: u32,
}

impl FromStr for ImageSize {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("expected WxH with positive sides (e.g. 1024x1024), got `{s}`");
        let (w, h) = s.trim().split_once('x').ok_or_else(bad)?;
        let side = |v: &str| v.parse::<u32>().ok().filter(|&v| v > 0).ok_or_else(bad);
        Ok(Self {
            width: side(w)?,
            height: side(h)?,
        })
    }
}

impl fmt::Display for ImageSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}", self.width, self.height)
    }
}

/// FLOPs of one image through the vision tower (see the module doc for the convention).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TowerFlops {
    pub patch_embed: f64,
    pub blocks: f64,
    pub attention: f64,
    pub merger: f64,
}

impl TowerFlops {
    /// The work of one image of patch grid `grid_thw` (`[frames, rows, columns]`).
    pub fn of(cfg: &VisionConfig, grid_thw: [u32; 3]) -> Self {
        let [frames, rows, cols] = grid_thw.map(f64::from);
        let per_frame = rows * cols;
        let n = frames * per_frame;
        let depth = cfg.depth as f64;
        let (h, inter) = (cfg.hidden_size as f64, cfg.intermediate_size as f64);
        let (m, out) = (cfg.merged_width() as f64, cfg.out_hidden_size as f64);
        let merged_rows = n / cfg.merge_unit() as f64;
        Self {
            patch_embed: 2.0 * n * cfg.patch_dim() as f64 * h,
            // qkv (h → 3h), proj (h → h), fc1 (h → inter), fc2 (inter → h).
            blocks: depth * 2.0 * n * (3.0 * h * h + h * h + 2.0 * h * inter),
            attention: depth * frames * 4.0 * per_frame * per_frame * h,
            merger: 2.0 * merged_rows * (m * m + m * out),
        }
    }

    pub fn total(&self) -> f64 {
        self.patch_embed + self.blocks + self.attention + self.merger
    }

    fn json(&self) -> Value {
        json!({
            "patch_embed": self.patch_embed, "blocks": self.blocks,
            "attention": self.attention, "merger": self.merger, "total": self.total(),
        })
    }
}

impl SplitMix {
    /// Uniform in `[-1, 1)`.
    fn signed(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// A deterministic RGB PNG of `size` (same `seed` and size, same bytes): per channel a gradient
/// of random direction and offset, plus uniform noise of ±32 levels on every sample.
pub fn synthetic_png(size: ImageSize, seed: u64) -> Result<Vec<u8>> {
    let (w, h) = (size.width as usize, size.height as usize);
    let mut rng = SplitMix(seed ^ (u64::from(size.width) << 32 | u64::from(size.height)));
    let gradients: Vec<[f32; 3]> = (0..3)
        .map(|_| {
            [
                rng.signed() * 160.0,
                rng.signed() * 160.0,
                128.0 + rng.signed() * 64.0,
            ]
        })
        .collect();
    let mut px = Vec::with_capacity(w * h * 3);
    for y in 0..h {
        let fy = y as f32 / h as f32 - 0.5;
        for x in 0..w {
            let fx = x as f32 / w as f32 - 0.5;
            let noise = rng.next();
            for (c, [gx, gy, base]) in gradients.iter().enumerate() {
                let n = ((noise >> (8 * c)) & 0x3f) as f32 - 32.0;
                px.push((base + gx * fx + gy * fy + n).clamp(0.0, 255.0) as u8);
            }
        }
    }
    let mut png = Vec::new();
    PngEncoder::new(&mut png)
        .write_image(&px, size.width, size.height, ExtendedColorType::Rgb8)
        .with_context(|| format!("encoding the {size} PNG"))?;
    Ok(png)
}

/// Runs the vision mode on the device of `bench`'s options.
pub(crate) fn run(bench: &mut Bench<'_>, sizes: &[ImageSize], source: &ModelSource) -> Result<()> {
    match bench.args.device {
        Device::Cpu => time_tower(bench, CpuBackend::new(), 0.0, sizes, source),
        Device::Cuda(ordinal) => {
            let (backend, start_s) = start_cuda(bench.args, ordinal)?;
            time_tower(bench, backend, start_s, sizes, source)
        }
    }
}

fn ms_since(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64() * 1e3
}

fn time_tower<B: VisionBackend>(
    bench: &mut Bench<'_>,
    backend: B,
    backend_start_s: f64,
    sizes: &[ImageSize],
    source: &ModelSource,
) -> Result<()> {
    let backend_name = backend.name();
    let adapter = source.multimodal_adapter.as_deref();
    let t0 = Instant::now();
    let tower = load_vision_tower(backend, &source.model_dir, adapter)
        .with_context(|| format!("loading the vision tower of {}", source.model_dir.display()))?;
    let load_s = t0.elapsed().as_secs_f64();
    eprintln!("[bench] {backend_name}: vision tower loaded (read, merge, upload) in {load_s:.2} s");
    let r = &mut bench.report;
    r.insert("backend".into(), json!(backend_name));
    r.insert("model_facts".into(), config_json(tower.config()));
    r.insert(
        "load".into(),
        json!({
            "backend_start_s": backend_start_s,
            "tower_load_s": load_s,
            "total_s": backend_start_s + load_s,
            "what": LOAD_WHAT,
        }),
    );
    r.insert("vision".into(), json!([]));
    r.insert("skipped".into(), json!([]));
    bench.save()?;

    let mut failed = Vec::new();
    for &size in sizes {
        if bench.over_budget() {
            eprintln!("[bench] vision {size} skipped: past --budget-s");
            push(&mut bench.report, "skipped", json!(size.to_string()));
            bench.save()?;
            continue;
        }
        match size_row(bench, &tower, size) {
            Ok(row) => push(&mut bench.report, "vision", Value::Object(row)),
            Err(e) => {
                eprintln!("[bench] vision {size} FAILED: {e:#}");
                failed.push(format!("{size} ({e:#})"));
                let row = json!({"name": size.to_string(), "width": size.width,
                                 "height": size.height, "error": format!("{e:#}")});
                push(&mut bench.report, "vision", row);
            }
        }
        bench.save()?;
    }
    bench.finish()?;
    ensure!(
        failed.is_empty(),
        "image sizes failed: {}",
        failed.join("; ")
    );
    Ok(())
}

fn config_json(c: &VisionConfig) -> Value {
    json!({
        "vision_depth": c.depth,
        "vision_hidden": c.hidden_size,
        "vision_heads": c.num_heads,
        "vision_intermediate": c.intermediate_size,
        "patch_size": c.patch_size,
        "temporal_patch_size": c.temporal_patch_size,
        "spatial_merge_size": c.spatial_merge_size,
        "out_hidden": c.out_hidden_size,
    })
}

/// Warm-up and timed runs of one image size; its report entry.
fn size_row<B: VisionBackend>(
    bench: &Bench<'_>,
    tower: &VisionTower<B>,
    size: ImageSize,
) -> Result<Map<String, Value>> {
    let args = bench.args;
    let png = synthetic_png(size, args.seed)?;
    let first = preprocess(&png, "image/png")
        .with_context(|| format!("preprocessing the {size} PNG ({} bytes)", png.len()))?;
    let (grid_thw, patches, image_tokens) =
        (first.grid_thw, first.patch_count(), first.image_tokens());
    let feature_values = image_tokens * tower.config().out_hidden_size;
    drop(first);
    // One run: preprocess, then encode its output as the server does (features left on the
    // device), then read them back; each time pushed to its own list.
    let run = |preprocess_ms: &mut Vec<f64>,
               encode_ms: &mut Vec<f64>,
               read_ms: &mut Vec<f64>|
     -> Result<()> {
        let t = Instant::now();
        let image = preprocess(&png, "image/png")?;
        preprocess_ms.push(ms_since(t));
        let input = image.tower_input();
        let t = Instant::now();
        let kept = tower.forward_kept(&[input])?;
        encode_ms.push(ms_since(t));
        let [kept] = kept.as_slice() else {
            anyhow::bail!("{} feature sets for one image", kept.len());
        };
        let t = Instant::now();
        let features = tower.features_on_host(kept)?;
        read_ms.push(ms_since(t));
        ensure!(
            features.len() == feature_values,
            "{} feature values, {image_tokens} image tokens need {feature_values}",
            features.len()
        );
        ensure!(
            features.iter().all(|v| v.is_finite()),
            "the tower's features are not all finite"
        );
        Ok(())
    };
    let (mut warm_pre, mut warm_enc, mut warm_read) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..args.warmup {
        run(&mut warm_pre, &mut warm_enc, &mut warm_read)?;
    }
    let wanted = args.runs.max(1);
    let (mut pre, mut enc, mut read) = (
        Vec::with_capacity(wanted),
        Vec::with_capacity(wanted),
        Vec::with_capacity(wanted),
    );
    let (_, cut, _) = bench.timed_runs(wanted, || run(&mut pre, &mut enc, &mut read))?;
    let (pre, enc, read) = (summarize(&pre), summarize(&enc), summarize(&read));
    let median = |s: &Value| s["median_ms"].as_f64().unwrap_or(f64::NAN);
    let (pre_median, enc_median, read_median) = (median(&pre), median(&enc), median(&read));
    let flops = TowerFlops::of(tower.config(), grid_thw);
    let tflops = flops.total() / (enc_median / 1e3) / 1e12;
    eprintln!(
        "[bench] vision {size}: preprocess median {pre_median:.3} ms, encode median \
         {enc_median:.3} ms ({tflops:.3} TFLOP/s), features read back median {read_median:.3} ms"
    );
    let mut out = Map::new();
    out.insert("name".into(), json!(size.to_string()));
    out.insert("width".into(), json!(size.width));
    out.insert("height".into(), json!(size.height));
    out.insert("png_bytes".into(), json!(png.len()));
    out.insert("grid_thw".into(), json!(grid_thw));
    out.insert("patches".into(), json!(patches));
    out.insert("image_tokens".into(), json!(image_tokens));
    out.insert(
        "warmup_ms".into(),
        json!({"preprocess": warm_pre, "encode": warm_enc, "read_back": warm_read}),
    );
    out.insert("runs_requested".into(), json!(wanted));
    out.insert("cut_by_max_row_s".into(), json!(cut));
    out.insert("preprocess".into(), pre);
    out.insert("encode".into(), enc);
    out.insert("read_back".into(), read);
    out.insert("flops".into(), flops.json());
    out.insert("achieved_TFLOPs".into(), json!(tflops));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Qwen3.5-4B's vision config (`tools/reference/real_common.py`).
    fn real_vision_config() -> VisionConfig {
        VisionConfig::from_json(&json!({
            "depth": 24, "hidden_size": 1024, "num_heads": 16, "intermediate_size": 4096,
            "out_hidden_size": 2560, "num_position_embeddings": 2304, "in_channels": 3,
            "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2,
            "hidden_act": "gelu_pytorch_tanh",
        }))
        .unwrap()
    }

    #[test]
    fn tower_flops_of_a_1024_square_screenshot() {
        let cfg = real_vision_config();
        // 1024x1024 is a 64x64 patch grid: 4096 patches, 1024 merged rows.
        let f = TowerFlops::of(&cfg, [1, 64, 64]);
        assert_eq!(f.patch_embed, 2.0 * 4096.0 * 1536.0 * 1024.0);
        // Per block 12,582,912 multiply-accumulates a patch (3·1024² + 1024² + 2·1024·4096).
        assert_eq!(f.blocks, 24.0 * 2.0 * 4096.0 * 12_582_912.0);
        assert_eq!(f.attention, 24.0 * 4.0 * 4096.0 * 4096.0 * 1024.0);
        assert_eq!(f.merger, 2.0 * 1024.0 * (4096.0 * 4096.0 + 4096.0 * 2560.0));
        // The GEMMs do 2 FLOPs per weight-matrix parameter per row that reads it: 1,572,864
        // (patch) + 301,989,888 (blocks) per patch, 27,262,976 (merger) per merged row.
        let per_patch = 1_572_864.0 + 301_989_888.0;
        assert_eq!(
            f.patch_embed + f.blocks + f.merger,
            2.0 * (4096.0 * per_patch + 1024.0 * 27_262_976.0)
        );
        assert!((f.total() / 1e12 - 4.19).abs() < 0.01, "{}", f.total());
        // Attention is per frame: two frames of 32x64 attend half as much as one of 64x64, and
        // everything else is the same.
        let two = TowerFlops::of(&cfg, [2, 32, 64]);
        assert_eq!(two.attention * 2.0, f.attention);
        assert_eq!(
            (two.patch_embed, two.blocks, two.merger),
            (f.patch_embed, f.blocks, f.merger)
        );
    }

    #[test]
    fn image_sizes_parse_and_print_back() {
        let s: ImageSize = "1024x768".parse().unwrap();
        assert_eq!(
            s,
            ImageSize {
                width: 1024,
                height: 768
            }
        );
        assert_eq!(s.to_string(), "1024x768");
        for bad in [
            "", "1024", "x768", "1024x", "0x10", "10x0", "10X10", "axb", "-1x5", "1x2x3",
        ] {
            let e = bad.parse::<ImageSize>().unwrap_err();
            assert!(e.contains("expected WxH"), "{bad}: {e}");
        }
    }

    #[test]
    fn synthetic_pngs_are_deterministic_noisy_rgb() {
        let size = ImageSize {
            width: 300,
            height: 200,
        };
        let png = synthetic_png(size, 7).unwrap();
        assert_eq!(png, synthetic_png(size, 7).unwrap());
        assert_ne!(png, synthetic_png(size, 8).unwrap());
        let img = image::load_from_memory_with_format(&png, image::ImageFormat::Png).unwrap();
        assert_eq!((img.width(), img.height()), (300, 200));
        assert_eq!(img.color(), image::ColorType::Rgb8);
        // The noise keeps it from compressing well: over 60% of the raw bytes.
        assert!(png.len() * 10 > 300 * 200 * 3 * 6, "{} bytes", png.len());
        let pre = preprocess(&png, "image/png").unwrap();
        assert_eq!(pre.patch_count(), pre.image_tokens() * 4);
    }
}
