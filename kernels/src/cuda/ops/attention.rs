//! Gated causal GQA attention: the checks and the choice of kernel. Head sizes the tensor-core
//! kernels take go to [`super::flash_attention`]; the rest run the naive `attention_gated`
//! (`kernels/cuda/attention.cu`). Sequences that continue a prefix run the naive
//! `attention_gated_prefix` ([`attention_carried`]).

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::super::buffers::{act, act_mut, idx, out_buf, weight, CudaBuf, OutBuf};
use super::super::launch::{linear, to_i32, to_u32, Gpu, BLOCK};
use super::flash_attention::{flash_attention, flash_variant, Carried, FlashInputs};
use super::rope::RopeTable;
use super::shared::check_batch;
use super::shared::CudaBuffers;
use crate::backend::{AttentionDims, AttentionOutput, KernelResult, QkPrologue, Strided, Varlen};
use crate::error::KernelError;

/// Threads per block of the naive attention kernel (`ATTN_THREADS` in attention.cu).
const ATTN_THREADS: u32 = 128;
/// Largest head the naive attention kernel holds in registers.
const ATTN_MAX_HEAD_DIM: usize = 512;

/// The separate `qg`, `k` and `v` of [`crate::Backend::attention`].
pub(crate) type Qkv<'a> = (&'a CudaBuf, &'a CudaBuf, &'a CudaBuf);

/// Checks attention dims and returns the rows qg, k and v all hold (the caller then checks the
/// batch against them with [`check_batch`]).
fn attention_rows(
    op: &'static str,
    (qg, k, v): Qkv<'_>,
    dims: AttentionDims,
) -> KernelResult<usize> {
    check_heads(op, dims)?;
    let (q_heads, kv_heads, head_dim) = (dims.q_heads, dims.kv_heads, dims.head_dim);
    // Rows every buffer can hold: kernels never touch a row beyond it.
    Ok([
        qg.len() / (q_heads * 2 * head_dim),
        k.len() / (kv_heads * head_dim),
        v.len() / (kv_heads * head_dim),
    ]
    .into_iter()
    .min()
    .unwrap_or(0))
}

/// Checks the head counts and size the naive kernels take.
fn check_heads(op: &'static str, dims: AttentionDims) -> KernelResult<()> {
    let (q_heads, kv_heads, head_dim) = (dims.q_heads, dims.kv_heads, dims.head_dim);
    if q_heads == 0 || kv_heads == 0 || !q_heads.is_multiple_of(kv_heads) || head_dim == 0 {
        return Err(KernelError::invalid(
            op,
            format!(
                "q_heads {q_heads} must be a positive multiple of kv_heads {kv_heads} > 0, \
                 head_dim > 0"
            ),
        ));
    }
    if head_dim > ATTN_MAX_HEAD_DIM {
        return Err(KernelError::invalid(
            op,
            format!("head_dim {head_dim} exceeds {ATTN_MAX_HEAD_DIM}"),
        ));
    }
    Ok(())
}

