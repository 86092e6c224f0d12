//! The vision tower's ops (`kernels/cuda/vision.cu`): the patch rows from u8 images, LayerNorm,
//! the bias and residual adds, GELU, 2-D axial rotary and bidirectional attention within each
//! segment (on the flash kernel's bidirectional form where it takes the head size). Activations
//! are f32 buffers from `alloc` (the tower allocates every one so), weights and biases bf16 from
//! `upload`.

use cudarc::driver::{
    CudaEvent, CudaSlice, DeviceRepr, LaunchConfig, PinnedHostSlice, PushKernelArg,
};
use rayon::prelude::*;

use super::super::buffers::{act, act_mut, idx, out_buf, weight, CudaBuf, OutBuf};
use super::super::device::driver_err;
use super::super::launch::{linear, per_row, to_i32, to_u32, Gpu, BLOCK};
use super::flash_attention::{flash_bidirectional, flash_variant, RawQkv};
use super::shared::{check_batch, opt_in_smem};
use crate::backend::{Gelu, HeadLayout, KernelResult, RowNorm, Varlen};
use crate::error::KernelError;
use crate::patches::{check_patch_rows, PatchRows};

/// Values per thread of the LayerNorm variants (256 threads per row), with an f32 and a bf16
/// output; the last also runs longer rows.
const LAYER_NORM: [(usize, &str, &str); 3] = [
    (4, "layer_norm_h4", "layer_norm_bf16_h4"),
    (8, "layer_norm_h8", "layer_norm_bf16_h8"),
    (16, "layer_norm_h16", "layer_norm_bf16_h16"),
];

/// Frequencies the rotary kernel's by-value table holds (`AXIAL_MAX_FREQS` in vision.cu): `head_dim
/// / 4` of them.
const AXIAL_MAX_FREQS: usize = 64;

/// The attention kernel's shape (`BIDIR_*` in vision.cu): threads, query rows and keys per block.
const BIDIR_THREADS: u32 = 128;
const BIDIR_ROWS: usize = 16;
const BIDIR_KEYS: usize = 32;
/// The attention kernels by the largest head each takes (32 lanes × the values per lane).
const BIDIR: [(usize, &str); 3] = [
    (64, "attention_bidirectional_e2"),
    (128, "attention_bidirectional_e4"),
    (256, "attention_bidirectional_e8"),
];
/// Dynamic shared memory a kernel may use without opting in.
const DEFAULT_SMEM: usize = 48 * 1024;
/// Blocks of a grid's y dimension (the attention's heads).
const GRID_Y_MAX: usize = 65_535;

/// `u64`s per image in the table the patch kernel reads (`PATCH_TABLE` in vision.cu).
const PATCH_TABLE: usize = 5;
/// Threads per patch row of the patch kernel (`PATCH_THREADS`): one per (channel, frame, pixel
/// row), each writing 16 values.
const PATCH_THREADS: usize = 96;
/// Bytes each core copies into the staging buffer at a time.
const STAGE_CHUNK: usize = 1 << 18;

/// What [`write_patch_rows`] keeps between calls, grown to the largest call and never shrunk: the
/// pinned host buffer the table and the images' bytes are staged in, the event after the copy that
/// last read it, and the device buffer they are copied into.
#[derive(Default)]
pub(crate) struct PatchStaging {
    host: Option<PinnedHostSlice<u8>>,
    copied: Option<CudaEvent>,
    device: Option<CudaSlice<u8>>,
}

