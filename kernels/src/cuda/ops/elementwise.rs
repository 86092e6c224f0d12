//! The element-wise ops (`kernels/cuda/elementwise.cu`): embedding, SwiGLU (alone, or writing its
//! GEMM's bf16 input), the delta rule's gates, the last-row gather, the f32 → bf16 rounding, and
//! many small copies in one launch.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use half::bf16;

use super::super::buffers::{act, act_mut, check_copy, idx, in_buf, weight, CudaBuf, InBuf};
use super::super::device::driver_err;
use super::super::launch::{grid_2d, linear, to_i32, to_u32, Gpu, BLOCK};
use crate::backend::{CopyPart, DeltaGates, GateOutputs, KernelResult, Projection, Varlen};
use crate::error::KernelError;

use super::shared::{check_batch, fused_gemm, projection_operands};

pub(crate) fn embedding(
    gpu: &Gpu,
    table: &CudaBuf,
    vocab: usize,
    ids: &CudaSlice<u32>,
    (rows, dim): (usize, usize),
    out: &mut CudaBuf,
) -> KernelResult<()> {
    const OP: &str = "embedding";
    let table = weight(OP, "table", table, vocab * dim)?;
    let ids = idx(OP, "ids", ids, rows)?;
    let out = act_mut(OP, "out", out, rows * dim)?;
    if rows * dim == 0 {
        return Ok(());
    }
    let (rows_a, dim_a) = (to_i32(OP, "rows", rows)?, to_i32(OP, "dim", dim)?);
    let vocab_a = to_u32(OP, "vocab", vocab)?;
    // SAFETY: argument types match the kernel; lengths checked above.
    unsafe {
        gpu.launch(OP, "embedding", linear(OP, rows * dim, BLOCK)?, |launch| {
            launch
                .arg(table)
                .arg(ids)
                .arg(out)
                .arg(&rows_a)
                .arg(&dim_a)
                .arg(&vocab_a);
        })
    }
}

/// The SwiGLU kernels' grid: blocks of BLOCK threads over (rows, column slices), a slice being
/// BLOCK steps of 8 values (elementwise.cu), so that a thread has few steps and their loads
/// overlap across the whole grid.
fn swiglu_grid(op: &'static str, rows: usize, inter: usize) -> KernelResult<LaunchConfig> {
    Ok(grid_2d(
        to_u32(op, "rows", rows)?,
        to_u32(op, "column slices", inter.div_ceil(8 * BLOCK as usize))?,
        BLOCK,
    ))
}

pub(crate) fn swiglu(
    gpu: &Gpu,
    gate_up: &CudaBuf,
    (rows, inter): (usize, usize),
    out: &mut CudaBuf,
) -> KernelResult<()> {
    const OP: &str = "swiglu";
    let gate_up = in_buf(OP, "gate_up", gate_up, rows * 2 * inter)?;
    let out = act_mut(OP, "out", out, rows * inter)?;
    if rows * inter == 0 {
        return Ok(());
    }
    let rows_a = to_i32(OP, "rows", rows)?;
    let inter_a = to_i32(OP, "inter", inter)?;
    let kernel = match gate_up {
        InBuf::F32(_) => "swiglu",
        InBuf::Bf16(_) => "swiglu_from_bf16",
    };
    // SAFETY: argument types match the kernel; lengths checked above.
    unsafe {
        gpu.launch(OP, kernel, swiglu_grid(OP, rows, inter)?, |launch| {
            gate_up.push(launch);
            launch.arg(out).arg(&rows_a).arg(&inter_a);
        })
    }
}

