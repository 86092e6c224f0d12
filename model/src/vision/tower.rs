//! The vision tower's forward pass over the [`VisionBackend`] ops: patch embedding, learned
//! position embedding, 2-D rotary, pre-LN ViT blocks with full attention within each frame, and
//! the 2×2 patch merger. Buffers are sized per call (a reference path, not a serving one).

use anyhow::{anyhow, ensure, Context, Result};
use instinct_kernels::backend::{Gelu, VisionBackend};
use instinct_kernels::patches::{
    PatchImage, PatchRows, CHANNELS, MERGE_SIZE, PATCH_SIZE, TEMPORAL_PATCH_SIZE,
};
use instinct_kernels::{GemmShape, RowNorm, Varlen};

use super::config::{VisionConfig, VISION_LAYER_NORM_EPS};
use super::grid::{add_position_embedding, patch_coords};
use super::weights::{LinearWeights, NormWeights, VisionWeights};

use crate::values::Values;

/// One image: its resized RGB bytes (rows top to bottom, R, G, B interleaved, `16·w` wide and
/// `16·h` high, as preprocessing leaves it) and its patch grid `[1, h, w]` (one frame). The tower's
/// backend packs its `pixel_values` rows from the bytes
/// ([`VisionBackend::write_patch_rows`]).
#[derive(Clone, Copy, Debug)]
pub struct ImageInput<'a> {
    pub rgb: &'a [u8],
    pub grid_thw: [u32; 3],
}

impl<'a> ImageInput<'a> {
    /// The image as the backend packs it.
    fn patch_image(&self) -> PatchImage<'a> {
        let [_, h, w] = self.grid_thw.map(|v| v as usize);
        PatchImage::new(self.rgb, w * PATCH_SIZE, h * PATCH_SIZE)
    }
}

struct Linear<B: VisionBackend> {
    weight: B::Buf,
    bias: B::Buf,
    in_dim: usize,
    out_dim: usize,
}

/// A Linear whose output is added to the residual stream (a block's proj and fc2).
struct ResidualLinear<B: VisionBackend> {
    linear: Linear<B>,
    /// The bias in f32 (`linear.bias` is in the backend's weight precision): what a GEMM adding
    /// it in its epilogue to the f32 residual reads.
    bias_f32: B::Buf,
}

struct Norm<B: VisionBackend> {
    weight: B::Buf,
    bias: B::Buf,
}

struct Block<B: VisionBackend> {
    norm1: Norm<B>,
    qkv: Linear<B>,
    proj: ResidualLinear<B>,
    norm2: Norm<B>,
    fc1: Linear<B>,
    fc2: ResidualLinear<B>,
}

/// Resampled position tables kept on the device: the last few image grids seen.
const POSITION_TABLES_KEPT: usize = 4;

/// The vision tower on a backend.
pub struct VisionTower<B: VisionBackend> {
    backend: B,
    cfg: VisionConfig,
    /// Kept on the host: it is resampled per image grid.
    pos_embed: Vec<f32>,
    /// The resampled table (`[patches, hidden]`, block order) of recent grids, newest last: an
    /// agent's screenshots mostly share one size, so it is computed and uploaded once.
    positions: std::sync::Mutex<Vec<([u32; 3], B::Buf)>>,
    patch_embed: Linear<B>,
    blocks: Vec<Block<B>>,
    merger_norm: Norm<B>,
    merger_fc1: Linear<B>,
    merger_fc2: Linear<B>,
}