/// [`crate::backend::VisionBackend::write_patch_rows`]: the parts checked, a table of the images
/// and their RGB bytes staged in pinned memory by every core and copied up in one asynchronous
/// copy (a byte per pixel channel: a quarter of the bf16 rows' bytes), then one launch packs every
/// image's rows (`patch_rows_*`). Returns once queued; only a later call waits, for this copy,
/// before it reuses the staging buffer.
pub(crate) fn write_patch_rows(
    gpu: &Gpu,
    staging: &mut PatchStaging,
    dst: &mut CudaBuf,
    parts: &[PatchRows<'_>],
) -> KernelResult<()> {
    const OP: &str = "write_patch_rows";
    check_patch_rows(OP, parts, dst.len())?;
    let parts: Vec<&PatchRows<'_>> = parts.iter().filter(|p| p.image.patches() > 0).collect();
    let Some(longest) = parts.iter().map(|p| p.image.patches()).max() else {
        return Ok(());
    };
    gpu.workspace.capture.refuse(OP)?;
    let err = |e| driver_err(OP, e);
    // The table first, then each image from a 16-byte boundary (the kernel's loads are 16 bytes).
    let mut table = Vec::with_capacity(PATCH_TABLE * parts.len());
    let mut starts = Vec::with_capacity(parts.len());
    let mut total = (8 * PATCH_TABLE * parts.len()).next_multiple_of(16);
    for p in &parts {
        let (_, grid_w) = p.image.grid();
        let row = [total, p.image.width, grid_w, p.image.patches(), p.first_row];
        table.extend(row.map(|v| v as u64));
        starts.push(total);
        total = (total + p.image.rgb.len()).next_multiple_of(16);
    }
    let cfg = LaunchConfig {
        grid_dim: (
            to_u32(
                OP,
                "grid size",
                (longest * PATCH_THREADS).div_ceil(BLOCK as usize),
            )?,
            to_u32(OP, "images", parts.len())?,
            1,
        ),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    if cfg.grid_dim.1 > u16::MAX as u32 {
        return Err(KernelError::invalid(
            OP,
            format!("{} images exceed {}", parts.len(), u16::MAX),
        ));
    }

    // The previous call's copy must be done reading the host buffer before it is rewritten or
    // freed.
    if let Some(copied) = &staging.copied {
        copied.synchronize().map_err(err)?;
    }
    if staging.host.as_ref().is_none_or(|h| h.len() < total) {
        staging.host = None;
        // SAFETY: only the `total` bytes written below are ever read.
        let host = unsafe { gpu.device.ctx.alloc_pinned::<u8>(total.next_power_of_two()) };
        staging.host = Some(host.map_err(err)?);
    }
    let stream = &gpu.device.stream;
    let held = staging.device.as_ref().map_or(0, |d| d.len());
    if held < total {
        // Stream-ordered: a launch still reading the old buffer is unaffected by its release.
        let grown = stream
            .alloc_zeros::<u8>(total.next_power_of_two())
            .map_err(err)?;
        gpu.workspace.add_bytes((grown.len() - held) as u64);
        staging.device = Some(grown);
    }
    let host = &mut staging
        .host
        .as_mut()
        .expect("allocated above")
        .as_mut_slice()
        .map_err(err)?[..total];
    let (head, mut rest) = host.split_at_mut(starts[0]);
    for (out, v) in head.chunks_exact_mut(8).zip(&table) {
        out.copy_from_slice(&v.to_le_bytes());
    }
    // Each image's bytes, in chunks copied by all cores.
    let mut chunks = Vec::new();
    let mut at = starts[0];
    for (p, &start) in parts.iter().zip(&starts) {
        let (_, tail) = rest.split_at_mut(start - at);
        let (mine, after) = tail.split_at_mut(p.image.rgb.len());
        chunks.extend(
            mine.chunks_mut(STAGE_CHUNK)
                .zip(p.image.rgb.chunks(STAGE_CHUNK)),
        );
        at = start + p.image.rgb.len();
        rest = after;
    }
    chunks
        .into_par_iter()
        .for_each(|(out, src)| out.copy_from_slice(src));
    let device = staging.device.as_mut().expect("allocated above");
    // From a plain slice of pinned memory the copy is asynchronous; the event marks its end.
    stream
        .memcpy_htod(&*host, &mut device.slice_mut(..total))
        .map_err(err)?;
    match &staging.copied {
        Some(copied) => copied.record(stream).map_err(err)?,
        None => staging.copied = Some(stream.record_event(None).map_err(err)?),
    }

    let staged: &CudaSlice<u8> = device;
    let mut out = out_buf(OP, "dst", dst, 0)?;
    let kernel = if out.is_bf16() {
        "patch_rows_bf16"
    } else {
        "patch_rows_f32"
    };
    // SAFETY: argument types match the kernel (out's element type picks it); the staged buffer
    // holds the table and every image's bytes where the table says (widths and grids checked), and
    // every image's rows fit `dst` (check_patch_rows).
    unsafe {
        gpu.launch(OP, kernel, cfg, |launch| {
            launch.arg(staged);
            out.push(launch);
        })
    }
}

/// The rotary kernels' by-value frequency table (`AxialFreqs` in prelude.cuh).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct AxialFreqs {
    inv_freq: [f32; AXIAL_MAX_FREQS],
}

impl AxialFreqs {
    /// The reference's `head_dim / 4` inverse frequencies, bit for bit (f32 powf on the host), or
    /// why the kernels cannot rotate heads of `head_dim`.
    fn new(op: &'static str, head_dim: usize, theta: f32) -> KernelResult<Self> {
        if !head_dim.is_multiple_of(4) || head_dim / 4 > AXIAL_MAX_FREQS {
            return Err(KernelError::invalid(
                op,
                format!(
                    "head_dim {head_dim} must be a multiple of 4 up to {}",
                    4 * AXIAL_MAX_FREQS
                ),
            ));
        }
        let (half, quarter) = (head_dim / 2, head_dim / 4);
        let mut freqs = Self {
            inv_freq: [0.0; AXIAL_MAX_FREQS],
        };
        for (i, f) in freqs.inv_freq[..quarter].iter_mut().enumerate() {
            *f = 1.0 / theta.powf((2 * i) as f32 / half as f32);
        }
        Ok(freqs)
    }
}

// SAFETY: plain `repr(C)` data with the same layout as the CUDA struct.
unsafe impl DeviceRepr for AxialFreqs {}

/// Threads of a bias kernel over `n` values in rows of `dim` (`VEC_OF` in vision.cu): four values
/// each where `dim` is a multiple of 4 (every buffer from `alloc` starts 16-byte aligned), else one.
fn per_thread(n: usize, dim: usize) -> usize {
    if dim.is_multiple_of(4) {
        n / 4
    } else {
        n
    }
}

/// The LayerNorm kernel for rows of `dim`: the smallest variant holding the row in registers,
/// writing bf16 or f32.
fn layer_norm_kernel(dim: usize, bf16_out: bool) -> &'static str {
    let held = LAYER_NORM.iter().find(|(h, ..)| h * BLOCK as usize >= dim);
    let (_, f32_out, bf16) = held.unwrap_or(&LAYER_NORM[LAYER_NORM.len() - 1]);
    if bf16_out {
        bf16
    } else {
        f32_out
    }
}

