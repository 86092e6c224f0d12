//! The shapes of the attention and delta-rule ops, and the delta rule's gate inputs and states.

use super::{Buffers, HeadLayout, Strided};

/// The inputs of [`Backend::delta_gates`] (as one argument of the fused
/// [`Backend::conv1d_silu_l2_gates`]).
pub struct DeltaGates<'a, Buf> {
    pub b: &'a Buf,
    pub b_at: Strided,
    pub a: &'a Buf,
    pub a_at: Strided,
    pub a_log: &'a Buf,
    pub dt_bias: &'a Buf,
    pub heads: usize,
}

impl<Buf> Clone for DeltaGates<'_, Buf> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<Buf> Copy for DeltaGates<'_, Buf> {}

/// Shapes of gated causal GQA attention.
///
/// `qg` rows are `[q_heads][2·head_dim]`: per head the query, then its sigmoid output gate. `k` and
/// `v` rows are `[kv_heads][head_dim]`. Query head `h` reads kv head `h / (q_heads / kv_heads)`.
/// The output row is `[q_heads][head_dim]`, already multiplied by `sigmoid(gate)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionDims {
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Score scale, `head_dim^-0.5` for Qwen3.5.
    pub scale: f32,
}

impl AttentionDims {
    /// Width of a row of the stacked projection [`Backend::gated_attention`] reads: the q|gate
    /// blocks of every query head (as `qg`), then the k heads, then the v heads (`q_proj`,
    /// `k_proj` and `v_proj` as one GEMM).
    pub fn stacked_width(&self) -> usize {
        2 * (self.q_heads + self.kv_heads) * self.head_dim
    }

    /// Where `qg`, `k` and `v` sit in a stacked row.
    pub fn stacked_blocks(&self) -> [Strided; 3] {
        let (row, qg, kv) = (
            self.stacked_width(),
            2 * self.q_heads * self.head_dim,
            self.kv_heads * self.head_dim,
        );
        [
            Strided::cols(row, 0),
            Strided::cols(row, qg),
            Strided::cols(row, qg + kv),
        ]
    }

    /// The query heads of a stacked row (each followed by its gate).
    pub fn stacked_q_heads(&self) -> HeadLayout {
        HeadLayout {
            heads: self.q_heads,
            head_dim: self.head_dim,
            head_stride: 2 * self.head_dim,
            row_stride: self.stacked_width(),
            offset: 0,
        }
    }

    /// The key heads of a stacked row.
    pub fn stacked_k_heads(&self) -> HeadLayout {
        HeadLayout {
            heads: self.kv_heads,
            head_dim: self.head_dim,
            head_stride: self.head_dim,
            row_stride: self.stacked_width(),
            offset: 2 * self.q_heads * self.head_dim,
        }
    }
}

/// Shapes of the gated delta rule.
///
/// `qkv` rows are `[q: k_heads·k_dim][k: k_heads·k_dim][v: v_heads·v_dim]` (the conv output of a
/// Gated DeltaNet layer); q and k must already be L2-normalised (see [`Backend::l2_norm`]); the op
/// scales q by `k_dim^-0.5` itself. Value head `h` reads q/k head `h / (v_heads / k_heads)`.
/// `beta` and `g` are `[rows, v_heads]`; the output is `[rows, v_heads·v_dim]`. States are f32
/// `[num_seqs, v_heads, k_dim, v_dim]` (`S[k][v]`, so `o = Sᵀ q`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaDims {
    pub k_heads: usize,
    pub v_heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
}

impl DeltaDims {
    /// Width of a `qkv` row.
    pub fn qkv_width(&self) -> usize {
        2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim
    }

    /// Values in one sequence's recurrent state.
    pub fn state_len(&self) -> usize {
        self.v_heads * self.k_dim * self.v_dim
    }

    /// The q and k blocks of a dense `qkv` row, as `2·k_heads` heads of `k_dim` (the heads a Gated
    /// DeltaNet layer L2-normalises after its conv).
    pub fn qk_layout(&self) -> HeadLayout {
        HeadLayout {
            heads: 2 * self.k_heads,
            head_dim: self.k_dim,
            head_stride: self.k_dim,
            row_stride: self.qkv_width(),
            offset: 0,
        }
    }
}

/// Recurrent state passed into and out of [`Backend::gated_delta_rule_chunked`] and
/// [`Backend::gated_delta_rule_recurrent`]. Either may be absent: no initial state means zeros.
pub struct DeltaState<'a, B: Buffers + ?Sized> {
    pub initial: Option<&'a B::Buf>,
    pub final_out: Option<&'a mut B::Buf>,
    /// Per sequence (`num_seqs` values): after how many of its tokens `final_out` takes the state
    /// (`None`: after all of them), so a prefix's snapshot comes out of the pass that runs on past
    /// it. The CUDA chunked form takes it at a multiple of its 64-token chunk or at the end only.
    pub final_at: Option<&'a B::Idx>,
}