impl<B: VisionBackend> VisionTower<B> {
    /// The backend the tower runs on.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Uploads `weights` (already adapter-merged, shapes checked at load).
    pub fn new(backend: B, cfg: &VisionConfig, weights: &VisionWeights) -> Result<Self> {
        // The backend packs patch rows of one geometry: the Qwen3.5 processor's.
        let geometry = (
            cfg.in_channels,
            cfg.temporal_patch_size,
            cfg.patch_size,
            cfg.spatial_merge_size,
        );
        ensure!(
            geometry == (CHANNELS, TEMPORAL_PATCH_SIZE, PATCH_SIZE, MERGE_SIZE),
            "vision channels, temporal patch, patch and merge sizes {geometry:?}: the tower packs \
             patch rows of ({CHANNELS}, {TEMPORAL_PATCH_SIZE}, {PATCH_SIZE}, {MERGE_SIZE}) only"
        );
        ensure!(
            weights.blocks.len() == cfg.depth,
            "vision weights have {} blocks, the config says {}",
            weights.blocks.len(),
            cfg.depth
        );
        let up = |data: &[f32]| backend.upload(data).map_err(|e| anyhow!(e));
        let up_f32 = |data: &[f32]| {
            let mut buf = backend.alloc(data.len())?;
            backend.write(&mut buf, data).map(|()| buf)
        };
        let linear = |w: &LinearWeights| -> Result<Linear<B>> {
            ensure!(w.weight.shape.len() == 2, "linear weight is not 2-D");
            Ok(Linear {
                weight: up(&w.weight.data)?,
                bias: up(&w.bias.data)?,
                in_dim: w.weight.shape[1],
                out_dim: w.weight.shape[0],
            })
        };
        let residual_linear = |w: &LinearWeights| -> Result<ResidualLinear<B>> {
            Ok(ResidualLinear {
                linear: linear(w)?,
                bias_f32: up_f32(&w.bias.data).map_err(|e| anyhow!(e))?,
            })
        };
        let norm = |n: &NormWeights| -> Result<Norm<B>> {
            Ok(Norm {
                weight: up(&n.weight.data)?,
                bias: up(&n.bias.data)?,
            })
        };
        let blocks = weights
            .blocks
            .iter()
            .map(|b| {
                Ok(Block {
                    norm1: norm(&b.norm1)?,
                    qkv: linear(&b.qkv)?,
                    proj: residual_linear(&b.proj)?,
                    norm2: norm(&b.norm2)?,
                    fc1: linear(&b.fc1)?,
                    fc2: residual_linear(&b.fc2)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            patch_embed: linear(&weights.patch_embed)?,
            merger_norm: norm(&weights.merger_norm)?,
            merger_fc1: linear(&weights.merger_fc1)?,
            merger_fc2: linear(&weights.merger_fc2)?,
            pos_embed: weights.pos_embed.data.clone(),
            positions: std::sync::Mutex::new(Vec::new()),
            blocks,
            cfg: cfg.clone(),
            backend,
        })
    }

    pub fn config(&self) -> &VisionConfig {
        &self.cfg
    }

    /// Image features of each image (`[t·h·w / merge², out_hidden]`, row-major), in order, from
    /// one pass over all of them: their patch rows packed back to back, attention within each
    /// frame of each image, every other op row by row. An image's features do not depend on the
    /// others in the pass (the same bits alone or beside them, where the backend's GEMMs are
    /// batch-invariant).
    pub fn forward(&self, images: &[ImageInput<'_>]) -> Result<Vec<Vec<f32>>> {
        let be = &self.backend;
        let e = |err| anyhow!("{}: {err}", be.name());
        let Some((features, rows)) = self.forward_checked(images)? else {
            return Ok(Vec::new());
        };
        let width = self.cfg.out_hidden_size;
        let all = be
            .read(&features, rows.iter().sum::<usize>() * width)
            .map_err(e)?;
        if images.len() == 1 {
            return Ok(vec![all]);
        }
        // Each image's merged rows follow the previous image's.
        let mut rest = all.as_slice();
        Ok(rows
            .iter()
            .map(|&r| {
                let (mine, after) = rest.split_at(r * width);
                rest = after;
                mine.to_vec()
            })
            .collect())
    }

    /// [`Self::forward`], each image's features left in a buffer of the backend (device memory on
    /// a GPU: a language copy on the same device places them without a trip through the host).
    /// Returns once they are written, so that another backend's ops may read them.
    pub fn forward_kept(&self, images: &[ImageInput<'_>]) -> Result<Vec<Values>> {
        let be = &self.backend;
        let e = |err| anyhow!("{}: {err}", be.name());
        let t0 = std::time::Instant::now();
        let Some((features, rows)) = self.forward_checked(images)? else {
            return Ok(Vec::new());
        };
        let width = self.cfg.out_hidden_size;
        let kept = if let [rows] = rows[..] {
            vec![Values::in_buffer(rows * width, features)]
        } else {
            // One buffer per image, so that each is freed with the last question holding it.
            let mut at = 0;
            rows.iter()
                .map(|&r| {
                    let len = r * width;
                    let mut own = be.alloc(len).map_err(e)?;
                    be.copy(&features, at, &mut own, 0, len).map_err(e)?;
                    at += len;
                    Ok(Values::in_buffer(len, own))
                })
                .collect::<Result<Vec<_>>>()?
        };
        be.synchronize().map_err(e)?;
        tracing::debug!(
            images = images.len(),
            ms = t0.elapsed().as_secs_f64() * 1e3,
            "vision pass done (features kept)"
        );
        Ok(kept)
    }

    /// Features that [`Self::forward_kept`] left in a buffer of this tower's backend (or any on
    /// the host), read back (for tests and tools).
    pub fn features_on_host(&self, features: &Values) -> Result<Vec<f32>> {
        if let Some(host) = features.as_host() {
            return Ok(host.to_vec());
        }
        let be = &self.backend;
        let buf = features
            .buffer::<B::Buf>()
            .filter(|buf| be.can_read(buf))
            .with_context(|| format!("features held by another backend than {}", be.name()))?;
        be.read(buf, features.len())
            .map_err(|err| anyhow!("{}: {err}", be.name()))
    }

    /// The features of `images`, packed in one buffer, with each image's row count (`None` for no
    /// image), once their bytes are checked against their grids.
    fn forward_checked(&self, images: &[ImageInput<'_>]) -> Result<Option<(B::Buf, Vec<usize>)>> {
        let merge = self.cfg.spatial_merge_size;
        let coords = images
            .iter()
            .enumerate()
            .map(|(i, image)| {
                let coords =
                    patch_coords(image.grid_thw, merge).with_context(|| format!("image {i}"))?;
                let [t, h, w] = image.grid_thw;
                ensure!(
                    t == 1,
                    "image {i}: grid {:?} has {t} frames, not one",
                    image.grid_thw
                );
                let need = h as usize * w as usize * PATCH_SIZE * PATCH_SIZE * CHANNELS;
                ensure!(
                    image.rgb.len() == need,
                    "image {i}: {} bytes, grid {:?} needs {need} ({}x{} RGB)",
                    image.rgb.len(),
                    image.grid_thw,
                    w as usize * PATCH_SIZE,
                    h as usize * PATCH_SIZE
                );
                Ok(coords)
            })
            .collect::<Result<Vec<_>>>()?;
        if images.is_empty() {
            return Ok(None);
        }
        let features = self.forward_packed(images, &coords)?;
        let unit = self.cfg.merge_unit();
        Ok(Some((
            features,
            coords.iter().map(|c| c.len() / unit).collect(),
        )))
    }

    fn linear(&self, x: &B::Buf, l: &Linear<B>, rows: usize, y: &mut B::Buf) -> Result<()> {
        self.product(x, l, rows, y)?;
        self.backend
            .add_bias(y, &l.bias, rows, l.out_dim)
            .map_err(|e| anyhow!(e))
    }

    /// `residual += x Wᵀ + bias` (`scratch`: `[rows, out_dim]` f32, for a backend that adds the
    /// bias and the product to `residual` apart from the GEMM).
    fn add_linear(
        &self,
        x: &B::Buf,
        l: &ResidualLinear<B>,
        rows: usize,
        (scratch, residual): (&mut B::Buf, &mut B::Buf),
    ) -> Result<()> {
        let ResidualLinear { linear, bias_f32 } = l;
        let shape = GemmShape::new(rows, linear.in_dim, linear.out_dim);
        let weights = (&linear.weight, &linear.bias, bias_f32);
        self.backend
            .gemm_bias_residual(x, weights, shape, scratch, residual)
            .map_err(|e| anyhow!(e))
    }

    /// `x Wᵀ` of a Linear without its bias (the op after it adds the bias in its own pass).
    fn product(&self, x: &B::Buf, l: &Linear<B>, rows: usize, y: &mut B::Buf) -> Result<()> {
        self.backend
            .gemm(x, &l.weight, GemmShape::new(rows, l.in_dim, l.out_dim), y)
            .map_err(|e| anyhow!(e))
    }

    /// Adds each image's position table (its grid, patches at `coords[i]`, its rows packed after
    /// the previous images') to `hidden`, from the kept tables or resampled on the host and kept.
    /// One image adds its table in place; several are first copied side by side.
    fn add_positions(
        &self,
        images: &[ImageInput<'_>],
        coords: &[Vec<(usize, usize)>],
        hidden: &mut B::Buf,
    ) -> Result<()> {
        let be = &self.backend;
        let e = |err| anyhow!("{}: {err}", be.name());
        let h = self.cfg.hidden_size;
        let total: usize = coords.iter().map(|c| c.len() * h).sum();
        let mut kept = self
            .positions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut packed = if images.len() > 1 {
            Some(be.alloc(total).map_err(e)?)
        } else {
            None
        };
        let mut at = 0;
        for (image, coords) in images.iter().zip(coords) {
            let (grid, len) = (image.grid_thw, coords.len() * h);
            if let Some(i) = kept.iter().position(|(g, _)| *g == grid) {
                let entry = kept.remove(i);
                kept.push(entry);
            } else {
                // 0 + s is s exactly: the table alone, then one add on the device.
                let mut table = vec![0.0f32; len];
                let [_, gh, gw] = grid.map(|v| v as usize);
                add_position_embedding(
                    &mut table,
                    coords,
                    (gh, gw),
                    &self.pos_embed,
                    self.cfg.grid_side(),
                    h,
                )?;
                let mut buf = be.alloc(len).map_err(e)?;
                be.write(&mut buf, &table).map_err(e)?;
                if kept.len() >= POSITION_TABLES_KEPT {
                    kept.remove(0);
                }
                kept.push((grid, buf));
            }
            let (_, table) = kept.last().expect("pushed above");
            match packed.as_mut() {
                Some(packed) => be.copy(table, 0, packed, at, len).map_err(e)?,
                None => return be.add_in_place(hidden, table, len).map_err(e),
            }
            at += len;
        }
        let packed = packed.expect("several images");
        be.add_in_place(hidden, &packed, total).map_err(e)
    }

    /// The packed features (`[Σ tokens, out_hidden]`) of images whose patches (`coords[i]`) were
    /// checked against their bytes.
    fn forward_packed(
        &self,
        images: &[ImageInput<'_>],
        coords: &[Vec<(usize, usize)>],
    ) -> Result<B::Buf> {
        let cfg = &self.cfg;
        let be = &self.backend;
        let e = |err| anyhow!("{}: {err}", be.name());
        let (h, d, heads) = (cfg.hidden_size, cfg.head_dim(), cfg.num_heads);
        let n: usize = coords.iter().map(Vec::len).sum();

        // Patch embedding (the stride-equals-kernel Conv3d is a Linear over each patch row),
        // then the resampled learned position table added (one f32 add per value, as on the
        // host).
        // The GEMM reads its input in its operand precision, as a bf16 model's conv does: the
        // backend packs each image's rows from its u8 bytes straight into that buffer (on a GPU
        // the bytes go up and a kernel packs and rounds them: the same bits as the GEMM rounding
        // the f32 rows), each image's rows after the previous image's.
        let t0 = std::time::Instant::now();
        let mut pixels = be.alloc_gemm_input(n * cfg.patch_dim()).map_err(e)?;
        let mut first_row = 0;
        let parts: Vec<PatchRows<'_>> = images
            .iter()
            .zip(coords)
            .map(|(image, coords)| {
                let part = PatchRows {
                    image: image.patch_image(),
                    first_row,
                };
                first_row += coords.len();
                part
            })
            .collect();
        be.write_patch_rows(&mut pixels, &parts).map_err(e)?;
        let pixels_ms = t0.elapsed().as_secs_f64() * 1e3;
        let mut hidden = be.alloc(n * h).map_err(e)?;
        self.linear(&pixels, &self.patch_embed, n, &mut hidden)?;
        self.add_positions(images, coords, &mut hidden)?;

        let flat_coords: Vec<u32> = coords
            .iter()
            .flatten()
            .flat_map(|&(r, c)| [r as u32, c as u32])
            .collect();
        let mut positions = be.alloc_idx(2 * n).map_err(e)?;
        be.write_idx(&mut positions, &flat_coords).map_err(e)?;
        // One attention segment per frame of each image.
        let mut cu = vec![0u32];
        for image in images {
            let [t, gh, gw] = image.grid_thw.map(|v| v as usize);
            for _ in 0..t {
                cu.push(cu[cu.len() - 1] + (gh * gw) as u32);
            }
        }
        let t = cu.len() - 1;
        ensure!(
            cu[t] as usize == n,
            "frames of {} patches for {n} patches",
            cu[t]
        );
        let mut cu_seqlens = be.alloc_idx(t + 1).map_err(e)?;
        be.write_idx(&mut cu_seqlens, &cu).map_err(e)?;

        // Only GEMMs read the LayerNorms' output: in their operand precision.
        let mut normed = be.alloc_gemm_input(n * h).map_err(e)?;
        let mut qkv = be.alloc(n * 3 * h).map_err(e)?;
        // Only the proj GEMM reads the attention's output: in its operand precision.
        let mut attn = be.alloc_gemm_input(n * h).map_err(e)?;
        let mut out = be.alloc(n * h).map_err(e)?;
        let mut mlp = be.alloc(n * cfg.intermediate_size).map_err(e)?;
        // fc2's input: GELU(fc1 + bias) in the GEMM's operand precision.
        let mut mlp_in = be.alloc_gemm_input(n * cfg.intermediate_size).map_err(e)?;
        let scale = (d as f64).powf(-0.5) as f32;
        // Every LayerNorm of the tower runs over the n patch rows of width h.
        let layer_norm = |x: &B::Buf, norm: &Norm<B>, out: &mut B::Buf| {
            let row_norm = RowNorm {
                weight: &norm.weight,
                rows: n,
                dim: h,
                eps: VISION_LAYER_NORM_EPS,
            };
            be.layer_norm(x, row_norm, &norm.bias, out).map_err(e)
        };
        for (i, block) in self.blocks.iter().enumerate() {
            let ctx = || format!("vision block {i}");
            layer_norm(&hidden, &block.norm1, &mut normed)?;
            // The qkv bias and the rotary go in with the attention (on a GPU as its inputs are
            // written: one pass over qkv).
            self.product(&normed, &block.qkv, n, &mut qkv)
                .with_context(ctx)?;
            let batch = Varlen {
                cu_seqlens: &cu_seqlens,
                num_seqs: t,
                rows: n,
            };
            be.bias_rope_attention(
                (&mut qkv, &block.qkv.bias),
                (&positions, cfg.rope_theta),
                batch,
                (heads, d, scale),
                &mut attn,
            )
            .map_err(e)?;
            // Each bias goes in with its product's output (on a GPU in the GEMM's epilogue, the
            // residual's adds too): no pass of its own.
            self.add_linear(&attn, &block.proj, n, (&mut out, &mut hidden))
                .with_context(ctx)?;

            layer_norm(&hidden, &block.norm2, &mut normed)?;
            let fc1 = GemmShape::new(n, block.fc1.in_dim, block.fc1.out_dim);
            let weights = (&block.fc1.weight, &block.fc1.bias);
            be.gemm_bias_gelu(&normed, weights, fc1, Gelu::Tanh, (&mut mlp, &mut mlp_in))
                .map_err(e)
                .with_context(ctx)?;
            self.add_linear(&mlp_in, &block.fc2, n, (&mut out, &mut hidden))
                .with_context(ctx)?;
        }

        // Merger: LayerNorm per patch; the merge² patches of a block are consecutive rows, so the
        // [n, h] buffer read as [n / merge², merge²·h] is their concatenation in block order.
        let tokens = n / cfg.merge_unit();
        let m = cfg.merged_width();
        layer_norm(&hidden, &self.merger_norm, &mut normed)?;
        let mut merged = be.alloc(tokens * m).map_err(e)?;
        let mut merged_in = be.alloc_gemm_input(tokens * m).map_err(e)?;
        self.product(&normed, &self.merger_fc1, tokens, &mut merged)?;
        be.bias_gelu(
            &mut merged,
            &self.merger_fc1.bias,
            (tokens, m),
            Gelu::Erf,
            &mut merged_in,
        )
        .map_err(e)?;
        let mut features = be.alloc(tokens * cfg.out_hidden_size).map_err(e)?;
        self.linear(&merged_in, &self.merger_fc2, tokens, &mut features)?;
        // Where a pass's host time goes: writing the patch rows (on the CPU packing them; on a GPU
        // staging the bytes and queueing their copy and the packing kernel), then queueing the
        // ops (on a GPU they run meanwhile; the caller waits for the rest).
        tracing::debug!(
            patches = n,
            pixels_ms,
            queued_ms = t0.elapsed().as_secs_f64() * 1e3,
            "vision pass queued"
        );
        Ok(features)
    }
}