/// The attention kernel for heads of `head_dim` (`None` above 256).
fn bidir_kernel(head_dim: usize) -> Option<&'static str> {
    BIDIR
        .iter()
        .find(|(max, _)| head_dim <= *max)
        .map(|(_, name)| *name)
}

/// Dynamic shared memory of the attention kernel: the block's queries, a key tile (rows of odd
/// stride) and a value tile, in f32.
fn bidir_smem_bytes(head_dim: usize) -> usize {
    4 * (BIDIR_ROWS * head_dim + BIDIR_KEYS * (head_dim | 1) + BIDIR_KEYS * head_dim)
}

pub(crate) fn layer_norm(
    gpu: &Gpu,
    x: &CudaBuf,
    norm: RowNorm<'_, CudaBuf>,
    bias: &CudaBuf,
    out: &mut CudaBuf,
) -> KernelResult<()> {
    const OP: &str = "layer_norm";
    let RowNorm { rows, dim, eps, .. } = norm;
    if dim == 0 {
        return Err(KernelError::invalid(OP, "dim is 0"));
    }
    let x = act(OP, "x", x, rows * dim)?;
    let w = weight(OP, "weight", norm.weight, dim)?;
    let b = weight(OP, "bias", bias, dim)?;
    let mut out = out_buf(OP, "out", out, rows * dim)?;
    if rows == 0 {
        return Ok(());
    }
    let dim_a = to_i32(OP, "dim", dim)?;
    let kernel = layer_norm_kernel(dim, out.is_bf16());
    // SAFETY: argument types match the kernel (out's element type picks it); x and out hold
    // rows·dim values, w and b dim.
    unsafe {
        gpu.launch(OP, kernel, per_row(OP, rows)?, |launch| {
            launch.arg(x).arg(w).arg(b);
            out.push(launch);
            launch.arg(&dim_a).arg(&eps);
        })
    }
}

