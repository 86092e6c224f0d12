//! The norms (`kernels/cuda/norms.cu`): row RMSNorms (plain and with the residual add), the
//! per-head RMS and L2 norms, and the gated RMSNorm (alone, or feeding its GEMM in bf16).

use cudarc::driver::{CudaSlice, LaunchArgs, PushKernelArg};
use half::bf16;

use super::super::buffers::{act, act_mut, in_buf, out_buf, weight, CudaBuf, InBuf, OutBuf};
use super::super::launch::{linear, per_row, to_i32, Gpu, BLOCK};
use super::shared::{fused_gemm, projection_operands};
use crate::backend::{GatedNorm, HeadLayout, KernelResult, Projection, RowNorm, Strided};

/// Values per thread of the register-held norm kernels: row kernels (BLOCK threads per row) and
/// one-warp kernels (32 lanes per head). The largest variant also runs longer rows.
const ROW_HELD: [usize; 4] = [4, 8, 12, 16];
const WARP_HELD: [usize; 3] = [4, 8, 16];
const RMS_NORM: [&str; 4] = ["rms_norm_h4", "rms_norm_h8", "rms_norm_h12", "rms_norm_h16"];
const RMS_NORM_BF16: [&str; 4] = [
    "rms_norm_bf16_h4",
    "rms_norm_bf16_h8",
    "rms_norm_bf16_h12",
    "rms_norm_bf16_h16",
];
const ADD_RMS_NORM: [&str; 4] = [
    "add_rms_norm_h4",
    "add_rms_norm_h8",
    "add_rms_norm_h12",
    "add_rms_norm_h16",
];
const ADD_RMS_NORM_BF16: [&str; 4] = [
    "add_rms_norm_bf16_h4",
    "add_rms_norm_bf16_h8",
    "add_rms_norm_bf16_h12",
    "add_rms_norm_bf16_h16",
];
const GATED_RMS_NORM_BF16: [&str; 3] = [
    "gated_rms_norm_bf16_h4",
    "gated_rms_norm_bf16_h8",
    "gated_rms_norm_bf16_h16",
];
/// The same with a bf16 gate `z`.
const GATED_RMS_NORM_BF16_ZBF16: [&str; 3] = [
    "gated_rms_norm_bf16_zbf16_h4",
    "gated_rms_norm_bf16_zbf16_h8",
    "gated_rms_norm_bf16_zbf16_h16",
];
const L2_NORM: [&str; 3] = ["l2_norm_h4", "l2_norm_h8", "l2_norm_h16"];

/// Index of the smallest variant in `held` whose `threads · held` values hold a row of `len`
/// (the last, which loops over longer rows, when none does).
fn held_variant(len: usize, threads: usize, held: &[usize]) -> usize {
    held.iter()
        .position(|&h| h * threads >= len)
        .unwrap_or(held.len() - 1)
}