/// [`crate::Backend::swiglu_gemm`] in one pass: SwiGLU writes the GEMM's bf16 input. `Ok(false)`
/// (nothing launched) where cuBLASLt has no plan for the shape: the caller then runs the two ops.
pub(crate) fn swiglu_gemm(
    gpu: &Gpu,
    gate_up: &CudaBuf,
    (rows, inter): (usize, usize),
    proj: Projection<'_, CudaBuf>,
    y_buf: &mut CudaBuf,
) -> KernelResult<bool> {
    const OP: &str = "swiglu_gemm";
    let out_dim = proj.out_dim;
    let gu = in_buf(OP, "gate_up", gate_up, rows * 2 * inter)?;
    let kernel = match gu {
        InBuf::F32(_) => "swiglu_bf16",
        InBuf::Bf16(_) => "swiglu_bf16_from_bf16",
    };
    let Some((w, y)) = projection_operands(OP, &proj, (rows, inter), y_buf)? else {
        return Ok(true);
    };
    let rows_a = to_i32(OP, "rows", rows)?;
    let inter_a = to_i32(OP, "inter", inter)?;
    let convert = |x_bf16: &mut CudaSlice<bf16>| {
        // SAFETY: argument types match the kernel; gate_up holds rows·2·inter values and the
        // scratch rows·inter (sized by the GEMM).
        unsafe {
            gpu.launch(OP, kernel, swiglu_grid(OP, rows, inter)?, |launch| {
                gu.push(launch);
                launch.arg(x_bf16).arg(&rows_a).arg(&inter_a);
            })
        }
    };
    fused_gemm(gpu, (rows, inter), (w, out_dim, y), proj.store, convert)
}

pub(crate) fn delta_gates(
    gpu: &Gpu,
    gates: DeltaGates<'_, CudaBuf>,
    rows: usize,
    out: GateOutputs<'_, CudaBuf>,
) -> KernelResult<()> {
    const OP: &str = "delta_gates";
    let (b_at, a_at, heads) = (gates.b_at, gates.a_at, gates.heads);
    let b = in_buf(OP, "b", gates.b, b_at.required_len(rows, heads))?;
    let a = in_buf(OP, "a", gates.a, a_at.required_len(rows, heads))?;
    let kernel = match (&b, &a) {
        (InBuf::F32(_), InBuf::F32(_)) => "delta_gates",
        (InBuf::Bf16(_), InBuf::Bf16(_)) => "delta_gates_bf16x",
        _ => {
            return Err(KernelError::invalid(
                OP,
                "b and a must have the same type (both f32 or both bf16)",
            ))
        }
    };
    let a_log = weight(OP, "a_log", gates.a_log, heads)?;
    let dt_bias = weight(OP, "dt_bias", gates.dt_bias, heads)?;
    let beta = act_mut(OP, "beta", out.beta, rows * heads)?;
    let g = act_mut(OP, "g", out.g, rows * heads)?;
    if rows * heads == 0 {
        return Ok(());
    }
    let rows_a = to_i32(OP, "rows", rows)?;
    let heads_a = to_i32(OP, "heads", heads)?;
    let b_stride = to_i32(OP, "b row stride", b_at.row_stride)?;
    let b_offset = to_i32(OP, "b offset", b_at.offset)?;
    let a_stride = to_i32(OP, "a row stride", a_at.row_stride)?;
    let a_offset = to_i32(OP, "a offset", a_at.offset)?;
    // SAFETY: argument types match the kernel; b and a hold `rows` rows at their strides, beta
    // and g rows·heads values (checked above).
    unsafe {
        gpu.launch(OP, kernel, linear(OP, rows * heads, BLOCK)?, |launch| {
            b.push(launch);
            launch.arg(&b_stride).arg(&b_offset);
            a.push(launch);
            launch
                .arg(&a_stride)
                .arg(&a_offset)
                .arg(a_log)
                .arg(dt_bias)
                .arg(beta)
                .arg(g)
                .arg(&rows_a)
                .arg(&heads_a);
        })
    }
}