pub(crate) fn add_bias(
    gpu: &Gpu,
    x: &mut CudaBuf,
    bias: &CudaBuf,
    (rows, dim): (usize, usize),
) -> KernelResult<()> {
    const OP: &str = "add_bias";
    let x = act_mut(OP, "x", x, rows * dim)?;
    let bias = weight(OP, "bias", bias, dim)?;
    let n = rows * dim;
    if n == 0 {
        return Ok(());
    }
    let n_a = values(OP, n)?;
    let dim_a = to_i32(OP, "dim", dim)?;
    // SAFETY: argument types match the kernel; x holds n values and bias dim.
    unsafe {
        gpu.launch(
            OP,
            "add_bias",
            linear(OP, per_thread(n, dim), BLOCK)?,
            |launch| {
                launch.arg(x).arg(bias).arg(&n_a).arg(&dim_a);
            },
        )
    }
}

pub(crate) fn add_in_place(
    gpu: &Gpu,
    x: &mut CudaBuf,
    delta: &CudaBuf,
    len: usize,
) -> KernelResult<()> {
    const OP: &str = "add_in_place";
    let x = act_mut(OP, "x", x, len)?;
    let delta = act(OP, "delta", delta, len)?;
    if len == 0 {
        return Ok(());
    }
    let n_a = values(OP, len)?;
    // SAFETY: argument types match the kernel; x and delta hold len values.
    unsafe {
        gpu.launch(OP, "add_in_place", linear(OP, len, BLOCK)?, |launch| {
            launch.arg(x).arg(delta).arg(&n_a);
        })
    }
}

/// `out = gelu(x + bias)` over `rows` rows of `dim`, `out` f32 or bf16 (a GEMM input).
pub(crate) fn bias_gelu(
    gpu: &Gpu,
    (x, bias): (&CudaBuf, &CudaBuf),
    (rows, dim): (usize, usize),
    kind: Gelu,
    out: &mut CudaBuf,
) -> KernelResult<()> {
    const OP: &str = "bias_gelu";
    let n = rows * dim;
    let x = act(OP, "x", x, n)?;
    let bias = weight(OP, "bias", bias, dim)?;
    let mut out = out_buf(OP, "out", out, n)?;
    if n == 0 {
        return Ok(());
    }
    let kernel = match (kind, out.is_bf16()) {
        (Gelu::Tanh, false) => "bias_gelu_tanh_f32",
        (Gelu::Tanh, true) => "bias_gelu_tanh_bf16",
        (Gelu::Erf, false) => "bias_gelu_erf_f32",
        (Gelu::Erf, true) => "bias_gelu_erf_bf16",
    };
    let n_a = values(OP, n)?;
    let dim_a = to_i32(OP, "dim", dim)?;
    // SAFETY: argument types match the kernel (out's element type picks it); x and out hold n
    // values, bias dim.
    unsafe {
        gpu.launch(
            OP,
            kernel,
            linear(OP, per_thread(n, dim), BLOCK)?,
            |launch| {
                launch.arg(x).arg(bias);
                out.push(launch);
                launch.arg(&n_a).arg(&dim_a);
            },
        )
    }
}