/// The kernel of a row norm from its table by row length and output type.
fn row_kernel(
    dim: usize,
    out: &OutBuf<'_>,
    f32_out: [&'static str; 4],
    bf16_out: [&'static str; 4],
) -> &'static str {
    let held = held_variant(dim, BLOCK as usize, &ROW_HELD);
    match out {
        OutBuf::F32(_) => f32_out[held],
        OutBuf::Bf16(_) => bf16_out[held],
    }
}

pub(crate) fn rms_norm(
    gpu: &Gpu,
    x: &CudaBuf,
    norm: RowNorm<'_, CudaBuf>,
    out: &mut CudaBuf,
) -> KernelResult<()> {
    const OP: &str = "rms_norm";
    let RowNorm { rows, dim, eps, .. } = norm;
    let x = act(OP, "x", x, rows * dim)?;
    let w = weight(OP, "weight", norm.weight, dim)?;
    let mut out = out_buf(OP, "out", out, rows * dim)?;
    if rows == 0 || dim == 0 {
        return Ok(());
    }
    let dim_a = to_i32(OP, "dim", dim)?;
    let kernel = row_kernel(dim, &out, RMS_NORM, RMS_NORM_BF16);
    // SAFETY: argument types match the kernel; lengths checked above.
    unsafe {
        gpu.launch(OP, kernel, per_row(OP, rows)?, |launch| {
            launch.arg(x).arg(w);
            out.push(launch);
            launch.arg(&dim_a).arg(&eps);
        })
    }
}

pub(crate) fn add_rms_norm(
    gpu: &Gpu,
    residual: &mut CudaBuf,
    delta: &CudaBuf,
    norm: RowNorm<'_, CudaBuf>,
    out: &mut CudaBuf,
) -> KernelResult<()> {
    const OP: &str = "add_rms_norm";
    let RowNorm { rows, dim, eps, .. } = norm;
    let residual = act_mut(OP, "residual", residual, rows * dim)?;
    let delta = act(OP, "delta", delta, rows * dim)?;
    let w = weight(OP, "weight", norm.weight, dim)?;
    let mut out = out_buf(OP, "out", out, rows * dim)?;
    if rows == 0 || dim == 0 {
        return Ok(());
    }
    let dim_a = to_i32(OP, "dim", dim)?;
    let kernel = row_kernel(dim, &out, ADD_RMS_NORM, ADD_RMS_NORM_BF16);
    // SAFETY: argument types match the kernel; lengths checked above.
    unsafe {
        gpu.launch(OP, kernel, per_row(OP, rows)?, |launch| {
            launch.arg(residual).arg(delta).arg(w);
            out.push(launch);
            launch.arg(&dim_a).arg(&eps);
        })
    }
}

pub(crate) fn head_rms_norm(
    gpu: &Gpu,
    (x, weight_buf): (&mut CudaBuf, &CudaBuf),
    layout: HeadLayout,
    (rows, eps): (usize, f32),
) -> KernelResult<()> {
    const OP: &str = "head_rms_norm";
    layout.check_fits(OP, x.len(), rows)?;
    let x = act_mut(OP, "x", x, 0)?;
    let w = weight(OP, "weight", weight_buf, layout.head_dim)?;
    per_head(gpu, (OP, "head_rms_norm"), x, Some(w), layout, (rows, eps))
}

pub(crate) fn l2_norm(
    gpu: &Gpu,
    x: &mut CudaBuf,
    layout: HeadLayout,
    (rows, eps): (usize, f32),
) -> KernelResult<()> {
    const OP: &str = "l2_norm";
    layout.check_fits(OP, x.len(), rows)?;
    let x = act_mut(OP, "x", x, 0)?;
    let kernel = L2_NORM[held_variant(layout.head_dim, 32, &WARP_HELD)];
    per_head(gpu, (OP, kernel), x, None, layout, (rows, eps))
}

/// Launches a one-warp-per-head kernel (`head_rms_norm` with a weight, `l2_norm` without) over
/// `rows` rows with epsilon `eps`; the caller checked the layout against `x`.
fn per_head(
    gpu: &Gpu,
    (op, kernel): (&'static str, &str),
    x: &mut CudaSlice<f32>,
    w: Option<&CudaSlice<bf16>>,
    layout: HeadLayout,
    (rows, eps): (usize, f32),
) -> KernelResult<()> {
    if rows == 0 || layout.heads == 0 {
        return Ok(());
    }
    let rows_a = to_i32(op, "rows", rows)?;
    let heads = to_i32(op, "heads", layout.heads)?;
    let head_dim = to_i32(op, "head_dim", layout.head_dim)?;
    let head_stride = to_i32(op, "head_stride", layout.head_stride)?;
    let row_stride = to_i32(op, "row_stride", layout.row_stride)?;
    let offset = to_i32(op, "offset", layout.offset)?;
    // One warp (32 threads) per head.
    let cfg = linear(op, rows * layout.heads * 32, BLOCK)?;
    // SAFETY: argument types match the kernel; the layout was checked against x.
    unsafe {
        gpu.launch(op, kernel, cfg, |launch| {
            launch.arg(x);
            if let Some(w) = w {
                launch.arg(w);
            }
            launch
                .arg(&rows_a)
                .arg(&heads)
                .arg(&head_dim)
                .arg(&head_stride)
                .arg(&row_stride)
                .arg(&offset)
                .arg(&eps);
        })
    }
}

/// The checked gate `z` (f32, or bf16: the stacked in-projection output of a bf16 model) of a gated
/// RMSNorm launch and its layout arguments (`z, heads, z_stride, z_offset` in norms.cu).
struct GateArgs<'a> {
    z: InBuf<'a>,
    heads: i32,
    stride: i32,
    offset: i32,
}

impl<'a> GateArgs<'a> {
    /// Checks that `z` holds `norm.rows` rows of `heads·dim` at `z_at`.
    fn check(op: &'static str, norm: &GatedNorm<'a, CudaBuf>) -> KernelResult<Self> {
        let z_at: Strided = norm.z_at;
        Ok(Self {
            z: in_buf(op, "z", norm.z, z_at.required_len(norm.rows, norm.width()))?,
            heads: to_i32(op, "heads", norm.heads)?,
            stride: to_i32(op, "z row stride", z_at.row_stride)?,
            offset: to_i32(op, "z offset", z_at.offset)?,
        })
    }

    fn is_bf16(&self) -> bool {
        matches!(self.z, InBuf::Bf16(_))
    }

    fn push<'b>(&'b self, launch: &mut LaunchArgs<'b>) {
        self.z.push(launch);
        launch.arg(&self.heads).arg(&self.stride).arg(&self.offset);
    }
}