pub(crate) fn gather_last(
    gpu: &Gpu,
    x: &CudaBuf,
    (batch, dim): (Varlen<'_, CudaSlice<u32>>, usize),
    out: &mut CudaBuf,
) -> KernelResult<()> {
    const OP: &str = "gather_last";
    let rows_cap = check_batch(OP, &batch, x.len() / dim.max(1))?;
    let x = act(OP, "x", x, 0)?;
    let out = act_mut(OP, "out", out, batch.num_seqs * dim)?;
    if batch.num_seqs == 0 || dim == 0 {
        return Ok(());
    }
    if batch.num_seqs > 65_535 {
        return Err(KernelError::invalid(OP, "more than 65535 sequences"));
    }
    let dim_a = to_i32(OP, "dim", dim)?;
    let rows_cap_a = to_u32(OP, "rows", rows_cap)?;
    let cfg = grid_2d(
        to_u32(OP, "dim", dim.div_ceil(BLOCK as usize))?,
        batch.num_seqs as u32,
        BLOCK,
    );
    // SAFETY: argument types match the kernel; it reads only rows below rows_cap.
    unsafe {
        gpu.launch(OP, "gather_last", cfg, |launch| {
            launch
                .arg(x)
                .arg(batch.cu_seqlens)
                .arg(out)
                .arg(&dim_a)
                .arg(&rows_cap_a);
        })
    }
}

/// `out[slots[i]] = rows[i]` for `i < count`, rows of `width` (see `Backend::scatter_rows`). The
/// slots are on the device: the kernel skips one past `out`'s rows, which the caller wrote.
pub(crate) fn scatter_rows(
    gpu: &Gpu,
    rows: &CudaBuf,
    slots: &CudaSlice<u32>,
    (count, width): (usize, usize),
    out: &mut CudaBuf,
) -> KernelResult<()> {
    const OP: &str = "scatter_rows";
    let rows = act(OP, "rows", rows, count * width)?;
    let slots = idx(OP, "slots", slots, count)?;
    let out_rows = out.len() / width.max(1);
    let out = act_mut(OP, "out", out, 0)?;
    if count * width == 0 {
        return Ok(());
    }
    let (count_a, width_a) = (to_i32(OP, "count", count)?, to_i32(OP, "width", width)?);
    let out_rows_a = to_u32(OP, "out rows", out_rows)?;
    // SAFETY: argument types match the kernel; rows and slots hold count rows (checked above);
    // the kernel writes only rows of out below out_rows.
    unsafe {
        gpu.launch(
            OP,
            "scatter_rows",
            linear(OP, count * width, BLOCK)?,
            |launch| {
                launch
                    .arg(rows)
                    .arg(slots)
                    .arg(out)
                    .arg(&count_a)
                    .arg(&width_a)
                    .arg(&out_rows_a);
            },
        )
    }
}

/// Threads of `copy_parts`' blocks, and the most blocks one part spreads over.
const COPY_THREADS: u32 = 256;
const COPY_MAX_BLOCKS: usize = 64;
/// Parts of one `copy_parts` launch: a grid's y extent.
const COPY_MAX_PARTS: usize = 65_535;

/// [`crate::Backend::copy_many`] in one `copy_parts` launch: every part checked against its
/// buffers (f32, in bounds) and the destinations against each other, the table of (source,
/// destination, values) uploaded into `table` (grown as needed; stream-ordered, so a launch still
/// reading the old one is unaffected).
pub(crate) fn copy_parts(
    gpu: &Gpu,
    table: &mut Option<CudaSlice<u64>>,
    dsts: &mut [&mut CudaBuf],
    parts: &[CopyPart<'_, CudaBuf>],
) -> KernelResult<()> {
    const OP: &str = "copy_many";
    let stream = &gpu.device.stream;
    let mut spans: Vec<(usize, usize, usize)> = Vec::with_capacity(parts.len());
    let mut entries: Vec<u64> = Vec::with_capacity(3 * parts.len());
    let mut longest = 0;
    // Destination addresses first (each taken once: a mutable borrow per buffer).
    let mut dst_ptrs = Vec::with_capacity(dsts.len());
    for dst in dsts.iter_mut() {
        let CudaBuf::F32(slice) = &mut **dst else {
            return Err(KernelError::invalid(OP, "copies f32 buffers only"));
        };
        let (ptr, _) = slice.device_ptr_mut(stream);
        dst_ptrs.push((ptr, slice.len()));
    }
    for p in parts.iter().filter(|p| p.len > 0) {
        let CudaBuf::F32(src) = p.src else {
            return Err(KernelError::invalid(OP, "copies f32 buffers only"));
        };
        let &(dst_ptr, dst_len) = dst_ptrs
            .get(p.dst)
            .ok_or_else(|| KernelError::invalid(OP, format!("no destination {}", p.dst)))?;
        check_copy(OP, (src.len(), p.src_at), (dst_len, p.dst_at), p.len)?;
        spans.push((p.dst, p.dst_at, p.dst_at + p.len));
        let (src_ptr, _) = src.device_ptr(stream);
        entries.extend([
            src_ptr + 4 * p.src_at as u64,
            dst_ptr + 4 * p.dst_at as u64,
            p.len as u64,
        ]);
        longest = longest.max(p.len);
    }
    spans.sort_unstable();
    if let Some(w) = spans
        .windows(2)
        .find(|w| w[0].0 == w[1].0 && w[1].1 < w[0].2)
    {
        return Err(KernelError::invalid(
            OP,
            format!("parts overlap in destination {}", w[0].0),
        ));
    }
    if entries.is_empty() {
        return Ok(());
    }
    gpu.workspace.capture.refuse(OP)?;
    if table.as_ref().is_none_or(|t| t.len() < entries.len()) {
        let grown = stream
            .alloc_zeros::<u64>(entries.len().next_power_of_two())
            .map_err(|e| driver_err(OP, e))?;
        *table = Some(grown);
    }
    let table = table.as_mut().expect("allocated above");
    stream
        .memcpy_htod(&entries, &mut table.slice_mut(..entries.len()))
        .map_err(|e| driver_err(OP, e))?;
    let blocks = longest
        .div_ceil(4 * COPY_THREADS as usize)
        .clamp(1, COPY_MAX_BLOCKS);
    // A launch takes at most COPY_MAX_PARTS parts (the grid's y extent).
    for first in (0..spans.len()).step_by(COPY_MAX_PARTS) {
        let count = (spans.len() - first).min(COPY_MAX_PARTS);
        let cfg = LaunchConfig {
            grid_dim: (
                to_u32(OP, "blocks", blocks)?,
                to_u32(OP, "parts", count)?,
                1,
            ),
            block_dim: (COPY_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let count_a = to_i32(OP, "parts", count)?;
        let rows = table.slice(3 * first..3 * (first + count));
        // SAFETY: argument types match the kernel; every part's source and destination hold its
        // values (checked above) and no two destinations overlap.
        unsafe {
            gpu.launch(OP, "copy_parts", cfg, |launch| {
                launch.arg(&rows).arg(&count_a);
            })?;
        }
    }
    Ok(())
}

/// `out[..n] = bf16(x[..n])`.
pub(crate) fn round_to_bf16(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    n: usize,
    out: &mut CudaSlice<bf16>,
) -> KernelResult<()> {
    const OP: &str = "f32_to_bf16";
    if n == 0 {
        return Ok(());
    }
    let n_a = i64::try_from(n).map_err(|_| KernelError::invalid(OP, "too many values"))?;
    // SAFETY: x and out hold at least n values (checked by the callers); the kernel reads and
    // writes below n.
    unsafe {
        gpu.launch(
            OP,
            "f32_to_bf16",
            linear(OP, n.div_ceil(2), BLOCK)?,
            |launch| {
                launch.arg(x).arg(out).arg(&n_a);
            },
        )
    }
}