/// `residual += x + bias` over `rows` rows of `dim`.
pub(crate) fn add_bias_residual(
    gpu: &Gpu,
    residual: &mut CudaBuf,
    (x, bias): (&CudaBuf, &CudaBuf),
    (rows, dim): (usize, usize),
) -> KernelResult<()> {
    const OP: &str = "add_bias_residual";
    let n = rows * dim;
    let residual = act_mut(OP, "residual", residual, n)?;
    let x = act(OP, "x", x, n)?;
    let bias = weight(OP, "bias", bias, dim)?;
    if n == 0 {
        return Ok(());
    }
    let n_a = values(OP, n)?;
    let dim_a = to_i32(OP, "dim", dim)?;
    // SAFETY: argument types match the kernel; residual and x hold n values, bias dim.
    unsafe {
        gpu.launch(
            OP,
            "add_bias_residual",
            linear(OP, per_thread(n, dim), BLOCK)?,
            |launch| {
                launch.arg(residual).arg(x).arg(bias).arg(&n_a).arg(&dim_a);
            },
        )
    }
}

pub(crate) fn gelu(gpu: &Gpu, x: &mut CudaBuf, len: usize, kind: Gelu) -> KernelResult<()> {
    const OP: &str = "gelu";
    let x = act_mut(OP, "x", x, len)?;
    if len == 0 {
        return Ok(());
    }
    let kernel = match kind {
        Gelu::Tanh => "gelu_tanh",
        Gelu::Erf => "gelu_erf",
    };
    let n_a = values(OP, len)?;
    // SAFETY: argument types match the kernel; x holds len values.
    unsafe {
        gpu.launch(OP, kernel, linear(OP, len, BLOCK)?, |launch| {
            launch.arg(x).arg(&n_a);
        })
    }
}

pub(crate) fn rope_axial(
    gpu: &Gpu,
    x: &mut CudaBuf,
    layout: HeadLayout,
    (positions, rows): (&CudaSlice<u32>, usize),
    theta: f32,
) -> KernelResult<()> {
    const OP: &str = "rope_axial";
    layout.check_fits(OP, x.len(), rows)?;
    let x = act_mut(OP, "x", x, 0)?;
    let positions = idx(OP, "positions", positions, rows * 2)?;
    let freqs = AxialFreqs::new(OP, layout.head_dim, theta)?;
    if rows == 0 || layout.heads == 0 {
        return Ok(());
    }
    let half = layout.head_dim / 2;
    let rows_a = to_i32(OP, "rows", rows)?;
    let heads = to_i32(OP, "heads", layout.heads)?;
    let half_a = to_i32(OP, "head_dim", half)?;
    let head_stride = to_i32(OP, "head_stride", layout.head_stride)?;
    let row_stride = to_i32(OP, "row_stride", layout.row_stride)?;
    let offset = to_i32(OP, "offset", layout.offset)?;
    let cfg = linear(OP, rows * layout.heads * half, BLOCK)?;
    // SAFETY: argument types match the kernel; the layout was checked against x and positions
    // holds rows·2 values.
    unsafe {
        gpu.launch(OP, "rope_axial", cfg, |launch| {
            launch
                .arg(x)
                .arg(positions)
                .arg(&freqs)
                .arg(&rows_a)
                .arg(&heads)
                .arg(&half_a)
                .arg(&head_stride)
                .arg(&row_stride)
                .arg(&offset);
        })
    }
}