pub(crate) fn gated_rms_norm(
    gpu: &Gpu,
    x: &mut CudaBuf,
    norm: GatedNorm<'_, CudaBuf>,
) -> KernelResult<()> {
    const OP: &str = "gated_rms_norm";
    let (norm_rows, dim, eps) = (norm.norm_rows(), norm.dim, norm.eps);
    let x = act_mut(OP, "x", x, norm_rows * dim)?;
    let gate = GateArgs::check(OP, &norm)?;
    let w = weight(OP, "weight", norm.weight, dim)?;
    if norm_rows == 0 || dim == 0 {
        return Ok(());
    }
    let dim_a = to_i32(OP, "dim", dim)?;
    let kernel = if gate.is_bf16() {
        "gated_rms_norm_zbf16"
    } else {
        "gated_rms_norm"
    };
    let rows_a = to_i32(OP, "rows", norm_rows)?;
    // SAFETY: argument types match the kernel; x holds rows·heads·dim values and z `rows` rows
    // of heads·dim at its stride (checked above). One warp per normalised row.
    unsafe {
        gpu.launch(OP, kernel, linear(OP, norm_rows * 32, BLOCK)?, |launch| {
            launch.arg(x);
            gate.push(launch);
            launch.arg(w).arg(&rows_a).arg(&dim_a).arg(&eps);
        })
    }
}

/// [`crate::Backend::gated_rms_norm_gemm`] in one pass: the norm writes the GEMM's bf16 input.
/// `Ok(false)` (nothing launched) where cuBLASLt has no plan for the shape: the caller then runs
/// the two ops.
pub(crate) fn gated_rms_norm_gemm(
    gpu: &Gpu,
    x_buf: &CudaBuf,
    norm: GatedNorm<'_, CudaBuf>,
    proj: Projection<'_, CudaBuf>,
    y_buf: &mut CudaBuf,
) -> KernelResult<bool> {
    const OP: &str = "gated_rms_norm_gemm";
    let (rows, dim, eps) = (norm.rows, norm.dim, norm.eps);
    let (norm_rows, in_dim) = (norm.norm_rows(), norm.width());
    let out_dim = proj.out_dim;
    let x = act(OP, "x", x_buf, norm_rows * dim)?;
    let gate = GateArgs::check(OP, &norm)?;
    let nw = weight(OP, "norm weight", norm.weight, dim)?;
    let Some((w, y)) = projection_operands(OP, &proj, (rows, in_dim), y_buf)? else {
        return Ok(true);
    };
    let rows_a = to_i32(OP, "rows", norm_rows)?;
    let dim_a = to_i32(OP, "dim", dim)?;
    let convert = |x_bf16: &mut CudaSlice<bf16>| {
        let held = held_variant(dim, 32, &WARP_HELD);
        let kernel = if gate.is_bf16() {
            GATED_RMS_NORM_BF16_ZBF16[held]
        } else {
            GATED_RMS_NORM_BF16[held]
        };
        // SAFETY: argument types match the kernel; x holds rows·heads·dim values, z `rows` rows
        // of heads·dim at its stride, the scratch rows·heads·dim (sized by the GEMM). One
        // warp per normalised row.
        unsafe {
            gpu.launch(OP, kernel, linear(OP, norm_rows * 32, BLOCK)?, |launch| {
                launch.arg(x);
                gate.push(launch);
                launch
                    .arg(nw)
                    .arg(x_bf16)
                    .arg(&rows_a)
                    .arg(&dim_a)
                    .arg(&eps);
            })
        }
    };
    fused_gemm(gpu, (rows, in_dim), (w, out_dim, y), proj.store, convert)
}
