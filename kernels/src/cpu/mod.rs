//! The CPU reference backend: plain f32 ops over `Vec<f32>` / `Vec<u32>`, written for clarity and
//! exactness first. Every other backend is tested against it.

mod attention;
mod conv;
mod delta;
mod dense;
mod rope;
mod vision;

use std::ops::Range;

use crate::backend::{
    captured_shape, delta_net_core_carried_apart, stacked_norm_rope, AttentionDims,
    AttentionOutput, Backend, Buffers, Conv1d, ConvWindow, DeltaCarry, DeltaDims, DeltaGates,
    DeltaInputs, DeltaNetInput, DeltaNetScratch, DeltaState, GateOutputs, GatedNorm, Gelu,
    GemmShape, HeadLayout, KernelResult, PassShape, PrefixKv, QkPrologue, Rope, RowNorm, Store,
    Varlen, VisionBackend,
};
use crate::error::KernelError;
use crate::patches::{check_patch_rows, pack_patch_rows, PatchRows, PATCH_VALUES};

/// The CPU backend. Stateless; buffers are ordinary vectors.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend {
    /// Pads plain passes as a backend that captures them does ([`Backend::pass_shape`]).
    pads_passes: bool,
}

impl CpuBackend {
    pub fn new() -> Self {
        Self::default()
    }

    /// A CPU backend that runs each plain pass padded to the shape a CUDA graph would be captured
    /// at ([`captured_shape`]): the oracle for what padding does to answers (nothing).
    pub fn padding_passes() -> Self {
        Self { pads_passes: true }
    }
}

/// Fails unless `buf` holds at least `need` values.
pub(crate) fn check_len<T>(
    op: &'static str,
    what: &str,
    buf: &[T],
    need: usize,
) -> KernelResult<()> {
    if buf.len() < need {
        return Err(KernelError::invalid(
            op,
            format!("{what} holds {} values, needs {need}", buf.len()),
        ));
    }
    Ok(())
}

/// Fails unless `x` (named `what`), the norm's weight and `out` hold what a row norm of `norm`
/// reads and writes: the checks every row norm makes first.
pub(crate) fn check_row_norm(
    op: &'static str,
    what: &str,
    x: &[f32],
    norm: &RowNorm<'_, Vec<f32>>,
    out: &[f32],
) -> KernelResult<()> {
    check_len(op, what, x, norm.len())?;
    check_len(op, "weight", norm.weight, norm.dim)?;
    check_len(op, "out", out, norm.len())
}

/// The row ranges of each sequence, checked: starts at 0, never decreases, ends within `rows_cap`.
pub(crate) fn seq_ranges(
    op: &'static str,
    batch: Varlen<'_, Vec<u32>>,
    rows_cap: usize,
) -> KernelResult<Vec<Range<usize>>> {
    let cu = batch.cu_seqlens;
    check_len(op, "cu_seqlens", cu, batch.num_seqs + 1)?;
    if cu[0] != 0 {
        return Err(KernelError::invalid(
            op,
            format!("cu_seqlens starts at {}, not 0", cu[0]),
        ));
    }
    let mut ranges = Vec::with_capacity(batch.num_seqs);
    for s in 0..batch.num_seqs {
        let (a, b) = (cu[s] as usize, cu[s + 1] as usize);
        if b < a {
            return Err(KernelError::invalid(
                op,
                format!("cu_seqlens decreases at sequence {s}"),
            ));
        }
        ranges.push(a..b);
    }
    // A padded pass ([`crate::backend::PassShape`]) has rows past the last offset, in no sequence.
    let total = cu[batch.num_seqs] as usize;
    if total > batch.rows {
        return Err(KernelError::invalid(
            op,
            format!(
                "cu_seqlens covers {total} rows, the batch says {}",
                batch.rows
            ),
        ));
    }
    if total > rows_cap {
        return Err(KernelError::invalid(
            op,
            format!("cu_seqlens covers {total} rows, buffers hold {rows_cap}"),
        ));
    }
    Ok(ranges)
}

/// Replaces each score by `exp(score − max)` and returns their sum (in order): a softmax's
/// numerators and denominator, shared by both attentions.
pub(crate) fn exp_shifted(scores: &mut [f32], max: f32) -> f32 {
    let mut denom = 0.0f32;
    for p in scores.iter_mut() {
        *p = (*p - max).exp();
        denom += *p;
    }
    denom
}

