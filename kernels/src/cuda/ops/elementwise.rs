//! The element-wise ops (`kernels/cuda/elementwise.cu`): embedding, SwiGLU (alone, or writing its
//! GEMM's bf16 input), the delta rule's gates, the last-row gather, the f32 → bf16 rounding, and
//! many small copies in one launch.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use half::bf16;

use super::super::buffers::{act, act_mut, check_copy, idx, in_buf, weight, CudaBuf, InBuf};
use super::super::device::driver_err;
use super::super::launch::{grid_2d, linear, to_i32, to_u32, Gpu, BLOCK};
use crate::backend::{
    CopyPart, DeltaGates, GateOutputs, KernelResult, Projection, Varlen, WeightAhead,
};
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

/// Passes of up to `INSTINCT_L2_PREFETCH_ROWS` rows prefetch their next GEMMs' weights into L2;
/// none by default (0) until a GPU run shows what it gains. Up to a few hundred rows a GEMM is bound
/// by reading its weight; past that by its FLOPs, and the prefetch only adds a launch.
const PREFETCH_ROWS: usize = 0;

fn prefetch_rows() -> usize {
    static ROWS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *ROWS.get_or_init(|| {
        let Ok(value) = std::env::var("INSTINCT_L2_PREFETCH_ROWS") else {
            return PREFETCH_ROWS;
        };
        value.trim().parse::<usize>().unwrap_or_else(|_| {
            tracing::warn!(
                value,
                default = PREFETCH_ROWS,
                "INSTINCT_L2_PREFETCH_ROWS is not a row count; the default is used"
            );
            PREFETCH_ROWS
        })
    })
}

/// What of each weight ahead the L2 cache is asked for, as `(rows, row bytes, leading bytes of
/// each row)`: in order, a whole weight while it fits in `budget` bytes, then the leading columns
/// of the next one's rows (a GEMM walks K from 0 up in every tile, so every tile starts in L2), in
/// 16-byte multiples (the bulk prefetch's unit). At most two weights.
fn prefetch_plan(ahead: &[(usize, usize)], mut budget: usize) -> Vec<(usize, usize, usize)> {
    let mut plan = Vec::with_capacity(2);
    for &(rows, row_bytes) in ahead.iter().take(2) {
        let whole = rows * row_bytes;
        if whole == 0 || row_bytes % 16 != 0 {
            break;
        }
        if whole <= budget {
            plan.push((1, whole, whole));
            budget -= whole;
            continue;
        }
        let lead = (budget / rows).min(row_bytes) / 16 * 16;
        if lead > 0 {
            plan.push((rows, row_bytes, lead));
        }
        break;
    }
    plan
}

/// See `Backend::prefetch_weights`: on Hopper and later, for passes of up to [`prefetch_rows`]
/// rows, three quarters of L2 (the rest for the pass's activations) filled by [`prefetch_plan`].
pub(crate) fn prefetch_weights(
    gpu: &Gpu,
    ahead: &[WeightAhead<'_, CudaBuf>],
    rows: usize,
) -> KernelResult<()> {
    const OP: &str = "prefetch_weights";
    if rows == 0 || rows > prefetch_rows() || gpu.device.arch.major < 9 {
        return Ok(());
    }
    let mut weights = Vec::with_capacity(2);
    for a in ahead.iter().take(2) {
        weights.push(weight(OP, "weight", a.w, a.rows * a.cols)?);
    }
    let sizes: Vec<(usize, usize)> = ahead.iter().take(2).map(|a| (a.rows, a.cols * 2)).collect();
    let plan = prefetch_plan(&sizes, gpu.device.l2_bytes / 4 * 3);
    let Some(&first) = plan.first() else {
        return Ok(());
    };
    let second = plan.get(1).copied().unwrap_or((0, 0, 0));
    let arg = |(r, b, t): (usize, usize, usize)| -> KernelResult<(u32, u32, u32)> {
        Ok((
            to_u32(OP, "rows", r)?,
            to_u32(OP, "row bytes", b)?,
            to_u32(OP, "bytes", t)?,
        ))
    };
    let (a, b) = (arg(first)?, arg(second)?);
    let (wa, wb) = (weights[0], weights.get(1).copied().unwrap_or(weights[0]));
    let cfg = grid_2d(8, plan.len() as u32, 128);
    // SAFETY: argument types match the kernel; every piece lies within its weight (the plan's
    // rows times row bytes are the weight's bytes, checked above) and is only read, as a hint.
    unsafe {
        gpu.launch(OP, "l2_prefetch", cfg, |launch| {
            launch
                .arg(wa)
                .arg(&a.0)
                .arg(&a.1)
                .arg(&a.2)
                .arg(wb)
                .arg(&b.0)
                .arg(&b.1)
                .arg(&b.2);
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

#[cfg(test)]
mod tests {
    use super::prefetch_plan;

    const MIB: usize = 1 << 20;

    #[test]
    fn a_prefetch_takes_whole_weights_then_the_leading_columns_of_the_next() {
        // Qwen3.5-4B on a 50 MiB L2 (three quarters of it): the out-projection (2,560 rows of
        // 4,096 bf16) whole, then the leading columns of gate|up's 18,432 rows of 2,560.
        let budget = 50 * MIB / 4 * 3;
        let plan = prefetch_plan(&[(2560, 8192), (18432, 5120)], budget);
        assert_eq!(plan[0], (1, 2560 * 8192, 2560 * 8192));
        let (rows, row_bytes, lead) = plan[1];
        assert_eq!((rows, row_bytes), (18432, 5120));
        assert_eq!(lead % 16, 0);
        assert!(lead > 0 && 2560 * 8192 + rows * lead <= budget);
        assert!(
            2560 * 8192 + rows * (lead + 16) > budget,
            "the lead uses the budget"
        );
    }

    #[test]
    fn a_prefetch_stays_within_its_budget_and_its_alignment() {
        // Both whole when they fit.
        assert_eq!(
            prefetch_plan(&[(4, 32), (2, 16)], 1000),
            vec![(1, 128, 128), (1, 32, 32)]
        );
        // The first alone larger than the budget: its leading columns only, nothing after it.
        assert_eq!(prefetch_plan(&[(10, 64), (2, 16)], 330), vec![(10, 64, 32)]);
        // Rows that are not 16-byte multiples, or no budget: nothing.
        assert!(prefetch_plan(&[(10, 24)], 1000).is_empty());
        assert!(prefetch_plan(&[(10, 64)], 0).is_empty());
        // At most two weights.
        assert_eq!(prefetch_plan(&[(1, 16), (1, 16), (1, 16)], 1000).len(), 2);
    }
}
