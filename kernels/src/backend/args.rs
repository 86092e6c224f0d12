//! Argument structs of the [`Backend`](super::Backend) ops: the parameters that always travel
//! together, named once, so that no call passes eight positional sizes in the right order by luck.

use super::{Buffers, DeltaGates, DeltaState, HeadLayout, Rope, Store, Strided};

/// Copy for structs of shared references (a derive would ask `Buf: Copy`).
macro_rules! copy_by_reference {
    ($($name:ident),*) => {$(
        impl<Buf> Clone for $name<'_, Buf> {
            fn clone(&self) -> Self {
                *self
            }
        }
        impl<Buf> Copy for $name<'_, Buf> {}
    )*};
}

copy_by_reference!(
    CopyPart,
    RowNorm,
    Projection,
    GatedNorm,
    Conv1d,
    DeltaInputs,
    DeltaNetInput
);

/// One copy of [`Backend::copy_many`](super::Backend::copy_many): `len` values of `src` from
/// `src_at` into its `dst`-th destination from `dst_at`.
pub struct CopyPart<'a, Buf> {
    pub src: &'a Buf,
    pub src_at: usize,
    pub dst: usize,
    pub dst_at: usize,
    pub len: usize,
}

/// A row-wise norm over `rows` rows of `dim` with its weight: the weight and the row shape come from
/// one layer's config together and every norm checks them together.
pub struct RowNorm<'a, Buf> {
    pub weight: &'a Buf,
    pub rows: usize,
    pub dim: usize,
    pub eps: f32,
}

impl<Buf> RowNorm<'_, Buf> {
    /// Values of the `[rows, dim]` input and output.
    pub fn len(&self) -> usize {
        self.rows * self.dim
    }

    /// Whether the norm has nothing to compute.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The sizes of `y = x Wᵀ` (`x: [rows, in_dim]`, `w: [out_dim, in_dim]`, `y: [rows, out_dim]`):
/// three sizes of one type, which a struct keeps from being swapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmShape {
    pub rows: usize,
    pub in_dim: usize,
    pub out_dim: usize,
}

impl GemmShape {
    pub fn new(rows: usize, in_dim: usize, out_dim: usize) -> Self {
        Self {
            rows,
            in_dim,
            out_dim,
        }
    }

    /// Values `x` must hold.
    pub fn x_len(&self) -> usize {
        self.rows * self.in_dim
    }

    /// Values `w` must hold.
    pub fn w_len(&self) -> usize {
        self.out_dim * self.in_dim
    }

    /// Values `y` must hold.
    pub fn y_len(&self) -> usize {
        self.rows * self.out_dim
    }
}

/// The projection a fused op ends with (`y = · Wᵀ` or `y += · Wᵀ`): its weight, width and store
/// come from one linear layer; the rows and input width from the op before it.
pub struct Projection<'a, Buf> {
    pub w: &'a Buf,
    pub out_dim: usize,
    pub store: Store,
}

impl<Buf> Projection<'_, Buf> {
    /// The GEMM over `rows` rows of `in_dim`.
    pub fn shape(&self, rows: usize, in_dim: usize) -> GemmShape {
        GemmShape::new(rows, in_dim, self.out_dim)
    }
}

/// A gated RMSNorm (a Gated DeltaNet layer's output norm): its gate `z` (rows of `heads·dim` at
/// `z_at`, a column block of the stacked in-projection), the weight shared by all heads, the shape
/// and epsilon. The norm and the fused norm-then-GEMM take the same set.
pub struct GatedNorm<'a, Buf> {
    pub z: &'a Buf,
    pub z_at: Strided,
    pub weight: &'a Buf,
    pub rows: usize,
    pub heads: usize,
    pub dim: usize,
    pub eps: f32,
}

impl<Buf> GatedNorm<'_, Buf> {
    /// Width of a row of `x`: every head.
    pub fn width(&self) -> usize {
        self.heads * self.dim
    }

    /// Rows of `dim` normalised on their own (one per head and row).
    pub fn norm_rows(&self) -> usize {
        self.rows * self.heads
    }
}

/// A causal depthwise conv: its input (rows of `channels` at `x_at`, possibly a column block of a
/// stacked projection) and its `[channels, kernel]` weight, which size each other.
pub struct Conv1d<'a, Buf> {
    pub x: &'a Buf,
    pub x_at: Strided,
    pub weight: &'a Buf,
    pub channels: usize,
    pub kernel: usize,
}

impl<Buf> Conv1d<'_, Buf> {
    /// Values of one sequence's carried window (`kernel − 1` rows of `channels`; 0 for no taps).
    pub fn window_len(&self) -> usize {
        self.kernel.saturating_sub(1) * self.channels
    }
}

/// The conv's window carried across calls of one sequence: read before the sequence's first row,
/// written after its last. Either may be absent (zeros in, nothing out).
pub struct ConvWindow<'a, Buf, Idx> {
    pub input: Option<&'a Buf>,
    pub output: Option<&'a mut Buf>,
    /// Per sequence: after how many of its tokens `output` takes the window (`None`: after all of
    /// them), as [`DeltaState::final_at`] for the state.
    pub output_at: Option<&'a Idx>,
}

impl<Buf, Idx> ConvWindow<'_, Buf, Idx> {
    /// No window: every sequence starts from zeros and none is resumed.
    pub fn none() -> Self {
        Self {
            input: None,
            output: None,
            output_at: None,
        }
    }
}