pub(crate) fn attention(
    gpu: &Gpu,
    (qg, k, v): Qkv<'_>,
    batch: Varlen<'_, CudaSlice<u32>>,
    dims: AttentionDims,
    out: &mut CudaBuf,
) -> KernelResult<()> {
    const OP: &str = "attention";
    let (q_heads, kv_heads, head_dim, scale) =
        (dims.q_heads, dims.kv_heads, dims.head_dim, dims.scale);
    let out_rows = out.len() / (q_heads * head_dim).max(1);
    let rows_cap = attention_rows(OP, (qg, k, v), dims)?.min(out_rows);
    let rows_cap = check_batch(OP, &batch, rows_cap)?;
    let qg = act(OP, "qg", qg, 0)?;
    let k = act(OP, "k", k, 0)?;
    let v = act(OP, "v", v, 0)?;
    let out = act_mut(OP, "out", out, 0)?;
    if rows_cap == 0 || batch.num_seqs == 0 {
        return Ok(());
    }
    // Head dims that are multiples of 16 up to 256 take the tensor-core kernel.
    if flash_variant(head_dim).is_some() {
        let inputs = FlashInputs::Dense { qg, k, v };
        return flash_attention(gpu, inputs, batch, (dims, false), OutBuf::F32(out));
    }
    let num_seqs = to_i32(OP, "num_seqs", batch.num_seqs)?;
    let q_heads_a = to_i32(OP, "q_heads", q_heads)?;
    let kv_heads_a = to_i32(OP, "kv_heads", kv_heads)?;
    let head_dim_a = to_i32(OP, "head_dim", head_dim)?;
    let rows_cap_a = to_u32(OP, "rows", rows_cap)?;
    let cfg = LaunchConfig {
        grid_dim: (rows_cap_a, to_u32(OP, "q_heads", q_heads)?, 1),
        block_dim: (ATTN_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: argument types match the kernel; it stays below rows_cap in every buffer.
    unsafe {
        gpu.launch(OP, "attention_gated", cfg, |launch| {
            launch
                .arg(qg)
                .arg(k)
                .arg(v)
                .arg(batch.cu_seqlens)
                .arg(&num_seqs)
                .arg(out)
                .arg(&q_heads_a)
                .arg(&kv_heads_a)
                .arg(&head_dim_a)
                .arg(&scale)
                .arg(&rows_cap_a);
        })
    }
}

/// [`attention`] at each sequence's last row (the flash kernel's last-row form only).
pub(crate) fn attention_last(
    gpu: &Gpu,
    (qg, k, v): Qkv<'_>,
    (batch, dims): (Varlen<'_, CudaSlice<u32>>, AttentionDims),
    out: &mut CudaBuf,
) -> KernelResult<()> {
    const OP: &str = "attention_last";
    let rows_cap = attention_rows(OP, (qg, k, v), dims)?;
    check_batch(OP, &batch, rows_cap)?;
    if flash_variant(dims.head_dim).is_none() {
        return Err(KernelError::invalid(
            OP,
            format!(
                "head_dim {} is not a multiple of 16 up to 256 (the last-row kernel's sizes)",
                dims.head_dim
            ),
        ));
    }
    let qg = act(OP, "qg", qg, 0)?;
    let k = act(OP, "k", k, 0)?;
    let v = act(OP, "v", v, 0)?;
    let out = act_mut(
        OP,
        "out",
        out,
        batch.num_seqs * dims.q_heads * dims.head_dim,
    )?;
    if batch.rows == 0 || batch.num_seqs == 0 {
        return Ok(());
    }
    let inputs = FlashInputs::Dense { qg, k, v };
    flash_attention(gpu, inputs, batch, (dims, true), OutBuf::F32(out))
}

pub(crate) fn gated_attention<B: CudaBuffers + ?Sized>(
    gpu: &Gpu,
    qkv_buf: &mut CudaBuf,
    prologue: QkPrologue<'_, B>,
    batch: Varlen<'_, CudaSlice<u32>>,
    (dims, last_only): (AttentionDims, bool),
    out_b: &mut CudaBuf,
) -> KernelResult<()> {
    const OP: &str = "gated_attention";
    let (q_heads, kv_heads, head_dim) = (dims.q_heads, dims.kv_heads, dims.head_dim);
    if kv_heads == 0 || q_heads % kv_heads != 0 || flash_variant(head_dim).is_none() {
        return Err(KernelError::invalid(
            OP,
            format!(
                "needs q_heads ({q_heads}) a multiple of kv_heads ({kv_heads}) and head_dim \
                 ({head_dim}) a multiple of 16 up to 256 (the flash kernel's sizes)"
            ),
        ));
    }
    let width = dims.stacked_width();
    let rows_cap = Strided::dense(width).rows_in(qkv_buf.len(), width);
    check_batch(OP, &batch, rows_cap)?;
    let rows = batch.rows;
    let out_rows = if last_only { batch.num_seqs } else { rows };
    let qkv = act_mut(OP, "qkv", qkv_buf, rows * width)?;
    let norms = (
        weight(OP, "q_norm", prologue.q_norm, head_dim)?,
        weight(OP, "k_norm", prologue.k_norm, head_dim)?,
    );
    let positions = idx(OP, "positions", prologue.positions, rows * 3)?;
    let (table, half) = RopeTable::new(OP, prologue.rope, head_dim)?;
    let out = out_buf(OP, "out", out_b, out_rows * q_heads * head_dim)?;
    if rows == 0 || batch.num_seqs == 0 {
        return Ok(());
    }
    let inputs = FlashInputs::Stacked {
        qkv,
        norms,
        positions,
        rope: (&table, half),
        eps: prologue.eps,
        carried: None,
    };
    flash_attention(gpu, inputs, batch, (dims, last_only), out)
}

/// [`crate::Backend::gated_attention_carried`] through the flash kernels, for the head dims they
/// take: the fused prologue (which also writes k normed and roped back into `qkv`), the prefix
/// rows into the joined keys, the prefix form of the flash kernel, then every row's k and v
/// copied out if asked. A resumed sequence thus computes as the whole prompt does: the same
/// kernels, the same bf16 operands, the same key tiles.
pub(crate) fn gated_attention_carried_flash<B: CudaBuffers + ?Sized>(
    gpu: &Gpu,
    qkv_buf: &mut CudaBuf,
    prologue: QkPrologue<'_, B>,
    (batch, dims): (Varlen<'_, CudaSlice<u32>>, AttentionDims),
    prefix: Option<PrefixRows<'_>>,
    output: AttentionOutput<'_, CudaBuf>,
) -> KernelResult<()> {
    const OP: &str = "gated_attention_carried";
    let CarriedShape {
        rows,
        width,
        kv_w,
        out_rows,
    } = CarriedShape::check(qkv_buf, &batch, dims, output.last_only)?;
    let (q_heads, head_dim) = (dims.q_heads, dims.head_dim);
    let (keys, prefix_rows) = match &prefix {
        Some(p) if p.rows > 0 => (
            Some((
                act(OP, "prefix k", p.k, p.rows * kv_w)?,
                act(OP, "prefix v", p.v, p.rows * kv_w)?,
            )),
            p.rows,
        ),
        _ => (None, 0),
    };
    let carried = Carried {
        cu_prefix: match &prefix {
            Some(p) => idx(OP, "cu_prefix", p.cu_prefix, batch.num_seqs + 1)?,
            None => batch.cu_seqlens,
        },
        keys,
        rows: prefix_rows,
    };
    let norms = (
        weight(OP, "q_norm", prologue.q_norm, head_dim)?,
        weight(OP, "k_norm", prologue.k_norm, head_dim)?,
    );
    let positions = idx(OP, "positions", prologue.positions, rows * 3)?;
    let (table, half) = RopeTable::new(OP, prologue.rope, head_dim)?;
    let out = out_buf(OP, "out", output.out, out_rows * q_heads * head_dim)?;
    let kv_out = kv_out_slices(output.kv, rows * kv_w)?;
    if rows == 0 || batch.num_seqs == 0 {
        return Ok(());
    }
    let qkv = act_mut(OP, "qkv", qkv_buf, rows * width)?;
    let inputs = FlashInputs::Stacked {
        qkv: &mut *qkv,
        norms,
        positions,
        rope: (&table, half),
        eps: prologue.eps,
        carried: Some(carried),
    };
    flash_attention(gpu, inputs, batch, (dims, output.last_only), out)?;
    match kv_out {
        Some(kv) => copy_kv_out(gpu, qkv, dims, rows, kv),
        None => Ok(()),
    }
}

/// The sizes of a [`crate::Backend::gated_attention_carried`] call, checked: the batch's rows
/// (within what the stacked projection holds), the stacked and k/v widths, and the output rows
/// (each sequence's last, or every row).
struct CarriedShape {
    rows: usize,
    width: usize,
    kv_w: usize,
    out_rows: usize,
}

impl CarriedShape {
    fn check(
        qkv: &CudaBuf,
        batch: &Varlen<'_, CudaSlice<u32>>,
        dims: AttentionDims,
        last_only: bool,
    ) -> KernelResult<Self> {
        const OP: &str = "gated_attention_carried";
        check_heads(OP, dims)?;
        let width = dims.stacked_width();
        check_batch(OP, batch, Strided::dense(width).rows_in(qkv.len(), width))?;
        Ok(Self {
            rows: batch.rows,
            width,
            kv_w: dims.kv_heads * dims.head_dim,
            out_rows: if last_only {
                batch.num_seqs
            } else {
                batch.rows
            },
        })
    }
}

/// The k and v outputs of [`crate::Backend::gated_attention_carried`], checked to hold `len`
/// values each.
fn kv_out_slices<'a>(
    kv: Option<(&'a mut CudaBuf, &'a mut CudaBuf)>,
    len: usize,
) -> KernelResult<Option<(&'a mut CudaSlice<f32>, &'a mut CudaSlice<f32>)>> {
    const OP: &str = "gated_attention_carried";
    kv.map(|(k_out, v_out)| {
        Ok((
            act_mut(OP, "k out", k_out, len)?,
            act_mut(OP, "v out", v_out, len)?,
        ))
    })
    .transpose()
}

/// Copies every row's k and v (the stacked projection's k and v columns) into dense rows: what
/// a snapshot keeps.
fn copy_kv_out(
    gpu: &Gpu,
    qkv: &CudaSlice<f32>,
    dims: AttentionDims,
    rows: usize,
    (k_out, v_out): (&mut CudaSlice<f32>, &mut CudaSlice<f32>),
) -> KernelResult<()> {
    const OP: &str = "gated_attention_carried";
    let [_, k_at, v_at] = dims.stacked_blocks();
    let stride = to_i32(OP, "stacked width", dims.stacked_width())?;
    let kv_w = dims.kv_heads * dims.head_dim;
    for (at, dst) in [(k_at, k_out), (v_at, v_out)] {
        copy_columns(gpu, (qkv, stride, at.offset), (kv_w, rows), dst)?;
    }
    Ok(())
}

/// Each sequence's prefix keys and values for [`attention_carried`]: rows `cu_prefix[s]..cu_prefix[s
/// + 1]` of `k` and `v` (dense, `kv_heads·head_dim` wide), `rows` in all.
pub(crate) struct PrefixRows<'a> {
    pub k: &'a CudaBuf,
    pub v: &'a CudaBuf,
    pub cu_prefix: &'a CudaSlice<u32>,
    pub rows: usize,
}

/// The attention core of [`crate::Backend::gated_attention_carried`] on a stacked projection whose
/// q and k are already normed and roped: every row's k and v copied out if asked, then the naive
/// kernel over each sequence's prefix rows and its own (every row, or each sequence's last).
pub(crate) fn attention_carried(
    gpu: &Gpu,
    qkv_buf: &CudaBuf,
    (batch, dims): (Varlen<'_, CudaSlice<u32>>, AttentionDims),
    prefix: Option<PrefixRows<'_>>,
    output: AttentionOutput<'_, CudaBuf>,
) -> KernelResult<()> {
    const OP: &str = "gated_attention_carried";
    let CarriedShape {
        rows,
        width,
        kv_w,
        out_rows,
    } = CarriedShape::check(qkv_buf, &batch, dims, output.last_only)?;
    let (q_heads, head_dim) = (dims.q_heads, dims.head_dim);
    let qkv = act(OP, "qkv", qkv_buf, rows * width)?;
    let prefix = match prefix {
        Some(p) => Some((
            act(OP, "prefix k", p.k, p.rows * kv_w)?,
            act(OP, "prefix v", p.v, p.rows * kv_w)?,
            idx(OP, "cu_prefix", p.cu_prefix, batch.num_seqs + 1)?,
            to_u32(OP, "prefix rows", p.rows)?,
        )),
        None => None,
    };
    let mut out = out_buf(OP, "out", output.out, out_rows * q_heads * head_dim)?;
    let [qg_at, k_at, v_at] = dims.stacked_blocks();
    let stride = to_i32(OP, "stacked width", width)?;
    if let Some(kv) = kv_out_slices(output.kv, rows * kv_w)? {
        copy_kv_out(gpu, qkv, dims, rows, kv)?;
    }
    if rows == 0 || batch.num_seqs == 0 {
        return Ok(());
    }
    // Absent prefix buffers are never read (has_prefix = 0): the projection stands in.
    let (pk, pv, cu_prefix, prefix_rows) = prefix.unwrap_or((qkv, qkv, batch.cu_seqlens, 0));
    let has_prefix = i32::from(prefix_rows > 0);
    let qg_off = to_i32(OP, "column offset", qg_at.offset)?;
    let k_off = to_i32(OP, "column offset", k_at.offset)?;
    let v_off = to_i32(OP, "column offset", v_at.offset)?;
    let num_seqs = to_i32(OP, "num_seqs", batch.num_seqs)?;
    let q_heads_a = to_i32(OP, "q_heads", q_heads)?;
    let kv_heads_a = to_i32(OP, "kv_heads", dims.kv_heads)?;
    let head_dim_a = to_i32(OP, "head_dim", head_dim)?;
    let rows_a = to_u32(OP, "rows", rows)?;
    let out_bf16 = i32::from(out.is_bf16());
    let last_only = i32::from(output.last_only);
    let cfg = LaunchConfig {
        grid_dim: (
            to_u32(OP, "blocks", out_rows)?,
            to_u32(OP, "q_heads", q_heads)?,
            1,
        ),
        block_dim: (ATTN_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: argument types match the kernel; it reads rows below `rows` of qkv and below
    // `prefix_rows` of the prefix (both held, checked above) and writes out_rows rows of out.
    unsafe {
        gpu.launch(OP, "attention_gated_prefix", cfg, |launch| {
            launch
                .arg(qkv)
                .arg(&stride)
                .arg(&qg_off)
                .arg(&k_off)
                .arg(&v_off)
                .arg(pk)
                .arg(pv)
                .arg(cu_prefix)
                .arg(&has_prefix)
                .arg(&prefix_rows)
                .arg(batch.cu_seqlens)
                .arg(&num_seqs);
            out.push(launch);
            launch
                .arg(&out_bf16)
                .arg(&q_heads_a)
                .arg(&kv_heads_a)
                .arg(&head_dim_a)
                .arg(&dims.scale)
                .arg(&rows_a)
                .arg(&last_only);
        })
    }
}

/// Copies columns `offset..offset + width` of `rows` rows `stride` wide into dense rows of `width`.
fn copy_columns(
    gpu: &Gpu,
    (x, stride, offset): (&CudaSlice<f32>, i32, usize),
    (width, rows): (usize, usize),
    out: &mut CudaSlice<f32>,
) -> KernelResult<()> {
    const OP: &str = "gated_attention_carried";
    if width * rows == 0 {
        return Ok(());
    }
    let (offset, width_a, rows_a) = (
        to_i32(OP, "column offset", offset)?,
        to_i32(OP, "width", width)?,
        to_i32(OP, "rows", rows)?,
    );
    // SAFETY: argument types match the kernel; x holds `rows` rows of `stride` (the caller checked
    // it) and out rows·width values (act_mut checked it).
    unsafe {
        gpu.launch(
            OP,
            "copy_columns",
            linear(OP, width * rows, BLOCK)?,
            |launch| {
                launch
                    .arg(x)
                    .arg(&stride)
                    .arg(&offset)
                    .arg(out)
                    .arg(&width_a)
                    .arg(&rows_a);
            },
        )
    }
}