/// [`attention_bidirectional`] of qkv with its bias added and q and k rotated (as
/// [`add_bias`] then [`rope_axial`] twice), applied as the flash kernel's inputs are written:
/// `Ok(false)` where that kernel does not take the head size (the caller runs the ops apart).
/// `qkv` is left as it was.
pub(crate) fn bias_rope_attention(
    gpu: &Gpu,
    (qkv, bias): (&CudaBuf, &CudaBuf),
    (positions, theta): (&CudaSlice<u32>, f32),
    batch: Varlen<'_, CudaSlice<u32>>,
    (heads, head_dim, scale): (usize, usize, f32),
    out: &mut CudaBuf,
) -> KernelResult<bool> {
    const OP: &str = "bias_rope_attention";
    if heads == 0 || head_dim == 0 || heads > GRID_Y_MAX {
        return Ok(false);
    }
    match flash_variant(head_dim) {
        Some((_, d)) if d == head_dim && head_dim.is_multiple_of(16) => {}
        _ => return Ok(false),
    }
    let width = heads * head_dim;
    let rows_cap = (qkv.len() / (3 * width)).min(out.len() / width);
    let rows = check_batch(OP, &batch, rows_cap)?;
    let qkv = act(OP, "qkv", qkv, 0)?;
    let bias = weight(OP, "bias", bias, 3 * width)?;
    let positions = idx(OP, "positions", positions, rows * 2)?;
    let freqs = AxialFreqs::new(OP, head_dim, theta)?;
    let out = out_buf(OP, "out", out, 0)?;
    if rows == 0 || batch.num_seqs == 0 {
        return Ok(true);
    }
    let raw = RawQkv {
        bias,
        positions,
        freqs,
    };
    flash_bidirectional(gpu, (qkv, Some(raw)), batch, (heads, head_dim, scale), out)?;
    Ok(true)
}

pub(crate) fn attention_bidirectional(
    gpu: &Gpu,
    qkv: &CudaBuf,
    batch: Varlen<'_, CudaSlice<u32>>,
    (heads, head_dim, scale): (usize, usize, f32),
    out: &mut CudaBuf,
) -> KernelResult<()> {
    const OP: &str = "attention_bidirectional";
    if heads == 0 || head_dim == 0 {
        return Err(KernelError::invalid(OP, "heads and head_dim must be > 0"));
    }
    let Some(kernel) = bidir_kernel(head_dim) else {
        return Err(KernelError::invalid(
            OP,
            format!("head_dim {head_dim} exceeds 256"),
        ));
    };
    if heads > GRID_Y_MAX {
        return Err(KernelError::invalid(
            OP,
            format!("{heads} heads exceed {GRID_Y_MAX}"),
        ));
    }
    let width = heads * head_dim;
    // Rows both buffers hold: the kernel never touches a row beyond the batch's, which fits here.
    let rows_cap = (qkv.len() / (3 * width)).min(out.len() / width);
    let rows = check_batch(OP, &batch, rows_cap)?;
    let qkv = act(OP, "qkv", qkv, 0)?;
    let out = out_buf(OP, "out", out, 0)?;
    if rows == 0 || batch.num_seqs == 0 {
        return Ok(());
    }
    // Head sizes the flash kernel takes (multiples of 16 up to 256, the tower's 64 among them) run
    // on bf16 tensor cores; the f32 kernel below takes the rest (into an f32 `out` only).
    if flash_variant(head_dim).is_some() {
        return flash_bidirectional(gpu, (qkv, None), batch, (heads, head_dim, scale), out);
    }
    let OutBuf::F32(out) = out else {
        return Err(KernelError::invalid(
            OP,
            format!("a bf16 out needs a head size that is a multiple of 16, not {head_dim}"),
        ));
    };
    let smem = bidir_smem_bytes(head_dim);
    if smem > DEFAULT_SMEM {
        opt_in_smem_checked(gpu, OP, kernel, smem)?;
    }
    // Every segment has at most one partial tile.
    let tiles = rows.div_ceil(BIDIR_ROWS) + batch.num_seqs;
    let cfg = LaunchConfig {
        grid_dim: (
            to_u32(OP, "query tiles", tiles)?,
            to_u32(OP, "heads", heads)?,
            1,
        ),
        block_dim: (BIDIR_THREADS, 1, 1),
        shared_mem_bytes: to_u32(OP, "shared memory", smem)?,
    };
    let num_seqs = to_i32(OP, "num_seqs", batch.num_seqs)?;
    let rows_a = to_u32(OP, "rows", rows)?;
    let heads_a = to_i32(OP, "heads", heads)?;
    let head_dim_a = to_i32(OP, "head_dim", head_dim)?;
    // SAFETY: argument types match the kernel; it clamps every segment to `rows`, which qkv (3 ·
    // width per row) and out (width per row) hold (check_batch above); shared memory is sized as
    // the kernel lays it out.
    unsafe {
        gpu.launch(OP, kernel, cfg, |launch| {
            launch
                .arg(qkv)
                .arg(batch.cu_seqlens)
                .arg(&num_seqs)
                .arg(&rows_a)
                .arg(out)
                .arg(&heads_a)
                .arg(&head_dim_a)
                .arg(&scale);
        })
    }
}