/// What a Gated DeltaNet layer's core carries across calls of one sequence: the recurrent state
/// and the conv window, each in and out (see [`DeltaState`] and [`ConvWindow`] for the layouts).
/// A sequence resumed from a snapshot reads both; a sequence whose end is snapshotted writes both.
pub struct DeltaCarry<'a, B: Buffers + ?Sized> {
    pub state: DeltaState<'a, B>,
    pub window: ConvWindow<'a, B::Buf, B::Idx>,
}

impl<B: Buffers + ?Sized> DeltaCarry<'_, B> {
    /// Whether anything is carried in or out.
    pub fn is_some(&self) -> bool {
        self.state.initial.is_some()
            || self.state.final_out.is_some()
            || self.window.input.is_some()
            || self.window.output.is_some()
    }
}

/// Keys and values an attention layer attends to before each sequence's own rows: the cached
/// prefix of every sequence, packed back to back. `k` and `v` rows are `[kv_heads·head_dim]` (k
/// after its head norm and rope at the prefix positions, v as projected); sequence `s` owns rows
/// `cu_prefix[s]..cu_prefix[s + 1]` (`num_seqs + 1` entries in an index buffer, as `cu_seqlens`;
/// an empty range is a sequence with no prefix). `rows` is `cu_prefix[num_seqs]`, known on the
/// host. The batch's own positions must continue the prefix's (the op ropes only its own rows).
pub struct PrefixKv<'a, B: Buffers + ?Sized> {
    pub k: &'a B::Buf,
    pub v: &'a B::Buf,
    pub cu_prefix: &'a B::Idx,
    pub rows: usize,
}

impl<B: Buffers + ?Sized> Clone for PrefixKv<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B: Buffers + ?Sized> Copy for PrefixKv<'_, B> {}

/// Where a resumable attention layer writes: `out` as [`Backend::gated_attention`] does (every row,
/// or with `last_only` each sequence's last), and optionally every row's key and value (`[rows,
/// kv_heads·head_dim]` each, k after its norm and rope): the rows a snapshot of the batch keeps.
///
/// [`Backend::gated_attention`]: super::Backend::gated_attention
pub struct AttentionOutput<'a, Buf> {
    pub out: &'a mut Buf,
    pub last_only: bool,
    pub kv: Option<(&'a mut Buf, &'a mut Buf)>,
}

/// The heads an op L2-normalises in place and the norm's epsilon.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct L2Heads {
    pub layout: HeadLayout,
    pub eps: f32,
}

/// Where the delta gates go: `beta` and `g`, dense `[rows, heads]`, written together.
pub struct GateOutputs<'a, Buf> {
    pub beta: &'a mut Buf,
    pub g: &'a mut Buf,
}

/// The delta rule's per-row inputs (`qkv`, `beta`, `g` of one batch), read together by every
/// delta-rule kernel.
pub struct DeltaInputs<'a, Buf> {
    pub qkv: &'a Buf,
    pub beta: &'a Buf,
    pub g: &'a Buf,
}

/// What a Gated DeltaNet layer's core reads: the q|k|v block of its stacked in-projection at
/// `x_at`, the conv weight (`kernel` taps), the q/k L2 norm's epsilon and the gates' inputs. A
/// fusing backend reads them all in its first kernel.
pub struct DeltaNetInput<'a, Buf> {
    pub x: &'a Buf,
    pub x_at: Strided,
    pub conv_weight: &'a Buf,
    pub kernel: usize,
    pub l2_eps: f32,
    pub gates: DeltaGates<'a, Buf>,
}

/// Scratch of a Gated DeltaNet layer's core as its separate ops: the conv output, beta and g.
pub struct DeltaNetScratch<'a, Buf> {
    pub conv: &'a mut Buf,
    pub beta: &'a mut Buf,
    pub g: &'a mut Buf,
}

/// The q and k head norms and the rope an attention layer applies before attending: its weights,
/// the batch's positions (`[rows, 3]`) and the config they come with.
pub struct QkPrologue<'a, B: Buffers + ?Sized> {
    pub q_norm: &'a B::Buf,
    pub k_norm: &'a B::Buf,
    pub positions: &'a B::Idx,
    pub rope: &'a Rope,
    pub eps: f32,
}

impl<B: Buffers + ?Sized> Clone for QkPrologue<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B: Buffers + ?Sized> Copy for QkPrologue<'_, B> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gemm_shape_sizes_each_operand_by_its_own_dims() {
        let shape = GemmShape::new(3, 5, 7);
        assert_eq!((shape.x_len(), shape.w_len(), shape.y_len()), (15, 35, 21));
        let proj = Projection {
            w: &(),
            out_dim: 7,
            store: Store::Add,
        };
        assert_eq!(proj.shape(3, 5), shape);
    }

    #[test]
    fn a_gated_norm_normalises_every_head_of_every_row() {
        let norm = GatedNorm {
            z: &(),
            z_at: Strided::dense(8),
            weight: &(),
            rows: 3,
            heads: 2,
            dim: 4,
            eps: 1e-6,
        };
        assert_eq!((norm.width(), norm.norm_rows()), (8, 6));
    }

    #[test]
    fn a_conv_window_holds_all_taps_but_the_current_row() {
        let conv = |kernel| Conv1d {
            x: &(),
            x_at: Strided::dense(6),
            weight: &(),
            channels: 6,
            kernel,
        };
        assert_eq!(conv(4).window_len(), 18);
        assert_eq!(conv(1).window_len(), 0);
        assert_eq!(conv(0).window_len(), 0);
        let norm = RowNorm {
            weight: &(),
            rows: 0,
            dim: 5,
            eps: 1e-6,
        };
        assert!(norm.is_empty());
    }
}
