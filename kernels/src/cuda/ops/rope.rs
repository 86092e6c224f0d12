//! Rotary embeddings (`kernels/cuda/rope.cu`): rope alone, and fused with the q/k head norms.
//! The file's third kernel, `attention_prologue`, is launched by flash attention, whose first
//! step it is; its frequency table is built here.

use cudarc::driver::{CudaSlice, DeviceRepr, PushKernelArg};

use super::super::buffers::{act_mut, idx, weight, CudaBuf};
use super::super::launch::{linear, to_i32, Gpu, BLOCK};
use crate::backend::{HeadLayout, KernelResult, Rope};
use crate::error::KernelError;

/// Frequency pairs the rope kernel's by-value table holds (`ROPE_MAX_PAIRS` in rope.cu).
const ROPE_MAX_PAIRS: usize = 64;

/// The rope kernel's by-value frequency table (`RopeTable` in rope.cu).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct RopeTable {
    inv_freq: [f32; ROPE_MAX_PAIRS],
    axis: [u32; ROPE_MAX_PAIRS],
}

// SAFETY: plain `repr(C)` data with the same layout as the CUDA struct.
unsafe impl DeviceRepr for RopeTable {}

impl RopeTable {
    /// The table of `rope` and its number of frequency pairs, for heads of `head_dim`.
    pub(crate) fn new(
        op: &'static str,
        rope: &Rope,
        head_dim: usize,
    ) -> KernelResult<(Self, usize)> {
        let rot = rope.rotary_dim;
        if !rot.is_multiple_of(2) || rot > head_dim || rot / 2 > ROPE_MAX_PAIRS {
            return Err(KernelError::invalid(
                op,
                format!(
                    "rotary_dim {rot} must be even, at most head_dim {head_dim} and at most {}",
                    2 * ROPE_MAX_PAIRS
                ),
            ));
        }
        let half = rot / 2;
        let mut table = RopeTable {
            inv_freq: [0.0; ROPE_MAX_PAIRS],
            axis: [0; ROPE_MAX_PAIRS],
        };
        for j in 0..half {
            table.inv_freq[j] = rope.inv_freq(j);
            table.axis[j] = rope.axis(j) as u32;
        }
        Ok((table, half))
    }
}

pub(crate) fn rope(
    gpu: &Gpu,
    x: &mut CudaBuf,
    layout: HeadLayout,
    (positions, rows): (&CudaSlice<u32>, usize),
    rope: &Rope,
) -> KernelResult<()> {
    const OP: &str = "rope";
    layout.check_fits(OP, x.len(), rows)?;
    let x = act_mut(OP, "x", x, 0)?;
    let positions = idx(OP, "positions", positions, rows * 3)?;
    let (table, half) = RopeTable::new(OP, rope, layout.head_dim)?;
    if rows == 0 || layout.heads == 0 || half == 0 {
        return Ok(());
    }
    let rows_a = to_i32(OP, "rows", rows)?;
    let heads_a = to_i32(OP, "heads", layout.heads)?;
    let half_a = to_i32(OP, "rotary_dim", half)?;
    let head_stride = to_i32(OP, "head_stride", layout.head_stride)?;
    let row_stride = to_i32(OP, "row_stride", layout.row_stride)?;
    let offset = to_i32(OP, "offset", layout.offset)?;
    let cfg = linear(OP, rows * layout.heads * half, BLOCK)?;
    // SAFETY: argument types match the kernel; the layout was checked against x above.
    unsafe {
        gpu.launch(OP, "rope", cfg, |launch| {
            launch
                .arg(x)
                .arg(positions)
                .arg(&table)
                .arg(&rows_a)
                .arg(&heads_a)
                .arg(&half_a)
                .arg(&head_stride)
                .arg(&row_stride)
                .arg(&offset);
        })
    }
}

/// [`crate::Backend::qk_norm_rope`] in one kernel; the caller checked that q and k heads have one
/// size (the kernel serves one head size; other shapes take the four ops).
pub(crate) fn qk_norm_rope(
    gpu: &Gpu,
    (q_buf, q_norm, q_layout): (&mut CudaBuf, &CudaBuf, HeadLayout),
    (k_buf, k_norm, k_layout): (&mut CudaBuf, &CudaBuf, HeadLayout),
    (positions, rows): (&CudaSlice<u32>, usize),
    rope: &Rope,
    eps: f32,
) -> KernelResult<()> {
    const OP: &str = "qk_norm_rope";
    let head_dim = q_layout.head_dim;
    debug_assert_eq!(k_layout.head_dim, head_dim);
    q_layout.check_fits(OP, q_buf.len(), rows)?;
    k_layout.check_fits(OP, k_buf.len(), rows)?;
    let q = act_mut(OP, "q", q_buf, 0)?;
    let k = act_mut(OP, "k", k_buf, 0)?;
    let qw = weight(OP, "q_norm", q_norm, head_dim)?;
    let kw = weight(OP, "k_norm", k_norm, head_dim)?;
    let positions = idx(OP, "positions", positions, rows * 3)?;
    let (table, half) = RopeTable::new(OP, rope, head_dim)?;
    let heads = q_layout.heads + k_layout.heads;
    if rows == 0 || heads == 0 {
        return Ok(());
    }
    let i = |what, v| to_i32(OP, what, v);
    let q_at = [
        i("q heads", q_layout.heads)?,
        i("q head stride", q_layout.head_stride)?,
        i("q row stride", q_layout.row_stride)?,
        i("q offset", q_layout.offset)?,
    ];
    let k_at = [
        i("k heads", k_layout.heads)?,
        i("k head stride", k_layout.head_stride)?,
        i("k row stride", k_layout.row_stride)?,
        i("k offset", k_layout.offset)?,
    ];
    let head_dim_a = i("head_dim", head_dim)?;
    let half_a = i("rotary pairs", half)?;
    let rows_a = i("rows", rows)?;
    // One warp (32 threads) per (row, head).
    let cfg = linear(OP, rows * heads * 32, BLOCK)?;
    // SAFETY: argument types match the kernel; both layouts were checked against their buffers
    // and positions holds rows·3 values.
    unsafe {
        gpu.launch(OP, "qk_norm_rope", cfg, |launch| {
            launch.arg(q).arg(qw);
            for v in &q_at {
                launch.arg(v);
            }
            launch.arg(k).arg(kw);
            for v in &k_at {
                launch.arg(v);
            }
            launch
                .arg(&head_dim_a)
                .arg(positions)
                .arg(&table)
                .arg(&half_a)
                .arg(&rows_a)
                .arg(&eps);
        })
    }
}