/// `n` as the kernels' i64 value count.
fn values(op: &'static str, n: usize) -> KernelResult<i64> {
    i64::try_from(n).map_err(|_| KernelError::invalid(op, format!("{n} values exceed i64")))
}

/// Lets `kernel` use `bytes` of dynamic shared memory (above 48 KiB a kernel must opt in), or
/// refuses where the GPU has less.
fn opt_in_smem_checked(
    gpu: &Gpu,
    op: &'static str,
    kernel: &str,
    bytes: usize,
) -> KernelResult<()> {
    if bytes > gpu.device.max_smem_optin {
        return Err(KernelError::invalid(
            op,
            format!(
                "needs {bytes} bytes of shared memory per block, the GPU allows {}",
                gpu.device.max_smem_optin
            ),
        ));
    }
    opt_in_smem(gpu, op, kernel, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::KERNEL_SOURCES;

    #[test]
    fn every_kernel_the_ops_pick_is_registered() {
        let vision = KERNEL_SOURCES
            .iter()
            .find(|s| s.file == "vision.cu")
            .expect("vision.cu is registered");
        let picked = LAYER_NORM
            .iter()
            .flat_map(|(_, f32_out, bf16_out)| [*f32_out, *bf16_out])
            .chain(BIDIR.iter().map(|(_, name)| *name))
            .chain([
                "add_bias",
                "add_in_place",
                "gelu_tanh",
                "gelu_erf",
                "bias_gelu_tanh_f32",
                "bias_gelu_tanh_bf16",
                "bias_gelu_erf_f32",
                "bias_gelu_erf_bf16",
                "add_bias_residual",
                "rope_axial",
                "patch_rows_bf16",
                "patch_rows_f32",
            ]);
        for name in picked {
            assert!(vision.functions.contains(&name), "{name}");
        }
    }

    #[test]
    fn variants_are_picked_by_size() {
        assert_eq!(layer_norm_kernel(1, false), "layer_norm_h4");
        assert_eq!(layer_norm_kernel(1024, false), "layer_norm_h4");
        assert_eq!(layer_norm_kernel(1025, false), "layer_norm_h8");
        assert_eq!(layer_norm_kernel(5000, false), "layer_norm_h16");
        assert_eq!(layer_norm_kernel(1024, true), "layer_norm_bf16_h4");
        assert_eq!(layer_norm_kernel(5000, true), "layer_norm_bf16_h16");
        assert_eq!(bidir_kernel(16), Some("attention_bidirectional_e2"));
        assert_eq!(bidir_kernel(64), Some("attention_bidirectional_e2"));
        assert_eq!(bidir_kernel(72), Some("attention_bidirectional_e4"));
        assert_eq!(bidir_kernel(256), Some("attention_bidirectional_e8"));
        assert_eq!(bidir_kernel(257), None);
        // The vision tower's heads (64) and the tiny model's (16) need no shared-memory opt-in.
        assert!(bidir_smem_bytes(64) <= DEFAULT_SMEM);
        assert!(bidir_smem_bytes(128) <= DEFAULT_SMEM);
    }
}