pub(crate) fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

impl Buffers for CpuBackend {
    type Buf = Vec<f32>;
    type Idx = Vec<u32>;
}

impl Backend for CpuBackend {
    fn name(&self) -> String {
        "cpu".to_string()
    }

    fn pass_shape(&self, rows: usize, seqs: usize) -> Option<PassShape> {
        self.pads_passes
            .then(|| captured_shape(rows, seqs))
            .flatten()
    }

    fn alloc(&self, len: usize) -> KernelResult<Vec<f32>> {
        Ok(vec![0.0; len])
    }

    fn alloc_idx(&self, len: usize) -> KernelResult<Vec<u32>> {
        Ok(vec![0; len])
    }

    fn upload(&self, data: &[f32]) -> KernelResult<Vec<f32>> {
        Ok(data.to_vec())
    }

    fn write(&self, dst: &mut Vec<f32>, data: &[f32]) -> KernelResult<()> {
        self.write_parts(dst, &[data])
    }

    fn write_parts(&self, dst: &mut Vec<f32>, parts: &[&[f32]]) -> KernelResult<()> {
        let total = parts.iter().map(|p| p.len()).sum();
        check_len("write", "destination", dst, total)?;
        let mut at = 0;
        for part in parts {
            dst[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        Ok(())
    }

    fn write_idx(&self, dst: &mut Vec<u32>, data: &[u32]) -> KernelResult<()> {
        check_len("write_idx", "destination", dst, data.len())?;
        dst[..data.len()].copy_from_slice(data);
        Ok(())
    }

    fn read(&self, src: &Vec<f32>, len: usize) -> KernelResult<Vec<f32>> {
        check_len("read", "source", src, len)?;
        Ok(src[..len].to_vec())
    }

    fn copy(
        &self,
        src: &Vec<f32>,
        src_at: usize,
        dst: &mut Vec<f32>,
        dst_at: usize,
        len: usize,
    ) -> KernelResult<()> {
        check_len("copy", "source", src, src_at + len)?;
        check_len("copy", "destination", dst, dst_at + len)?;
        dst[dst_at..dst_at + len].copy_from_slice(&src[src_at..src_at + len]);
        Ok(())
    }

    fn embedding(
        &self,
        table: &Vec<f32>,
        vocab: usize,
        ids: &Vec<u32>,
        rows: usize,
        dim: usize,
        out: &mut Vec<f32>,
    ) -> KernelResult<()> {
        dense::embedding(table, vocab, ids, rows, dim, out)
    }

    fn rms_norm(
        &self,
        x: &Vec<f32>,
        norm: RowNorm<'_, Vec<f32>>,
        out: &mut Vec<f32>,
    ) -> KernelResult<()> {
        dense::rms_norm(x, norm, out)
    }

    fn add_rms_norm(
        &self,
        residual: &mut Vec<f32>,
        delta: &Vec<f32>,
        norm: RowNorm<'_, Vec<f32>>,
        out: &mut Vec<f32>,
    ) -> KernelResult<()> {
        dense::add_rms_norm(residual, delta, norm, out)
    }

    fn gemm_to(
        &self,
        x: &Vec<f32>,
        w: &Vec<f32>,
        shape: GemmShape,
        store: Store,
        y: &mut Vec<f32>,
    ) -> KernelResult<()> {
        dense::gemm(x, w, shape, store, y)
    }

    fn head_rms_norm(
        &self,
        x: &mut Vec<f32>,
        weight: &Vec<f32>,
        layout: HeadLayout,
        rows: usize,
        eps: f32,
    ) -> KernelResult<()> {
        dense::head_rms_norm(x, weight, layout, rows, eps)
    }

    fn rope(
        &self,
        x: &mut Vec<f32>,
        layout: HeadLayout,
        positions: &Vec<u32>,
        rows: usize,
        rope: &Rope,
    ) -> KernelResult<()> {
        rope::apply(x, layout, positions, rows, rope)
    }

    fn attention(
        &self,
        qg: &Vec<f32>,
        k: &Vec<f32>,
        v: &Vec<f32>,
        batch: Varlen<'_, Vec<u32>>,
        dims: AttentionDims,
        out: &mut Vec<f32>,
    ) -> KernelResult<()> {
        attention::gated_causal_gqa(qg, k, v, batch, dims, out)
    }

    fn attention_last(
        &self,
        qg: &Vec<f32>,
        k: &Vec<f32>,
        v: &Vec<f32>,
        batch: Varlen<'_, Vec<u32>>,
        dims: AttentionDims,
        out: &mut Vec<f32>,
    ) -> KernelResult<()> {
        // The reference computes every row, then keeps the last ones. `qg` holds q and gate, so half
        // its length is every row's output (the attention checks the rows against it).
        let mut all = vec![0.0; qg.len() / 2];
        attention::gated_causal_gqa(qg, k, v, batch, dims, &mut all)?;
        dense::gather_last(&all, batch, dims.q_heads * dims.head_dim, out)
    }

    fn gated_attention(
        &self,
        qkv: &mut Vec<f32>,
        prologue: QkPrologue<'_, Self>,
        batch: Varlen<'_, Vec<u32>>,
        dims: AttentionDims,
        last_only: bool,
        out: &mut Vec<f32>,
    ) -> KernelResult<()> {
        let output = AttentionOutput {
            out,
            last_only,
            kv: None,
        };
        self.gated_attention_carried(qkv, prologue, batch, dims, None, output)
    }

    fn gated_attention_carried(
        &self,
        qkv: &mut Vec<f32>,
        prologue: QkPrologue<'_, Self>,
        batch: Varlen<'_, Vec<u32>>,
        dims: AttentionDims,
        prefix: Option<PrefixKv<'_, Self>>,
        output: AttentionOutput<'_, Vec<f32>>,
    ) -> KernelResult<()> {
        let rows = batch.rows;
        stacked_norm_rope(self, qkv, prologue, (dims, rows))?;
        let [qg_at, kv_at, v_at] = dims.stacked_blocks();
        if let Some((k_out, v_out)) = output.kv {
            let kv_w = dims.kv_heads * dims.head_dim;
            check_len("gated_attention", "qkv", qkv, v_at.required_len(rows, kv_w))?;
            for (at, dst, what) in [(kv_at, k_out, "k out"), (v_at, v_out, "v out")] {
                check_len("gated_attention", what, dst, rows * kv_w)?;
                for t in 0..rows {
                    dst[t * kv_w..][..kv_w].copy_from_slice(&qkv[at.at(t, 0)..][..kv_w]);
                }
            }
        }
        let prefix = prefix.map(|p| attention::Prefix {
            k: p.k,
            v: p.v,
            cu: p.cu_prefix,
            rows: p.rows,
        });
        let inputs = [(&qkv[..], qg_at), (&qkv[..], kv_at), (&qkv[..], v_at)];
        if !output.last_only {
            return attention::gated_causal_gqa_at(inputs, batch, dims, prefix, output.out);
        }
        let out_w = dims.q_heads * dims.head_dim;
        let mut all = vec![0.0; rows * out_w];
        attention::gated_causal_gqa_at(inputs, batch, dims, prefix, &mut all)?;
        dense::gather_last(&all, batch, out_w, output.out)
    }

    fn conv1d_silu(
        &self,
        conv: Conv1d<'_, Vec<f32>>,
        batch: Varlen<'_, Vec<u32>>,
        window: ConvWindow<'_, Vec<f32>, Vec<u32>>,
        out: &mut Vec<f32>,
    ) -> KernelResult<()> {
        conv::causal_conv1d_silu(conv, batch, window, out)
    }

    fn l2_norm(
        &self,
        x: &mut Vec<f32>,
        layout: HeadLayout,
        rows: usize,
        eps: f32,
    ) -> KernelResult<()> {
        dense::l2_norm(x, layout, rows, eps)
    }

    fn delta_gates(
        &self,
        gates: DeltaGates<'_, Vec<f32>>,
        rows: usize,
        out: GateOutputs<'_, Vec<f32>>,
    ) -> KernelResult<()> {
        dense::delta_gates(gates, rows, out)
    }

    fn gated_delta_rule_chunked(
        &self,
        inputs: DeltaInputs<'_, Vec<f32>>,
        batch: Varlen<'_, Vec<u32>>,
        dims: DeltaDims,
        state: DeltaState<'_, Self>,
        out: &mut Vec<f32>,
    ) -> KernelResult<()> {
        delta::run(delta::Mode::Chunked, inputs, batch, dims, state, out)
    }

    fn delta_net_core_carried(
        &self,
        input: DeltaNetInput<'_, Vec<f32>>,
        batch: Varlen<'_, Vec<u32>>,
        dims: DeltaDims,
        carry: DeltaCarry<'_, Self>,
        scratch: DeltaNetScratch<'_, Vec<f32>>,
        out: &mut Vec<f32>,
    ) -> KernelResult<()> {
        delta_net_core_carried_apart(self, input, (batch, dims), carry, scratch, out)
    }

    fn gated_delta_rule_recurrent(
        &self,
        inputs: DeltaInputs<'_, Vec<f32>>,
        batch: Varlen<'_, Vec<u32>>,
        dims: DeltaDims,
        state: DeltaState<'_, Self>,
        out: &mut Vec<f32>,
    ) -> KernelResult<()> {
        delta::run(delta::Mode::Recurrent, inputs, batch, dims, state, out)
    }

    fn gated_rms_norm(&self, x: &mut Vec<f32>, norm: GatedNorm<'_, Vec<f32>>) -> KernelResult<()> {
        dense::gated_rms_norm(x, norm)
    }

    fn swiglu(
        &self,
        gate_up: &Vec<f32>,
        rows: usize,
        inter: usize,
        out: &mut Vec<f32>,
    ) -> KernelResult<()> {
        dense::swiglu(gate_up, rows, inter, out)
    }

    fn scatter_rows(
        &self,
        rows: &Vec<f32>,
        slots: &Vec<u32>,
        count: usize,
        width: usize,
        out: &mut Vec<f32>,
    ) -> KernelResult<()> {
        dense::scatter_rows(rows, slots, count, width, out)
    }

    fn gather_last(
        &self,
        x: &Vec<f32>,
        batch: Varlen<'_, Vec<u32>>,
        dim: usize,
        out: &mut Vec<f32>,
    ) -> KernelResult<()> {
        dense::gather_last(x, batch, dim, out)
    }
}

impl VisionBackend for CpuBackend {
    fn write_patch_rows(&self, dst: &mut Vec<f32>, images: &[PatchRows<'_>]) -> KernelResult<()> {
        check_patch_rows("write_patch_rows", images, dst.len())?;
        for part in images {
            pack_patch_rows(part.image, &mut dst[part.first_row * PATCH_VALUES..]);
        }
        Ok(())
    }

    fn layer_norm(
        &self,
        x: &Vec<f32>,
        norm: RowNorm<'_, Vec<f32>>,
        bias: &Vec<f32>,
        out: &mut Vec<f32>,
    ) -> KernelResult<()> {
        vision::layer_norm(x, norm, bias, out)
    }

    fn add_bias(
        &self,
        x: &mut Vec<f32>,
        bias: &Vec<f32>,
        rows: usize,
        dim: usize,
    ) -> KernelResult<()> {
        vision::add_bias(x, bias, rows, dim)
    }

    fn add_in_place(&self, x: &mut Vec<f32>, delta: &Vec<f32>, len: usize) -> KernelResult<()> {
        vision::add_in_place(x, delta, len)
    }

    fn gelu(&self, x: &mut Vec<f32>, len: usize, kind: Gelu) -> KernelResult<()> {
        vision::gelu(x, len, kind)
    }

    fn rope_axial(
        &self,
        x: &mut Vec<f32>,
        layout: HeadLayout,
        positions: &Vec<u32>,
        rows: usize,
        theta: f32,
    ) -> KernelResult<()> {
        vision::rope_axial(x, layout, positions, rows, theta)
    }

    fn attention_bidirectional(
        &self,
        qkv: &Vec<f32>,
        batch: Varlen<'_, Vec<u32>>,
        heads: usize,
        head_dim: usize,
        scale: f32,
        out: &mut Vec<f32>,
    ) -> KernelResult<()> {
        vision::attention_bidirectional(qkv, batch, heads, head_dim, scale, out)
    }
}
