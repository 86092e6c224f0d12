//! The Qwen3.5 text forward pass, written once over the [`Backend`] interface.
//!
//! A [`TextModel`] uploads the weights once and allocates every activation buffer once, for the
//! largest batch it will see ([`BatchLimits`]). [`TextModel::forward_last`] runs a packed batch of
//! sequences (no padding) and returns, per sequence, the final-normed hidden state at its last
//! position: the input of the letter readout.
//!
//! [`TextModel::forward_segments`] runs the same pass over sequences that may resume from a
//! [`PrefixState`] and may ask for the snapshot at their end (see [`crate::prefix`]).
//!
//! Layer skeleton (pre-norm): `h += mixer(norm₁(h)); h += mlp(norm₂(h))`, with the mixer a Gated
//! DeltaNet or gated full attention as `layer_types` says; then the final norm.

use anyhow::{anyhow, bail, ensure, Context, Result};
use instinct_kernels::backend::{
    captured_prefix_rows, padded_offsets, CarryShape, CAPTURED_MAX_PREFIX_ROWS, CAPTURED_MAX_ROWS,
};
use instinct_kernels::{
    AttentionDims, AttentionOutput, Backend, Buffers, ConvWindow, CopyPart, DeltaCarry, DeltaDims,
    DeltaGates, DeltaNetInput, DeltaNetScratch, DeltaState, GatedNorm, GemmShape, KernelError,
    PassShape, PrefixKv, Projection, QkPrologue, Rope, RowNorm, Store, Strided, Varlen,
};

use crate::config::{LayerKind, TextConfig};
use crate::prefix::{LayerShape, LayerState, PrefixState, SnapshotCost, Values};
use crate::weights::{HostTensor, LayerWeights, MixerWeights, TextWeights};

/// The largest batch a model's buffers are sized for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchLimits {
    /// Total tokens over all sequences of one batch.
    pub max_tokens: usize,
    /// Sequences in one batch.
    pub max_seqs: usize,
}

impl BatchLimits {
    pub const fn new(max_tokens: usize, max_seqs: usize) -> Self {
        Self {
            max_tokens,
            max_seqs,
        }
    }

    /// Refuses a batch of `tokens` tokens in `seqs` sequences that these limits do not hold.
    /// Batches are planned by the scheduler to fit; nothing here splits one.
    pub fn check(&self, tokens: usize, seqs: usize) -> Result<(), OverLimits> {
        if tokens <= self.max_tokens && seqs <= self.max_seqs {
            Ok(())
        } else {
            Err(OverLimits {
                tokens,
                seqs,
                limits: *self,
            })
        }
    }
}

/// A batch larger than the buffers allocated for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "a batch of {tokens} tokens in {seqs} sequences exceeds the allocated shape of {} tokens in {} \
     sequences (batches are planned to fit, never split)",
    limits.max_tokens,
    limits.max_seqs
)]
pub struct OverLimits {
    pub tokens: usize,
    pub seqs: usize,
    pub limits: BatchLimits,
}

/// One sequence of a batch.
#[derive(Clone, Copy, Debug)]
pub struct SequenceInput<'a> {
    pub token_ids: &'a [u32],
    /// Per-token M-RoPE positions (temporal, height, width). `None` means text: `p, p, p` for
    /// `p = 0..len`.
    pub positions: Option<&'a [[u32; 3]]>,
}

impl<'a> SequenceInput<'a> {
    /// A text-only sequence.
    pub fn text(token_ids: &'a [u32]) -> Self {
        Self {
            token_ids,
            positions: None,
        }
    }
}

/// One sequence of a [`TextModel::forward_segments`] batch: a whole prompt, or a piece of one that
/// continues a snapshot and/or leaves one.
#[derive(Clone, Copy, Debug)]
pub struct Segment<'a> {
    /// The segment's own tokens. Positions, if given, are the segment's own (continuing the
    /// resumed prefix's); `None` means text positions from [`PrefixState::next_position`] (0
    /// without a prefix).
    pub input: SequenceInput<'a>,
    /// The prefix this segment continues.
    pub resume: Option<&'a PrefixState>,
    /// Whether to return the state at the segment's end (prefix included).
    pub snapshot: bool,
    /// With `snapshot`: the state after this many of the segment's own tokens instead of after
    /// all of them, taken in the same pass (the segment still runs to its end). On a backend with
    /// a snapshot grid ([`Backend::snapshot_grid`]) a multiple of it.
    pub snapshot_at: Option<usize>,
}

/// What [`TextModel::forward_segments`] returns for one segment.
#[derive(Clone, Debug)]
pub struct SegmentOutput {
    /// The final-normed hidden state at the segment's last token (as [`TextModel::forward_last`]).
    pub last_hidden: Vec<f32>,
    /// The snapshot at the segment's end, if asked for.
    pub snapshot: Option<PrefixState>,
}

/// Embedding rows that replace the token embeddings of one sequence: the i-th position holding
/// `token_id` gets row `first_row + i` of `values` (rows of `hidden`); used to place image
/// features at the image tokens. Values in a buffer this backend can read (a vision tower's on
/// the same device) are copied on the device; values on the host are uploaded.
#[derive(Clone, Copy, Debug)]
pub struct EmbeddingOverride<'a> {
    pub token_id: u32,
    pub values: &'a Values,
    pub first_row: usize,
}

/// L2-norm epsilon of the DeltaNet q/k (fixed in transformers, not `rms_norm_eps`).
const L2_NORM_EPS: f32 = 1e-6;

/// Sizes derived from the config, checked once.
#[derive(Clone, Debug)]
struct Dims {
    vocab: usize,
    hidden: usize,
    inter: usize,
    eps: f32,
    attn: AttentionDims,
    delta: DeltaDims,
    conv_kernel: usize,
    rope: Rope,
}

impl Dims {
    fn from_config(cfg: &TextConfig) -> Result<Self> {
        ensure!(
            cfg.layer_types.len() == cfg.num_hidden_layers,
            "layer_types has {} entries, num_hidden_layers is {}",
            cfg.layer_types.len(),
            cfg.num_hidden_layers
        );
        ensure!(cfg.num_key_value_heads > 0, "num_key_value_heads is 0");
        ensure!(
            cfg.num_attention_heads
                .is_multiple_of(cfg.num_key_value_heads),
            "num_attention_heads {} is not a multiple of num_key_value_heads {}",
            cfg.num_attention_heads,
            cfg.num_key_value_heads
        );
        ensure!(cfg.linear_num_key_heads > 0, "linear_num_key_heads is 0");
        ensure!(
            cfg.linear_num_value_heads
                .is_multiple_of(cfg.linear_num_key_heads),
            "linear_num_value_heads {} is not a multiple of linear_num_key_heads {}",
            cfg.linear_num_value_heads,
            cfg.linear_num_key_heads
        );
        ensure!(
            cfg.linear_conv_kernel_dim > 0,
            "linear_conv_kernel_dim is 0"
        );
        let rotary_dim = cfg.rotary_dim();
        ensure!(
            rotary_dim.is_multiple_of(2) && rotary_dim <= cfg.head_dim,
            "rotary dim {rotary_dim} must be even and at most head_dim {}",
            cfg.head_dim
        );
        // transformers' Qwen3.5 always recomposes the frequencies interleaved, with
        // [11, 11, 10] when the config names no section.
        let section = match cfg.rope_parameters.mrope_section.as_slice() {
            [] => [11, 11, 10],
            [t, h, w] => [*t, *h, *w],
            other => bail!("mrope_section must have 3 entries, got {other:?}"),
        };
        Ok(Self {
            vocab: cfg.vocab_size,
            hidden: cfg.hidden_size,
            inter: cfg.intermediate_size,
            eps: cfg.rms_norm_eps as f32,
            attn: AttentionDims {
                q_heads: cfg.num_attention_heads,
                kv_heads: cfg.num_key_value_heads,
                head_dim: cfg.head_dim,
                scale: (cfg.head_dim as f64).powf(-0.5) as f32,
            },
            delta: DeltaDims {
                k_heads: cfg.linear_num_key_heads,
                v_heads: cfg.linear_num_value_heads,
                k_dim: cfg.linear_key_head_dim,
                v_dim: cfg.linear_value_head_dim,
            },
            conv_kernel: cfg.linear_conv_kernel_dim,
            rope: Rope {
                rotary_dim,
                theta: cfg.rope_parameters.rope_theta,
                section,
                interleaved: true,
            },
        })
    }

    fn q_gate_width(&self) -> usize {
        2 * self.attn.q_heads * self.attn.head_dim
    }

    fn attn_out_width(&self) -> usize {
        self.attn.q_heads * self.attn.head_dim
    }

    fn kv_width(&self) -> usize {
        self.attn.kv_heads * self.attn.head_dim
    }

    fn value_width(&self) -> usize {
        self.delta.v_heads * self.delta.v_dim
    }

    /// Width of the stacked DeltaNet input projection's output row: `[qkv | z | b | a]`.
    fn delta_in_width(&self) -> usize {
        self.delta.qkv_width() + self.value_width() + 2 * self.delta.v_heads
    }

    /// Where the qkv, z, b and a blocks sit in a stacked DeltaNet input projection row.
    fn delta_in_blocks(&self) -> [Strided; 4] {
        let (row, qkv, vw) = (
            self.delta_in_width(),
            self.delta.qkv_width(),
            self.value_width(),
        );
        [
            Strided::cols(row, 0),
            Strided::cols(row, qkv),
            Strided::cols(row, qkv + vw),
            Strided::cols(row, qkv + vw + self.delta.v_heads),
        ]
    }
}

/// Weights of one Gated DeltaNet mixer on the backend.
struct DeltaNetBufs<B: Buffers> {
    /// `[qkv + z + 2·Hv, hidden]`: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a rows stacked, so
    /// one GEMM makes all four (they share their input); see [`Dims::delta_in_blocks`].
    in_proj: B::Buf,
    conv1d: B::Buf,
    dt_bias: B::Buf,
    a_log: B::Buf,
    norm: B::Buf,
    out_proj: B::Buf,
}

/// Weights of one gated attention mixer on the backend.
struct AttentionBufs<B: Buffers> {
    /// `[q|gate + 2·kv, hidden]`: q_proj, k_proj, v_proj rows stacked, so one GEMM makes all three
    /// (the row layout [`AttentionDims::stacked_width`] describes).
    qkv_proj: B::Buf,
    o_proj: B::Buf,
    q_norm: B::Buf,
    k_norm: B::Buf,
}

enum MixerBufs<B: Buffers> {
    Linear(DeltaNetBufs<B>),
    Full(AttentionBufs<B>),
}

struct LayerBufs<B: Buffers> {
    input_norm: B::Buf,
    post_norm: B::Buf,
    mixer: MixerBufs<B>,
    /// `[2·inter, hidden]`: gate_proj rows then up_proj rows, so one GEMM feeds SwiGLU.
    gate_up: B::Buf,
    down: B::Buf,
}

/// Activation buffers, sized once for [`BatchLimits`].
struct Workspace<B: Buffers> {
    ids: B::Idx,
    positions: B::Idx,
    cu_seqlens: B::Idx,
    /// Residual stream `[T, hidden]`; each sub-block's output projection adds itself to it
    /// (`Store::Add`).
    residual: B::Buf,
    /// Normed input of the current sub-block `[T, hidden]`, read only by GEMMs (from
    /// `alloc_gemm_input`: bf16 on a GPU).
    normed: B::Buf,
    /// Attention q|gate|k|v (scratch of `gated_attention`); at the end, the final-normed hidden
    /// states.
    proj: B::Buf,
    /// The mixer's middle, from `alloc_gemm_input` (bf16 on a GPU, as a bf16 model's are): a
    /// DeltaNet layer's qkv|z|b|a (its in-projection; read by the conv, the gates and the gated
    /// norm), or an attention layer's gated output (read by o_proj only).
    mixer_mid: B::Buf,
    /// MLP gate|up `[T, 2·inter]`, read only by SwiGLU (from `alloc_gemm_input`: bf16 on a GPU).
    gate_up: B::Buf,
    /// DeltaNet conv output `[T, qkv]`.
    conv: B::Buf,
    /// DeltaNet β (after the gates) `[T, Hv]`.
    beta: B::Buf,
    /// DeltaNet g (after the gates) `[T, Hv]`.
    decay: B::Buf,
    /// Mixer core output or MLP activation.
    core: B::Buf,
    /// The residual stream at each sequence's last position `[S, hidden]`, for the last layer
    /// after its mixer.
    last: B::Buf,
}

/// The carried states of one [`TextModel::forward_segments`] batch on the backend: what its
/// sequences resume from, and room for the snapshots asked for. Built per batch (states are
/// uploaded and read back through the host for now).
struct Carry<B: Buffers> {
    /// Per layer, in model order.
    layers: Vec<LayerCarry<B>>,
    /// Each sequence's prefix rows in the attention layers' `k` and `v` (`num_seqs + 1`
    /// offsets) and their total; `None` when no sequence resumes.
    cu_prefix: Option<(B::Idx, usize)>,
    /// Per sequence, after how many of its own tokens its snapshot is taken; `None` when every
    /// snapshot is taken at its segment's end.
    snapshot_at: Option<B::Idx>,
}

enum LayerCarry<B: Buffers> {
    /// `[S, state]` and `[S, window]` in and out (in: zeros for a sequence with no prefix).
    DeltaNet {
        state_in: Option<B::Buf>,
        window_in: Option<B::Buf>,
        state_out: Option<B::Buf>,
        window_out: Option<B::Buf>,
    },
    /// The prefixes' k and v, packed as `cu_prefix` says; every row's k and v out.
    Attention {
        prefix: Option<(B::Buf, B::Buf)>,
        kv_out: Option<(B::Buf, B::Buf)>,
    },
}

/// What a [`Carry`] is allocated for: `seqs` sequences' DeltaNet states in (`resume`) and out
/// (`snapshot`), `prefix_rows` rows of prefix k and v (`resume`), `rows` rows of k and v out
/// (`snapshot`), and the snapshot offsets (`snapshot_at`).
#[derive(Clone, Copy)]
struct CarryRoom {
    seqs: usize,
    prefix_rows: usize,
    rows: usize,
    resume: bool,
    snapshot: bool,
    snapshot_at: bool,
}

impl<B: Backend> Carry<B> {
    /// Allocates the parts `room` asks for (the others `None`, the prefix total
    /// `room.prefix_rows`), with the bytes they take.
    fn allocate(be: &B, shapes: &[LayerShape], room: CarryRoom) -> Result<(Self, usize)> {
        let e = |err| anyhow!("{}: {err}", be.name());
        let bytes = std::cell::Cell::new(0);
        let alloc = |on: bool, len: usize| {
            on.then(|| {
                bytes.set(bytes.get() + 4 * len.max(1));
                be.alloc(len.max(1)).map_err(e)
            })
            .transpose()
        };
        let pair = |on: bool, len: usize| -> Result<Option<(B::Buf, B::Buf)>> {
            Ok(alloc(on, len)?.zip(alloc(on, len)?))
        };
        let idx = |on: bool, len: usize| {
            on.then(|| {
                bytes.set(bytes.get() + 4 * len);
                be.alloc_idx(len).map_err(e)
            })
            .transpose()
        };
        let CarryRoom { seqs: n, .. } = room;
        let mut layers = Vec::with_capacity(shapes.len());
        for shape in shapes {
            layers.push(match *shape {
                LayerShape::DeltaNet {
                    state_len,
                    window_len,
                } => LayerCarry::DeltaNet {
                    state_in: alloc(room.resume, n * state_len)?,
                    window_in: alloc(room.resume, n * window_len)?,
                    state_out: alloc(room.snapshot, n * state_len)?,
                    window_out: alloc(room.snapshot, n * window_len)?,
                },
                LayerShape::Attention { kv_width } => LayerCarry::Attention {
                    prefix: pair(room.resume, room.prefix_rows * kv_width)?,
                    kv_out: pair(room.snapshot, room.rows * kv_width)?,
                },
            });
        }
        let carry = Self {
            layers,
            cu_prefix: idx(room.resume, n + 1)?.map(|idx| (idx, room.prefix_rows)),
            snapshot_at: idx(room.snapshot_at, n)?,
        };
        Ok((carry, bytes.get()))
    }
}

/// How many sequences a captured carried pass holds at most: the arena holds the DeltaNet states
/// of that many in and out (for Qwen3.5-4B, ~50 MB each way per sequence: 0.8 GB for 8).
const ARENA_SEQS: usize = 8;

/// The carry of a captured pass, in buffers of fixed addresses (a captured pass holds them):
/// every part present, sized for [`ARENA_SEQS`] sequences, the prefix rows it was reserved for
/// ([`CAPTURED_MAX_PREFIX_ROWS`] by default) and [`CAPTURED_MAX_ROWS`] own rows. A pass borrows
/// the parts its [`CarryShape`] uses ([`Self::lend`]) and returns them ([`Self::give_back`]).
struct CarryArena<B: Buffers> {
    parts: Carry<B>,
    /// A state's worth of zeros: where a sequence of a resuming pass starts from nothing.
    zeros: B::Buf,
    /// Sequences it holds.
    seqs: usize,
    /// Prefix rows it holds (over all sequences; a power of two).
    prefix_rows: usize,
    /// The device memory it holds.
    bytes: usize,
}

impl<B: Backend> CarryArena<B> {
    fn new(be: &B, shapes: &[LayerShape], limits: BatchLimits, prefix_rows: usize) -> Result<Self> {
        let seqs = limits.max_seqs.min(ARENA_SEQS);
        let room = CarryRoom {
            seqs,
            prefix_rows,
            rows: limits.max_tokens.min(CAPTURED_MAX_ROWS),
            resume: true,
            snapshot: true,
            snapshot_at: true,
        };
        let (parts, bytes) = Carry::allocate(be, shapes, room)?;
        let zeros_len = shapes
            .iter()
            .map(|shape| match *shape {
                LayerShape::DeltaNet {
                    state_len,
                    window_len,
                } => state_len.max(window_len),
                LayerShape::Attention { .. } => 1,
            })
            .max()
            .unwrap_or(1);
        let zeros = be
            .alloc(zeros_len)
            .map_err(|err| anyhow!("{}: {err}", be.name()))?;
        Ok(Self {
            parts,
            zeros,
            seqs,
            prefix_rows,
            bytes: bytes + 4 * zeros_len,
        })
    }

    /// The parts a pass of `shape` uses (the others stay `None`, as a pass staged on its own
    /// has them), the prefix offsets' total set to the rows its attention is launched for.
    fn lend(&mut self, shape: CarryShape) -> Carry<B> {
        let take = |on: bool, part: &mut Option<B::Buf>| if on { part.take() } else { None };
        let (resumes, snapshot) = (shape.resumes(), shape.snapshot);
        let layers = self
            .parts
            .layers
            .iter_mut()
            .map(|layer| match layer {
                LayerCarry::DeltaNet {
                    state_in,
                    window_in,
                    state_out,
                    window_out,
                } => LayerCarry::DeltaNet {
                    state_in: take(resumes, state_in),
                    window_in: take(resumes, window_in),
                    state_out: take(snapshot, state_out),
                    window_out: take(snapshot, window_out),
                },
                LayerCarry::Attention { prefix, kv_out } => LayerCarry::Attention {
                    prefix: if resumes { prefix.take() } else { None },
                    kv_out: if snapshot { kv_out.take() } else { None },
                },
            })
            .collect();
        let cu_prefix = if resumes {
            self.parts
                .cu_prefix
                .take()
                .map(|(idx, _)| (idx, shape.prefix_rows))
        } else {
            None
        };
        let snapshot_at = if shape.snapshot_inside {
            self.parts.snapshot_at.take()
        } else {
            None
        };
        Carry {
            layers,
            cu_prefix,
            snapshot_at,
        }
    }

    /// Whether it holds every part: a pass that panicked while it held some never gave them back,
    /// and then every later pass stages its carry on its own.
    fn is_whole(&self) -> bool {
        let parts = self.parts.layers.iter().all(|layer| match layer {
            LayerCarry::DeltaNet {
                state_in,
                window_in,
                state_out,
                window_out,
            } => [state_in, window_in, state_out, window_out]
                .iter()
                .all(|p| p.is_some()),
            LayerCarry::Attention { prefix, kv_out } => prefix.is_some() && kv_out.is_some(),
        });
        parts && self.parts.cu_prefix.is_some() && self.parts.snapshot_at.is_some()
    }

    /// Puts back what [`Self::lend`] gave.
    fn give_back(&mut self, carry: Carry<B>) {
        fn put<T>(slot: &mut Option<T>, lent: Option<T>) {
            if lent.is_some() {
                *slot = lent;
            }
        }
        for (slot, lent) in self.parts.layers.iter_mut().zip(carry.layers) {
            match (slot, lent) {
                (
                    LayerCarry::DeltaNet {
                        state_in,
                        window_in,
                        state_out,
                        window_out,
                    },
                    LayerCarry::DeltaNet {
                        state_in: a,
                        window_in: b,
                        state_out: c,
                        window_out: d,
                    },
                ) => {
                    put(state_in, a);
                    put(window_in, b);
                    put(state_out, c);
                    put(window_out, d);
                }
                (
                    LayerCarry::Attention { prefix, kv_out },
                    LayerCarry::Attention {
                        prefix: a,
                        kv_out: b,
                    },
                ) => {
                    put(prefix, a);
                    put(kv_out, b);
                }
                _ => unreachable!("lent in the arena's layer order"),
            }
        }
        put(&mut self.parts.cu_prefix, carry.cu_prefix);
        put(&mut self.parts.snapshot_at, carry.snapshot_at);
    }
}

/// One layer's part of a [`Carry`], with the batch's prefix offsets (`Carry::cu_prefix`) and
/// snapshot points (`Carry::snapshot_at`).
type CarriedLayer<'a, B> = (
    &'a mut LayerCarry<B>,
    &'a Option<(<B as Buffers>::Idx, usize)>,
    Option<&'a <B as Buffers>::Idx>,
);

/// The Qwen3.5 text model on a backend.
pub struct TextModel<B: Backend> {
    backend: B,
    dims: Dims,
    limits: BatchLimits,
    embed: B::Buf,
    final_norm: B::Buf,
    layers: Vec<LayerBufs<B>>,
    ws: Workspace<B>,
    /// The carries of captured passes, once [`Self::reserve_carry_arena`] allocated them (only
    /// where the backend captures passes).
    arena: Option<CarryArena<B>>,
}

fn check_shape(name: &str, t: &HostTensor, want: &[usize]) -> Result<()> {
    ensure!(
        t.shape == want,
        "{name}: shape {:?}, expected {want:?}",
        t.shape
    );
    ensure!(
        t.data.len() == want.iter().product::<usize>(),
        "{name}: data length {} does not match its shape",
        t.data.len()
    );
    Ok(())
}

impl<B: Backend> TextModel<B> {
    /// Checks every weight against `config`, uploads them to `backend`, and allocates the
    /// activation buffers for `limits`.
    pub fn new(
        backend: B,
        config: &TextConfig,
        weights: &TextWeights,
        limits: BatchLimits,
    ) -> Result<Self> {
        let dims = Dims::from_config(config)?;
        ensure!(
            limits.max_tokens > 0 && limits.max_seqs > 0,
            "batch limits must be positive: {limits:?}"
        );
        ensure!(
            weights.layers.len() == config.num_hidden_layers,
            "weights have {} layers, config says {}",
            weights.layers.len(),
            config.num_hidden_layers
        );
        let up = |t: &HostTensor| backend.upload(&t.data).map_err(|e| anyhow!(e));
        check_shape(
            "embed_tokens",
            &weights.embed_tokens,
            &[dims.vocab, dims.hidden],
        )?;
        check_shape("norm", &weights.norm, &[dims.hidden])?;
        let embed = up(&weights.embed_tokens)?;
        let final_norm = up(&weights.norm)?;
        let mut layers = Vec::with_capacity(weights.layers.len());
        for (i, (lw, kind)) in weights.layers.iter().zip(&config.layer_types).enumerate() {
            layers.push(
                Self::upload_layer(&backend, &dims, lw, *kind)
                    .with_context(|| format!("layer {i}"))?,
            );
        }
        let ws = Self::allocate(&backend, &dims, limits)?;
        Ok(Self {
            backend,
            dims,
            limits,
            embed,
            final_norm,
            layers,
            ws,
            arena: None,
        })
    }

    fn upload_layer(
        backend: &B,
        d: &Dims,
        lw: &LayerWeights,
        kind: LayerKind,
    ) -> Result<LayerBufs<B>> {
        let up = |t: &HostTensor| backend.upload(&t.data).map_err(|e| anyhow!(e));
        let h = d.hidden;
        check_shape("input_layernorm", &lw.input_layernorm, &[h])?;
        check_shape(
            "post_attention_layernorm",
            &lw.post_attention_layernorm,
            &[h],
        )?;
        check_shape("mlp.gate_proj", &lw.mlp.gate_proj, &[d.inter, h])?;
        check_shape("mlp.up_proj", &lw.mlp.up_proj, &[d.inter, h])?;
        check_shape("mlp.down_proj", &lw.mlp.down_proj, &[h, d.inter])?;
        let mixer = match (&lw.mixer, kind) {
            (MixerWeights::Linear(w), LayerKind::LinearAttention) => {
                let (qkv, vw, hv) = (d.delta.qkv_width(), d.value_width(), d.delta.v_heads);
                check_shape("linear_attn.in_proj_qkv", &w.in_proj_qkv, &[qkv, h])?;
                check_shape("linear_attn.in_proj_z", &w.in_proj_z, &[vw, h])?;
                check_shape("linear_attn.in_proj_b", &w.in_proj_b, &[hv, h])?;
                check_shape("linear_attn.in_proj_a", &w.in_proj_a, &[hv, h])?;
                check_shape("linear_attn.conv1d", &w.conv1d, &[qkv, d.conv_kernel])?;
                check_shape("linear_attn.dt_bias", &w.dt_bias, &[hv])?;
                check_shape("linear_attn.A_log", &w.a_log, &[hv])?;
                check_shape("linear_attn.norm", &w.norm, &[d.delta.v_dim])?;
                check_shape("linear_attn.out_proj", &w.out_proj, &[h, vw])?;
                let in_proj = [&w.in_proj_qkv, &w.in_proj_z, &w.in_proj_b, &w.in_proj_a]
                    .map(|part| part.data.as_slice());
                MixerBufs::Linear(DeltaNetBufs {
                    in_proj: backend.upload_stacked(&in_proj).map_err(|e| anyhow!(e))?,
                    conv1d: up(&w.conv1d)?,
                    dt_bias: up(&w.dt_bias)?,
                    a_log: up(&w.a_log)?,
                    norm: up(&w.norm)?,
                    out_proj: up(&w.out_proj)?,
                })
            }
            (MixerWeights::Full(w), LayerKind::FullAttention) => {
                let hd = d.attn.head_dim;
                check_shape("self_attn.q_proj", &w.q_proj, &[d.q_gate_width(), h])?;
                check_shape("self_attn.k_proj", &w.k_proj, &[d.kv_width(), h])?;
                check_shape("self_attn.v_proj", &w.v_proj, &[d.kv_width(), h])?;
                check_shape("self_attn.o_proj", &w.o_proj, &[h, d.attn_out_width()])?;
                check_shape("self_attn.q_norm", &w.q_norm, &[hd])?;
                check_shape("self_attn.k_norm", &w.k_norm, &[hd])?;
                let qkv_proj = [&w.q_proj, &w.k_proj, &w.v_proj].map(|part| part.data.as_slice());
                MixerBufs::Full(AttentionBufs {
                    qkv_proj: backend.upload_stacked(&qkv_proj).map_err(|e| anyhow!(e))?,
                    o_proj: up(&w.o_proj)?,
                    q_norm: up(&w.q_norm)?,
                    k_norm: up(&w.k_norm)?,
                })
            }
            (_, kind) => bail!("mixer weights do not match layer type {kind:?}"),
        };
        let gate_up = [&lw.mlp.gate_proj.data[..], &lw.mlp.up_proj.data[..]];
        Ok(LayerBufs {
            input_norm: up(&lw.input_layernorm)?,
            post_norm: up(&lw.post_attention_layernorm)?,
            mixer,
            gate_up: backend.upload_stacked(&gate_up).map_err(|e| anyhow!(e))?,
            down: up(&lw.mlp.down_proj)?,
        })
    }

    fn allocate(backend: &B, d: &Dims, limits: BatchLimits) -> Result<Workspace<B>> {
        let t = limits.max_tokens;
        let f = |width: usize| backend.alloc(t * width).map_err(|e| anyhow!(e));
        let proj_w = d.attn.stacked_width().max(d.hidden);
        let core_w = d.value_width().max(d.inter);
        // Every GEMM input is `normed` (hidden wide), `core`, or `mixer_mid` (a GEMM input already).
        backend
            .reserve_gemm_input(t * d.hidden.max(core_w))
            .map_err(|e| anyhow!(e))?;
        Ok(Workspace {
            ids: backend.alloc_idx(t).map_err(|e| anyhow!(e))?,
            positions: backend.alloc_idx(3 * t).map_err(|e| anyhow!(e))?,
            cu_seqlens: backend
                .alloc_idx(limits.max_seqs + 1)
                .map_err(|e| anyhow!(e))?,
            residual: f(d.hidden)?,
            normed: backend
                .alloc_gemm_input(t * d.hidden)
                .map_err(|e| anyhow!(e))?,
            proj: f(proj_w)?,
            mixer_mid: backend
                .alloc_gemm_input(t * d.delta_in_width().max(d.attn_out_width()))
                .map_err(|e| anyhow!(e))?,
            gate_up: backend
                .alloc_gemm_input(t * 2 * d.inter)
                .map_err(|e| anyhow!(e))?,
            conv: f(d.delta.qkv_width())?,
            beta: f(d.delta.v_heads)?,
            decay: f(d.delta.v_heads)?,
            core: f(core_w)?,
            last: backend
                .alloc(limits.max_seqs * d.hidden)
                .map_err(|e| anyhow!(e))?,
        })
    }

    /// The backend the model runs on.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Allocates the carry arena, where a pass that carries prefix states (prefix reuse, chunks)
    /// stages them when the backend captures it: buffers of fixed addresses, which its capture
    /// holds (about 1 GB for Qwen3.5-4B). [`Self::new`] allocates none: a server reserves it at
    /// load, before the warm-up and before serving, only where carried passes can run (a capture
    /// refuses allocations, so it is never reserved inside one). Without it a carried pass answers
    /// the same, its carry staged for its own batch and run as launched.
    ///
    /// Returns the bytes allocated: 0 where the backend captures no passes
    /// ([`Backend::pass_shape`]) or the arena is already there.
    pub fn reserve_carry_arena(&mut self) -> Result<usize> {
        self.reserve_carry_arena_for(CAPTURED_MAX_PREFIX_ROWS)
    }

    /// [`Self::reserve_carry_arena`] with room for `prefix_rows` prefix rows over a pass's
    /// sequences (a power of two, at least 64): a pass resuming from more runs as launched,
    /// staging its carry in buffers of its own. Each prefix row costs the K and V of every
    /// attention layer in f32 (64 KiB for Qwen3.5-4B: 128 MiB for the default 2,048).
    pub fn reserve_carry_arena_for(&mut self, prefix_rows: usize) -> Result<usize> {
        ensure!(
            prefix_rows >= 64 && prefix_rows.is_power_of_two(),
            "the carry arena's prefix rows must be a power of two of at least 64, not {prefix_rows}"
        );
        if self.arena.is_some() || self.backend.pass_shape(1, 1).is_none() {
            return Ok(0);
        }
        let arena = CarryArena::new(
            &self.backend,
            &self.layer_shapes(),
            self.limits,
            prefix_rows,
        )
        .context("allocating the carry arena of captured passes")?;
        let bytes = arena.bytes;
        self.arena = Some(arena);
        Ok(bytes)
    }

    /// The prefix rows the carry arena was reserved for, if it was.
    pub fn carry_arena_prefix_rows(&self) -> Option<usize> {
        self.arena.as_ref().map(|a| a.prefix_rows)
    }

    /// The batch limits the buffers were sized for.
    pub fn limits(&self) -> BatchLimits {
        self.limits
    }

    /// Width of the hidden states [`Self::forward_last`] returns.
    pub fn hidden_size(&self) -> usize {
        self.dims.hidden
    }

    /// Runs one forward pass at each row count the backend asks to be warmed
    /// ([`Backend::warm_rows`]: one per bucket up to the batch limit, then the limit itself), of
    /// token 0, so that work a backend keys by shape (the CUDA backend's GEMM algorithm tuning per
    /// row bucket) happens at start-up rather than on the first request of each size. The limit
    /// runs first, as the most sequences a batch holds (it sizes every buffer); the others as one
    /// sequence. A row count the backend says it would add
    /// nothing to ([`Backend::warm_like`]: its GEMM winners are already stored) is skipped.
    /// Returns the row counts run.
    pub fn warm_shapes(&mut self) -> Result<Vec<usize>> {
        self.backend.reload_warm_state();
        let mut rows = self.backend.warm_rows(self.limits.max_tokens);
        let Some(limit) = rows.pop() else {
            return Ok(rows);
        };
        let mut run = Vec::new();
        for n in std::iter::once(limit).chain(rows) {
            if n != limit && self.backend.warm_like(n, limit) {
                continue;
            }
            // The limit runs as the most sequences a batch holds, so a backend's scratch that
            // grows with the sequence count (split attention rows) is sized once, here: a
            // captured pass holds its scratch's address, and replacing it later would make
            // every capture stale.
            let seqs = if n == limit {
                self.limits.max_seqs.clamp(1, n)
            } else {
                1
            };
            let ids = vec![0u32; n];
            let inputs: Vec<SequenceInput> = (0..seqs)
                .map(|s| SequenceInput::text(&ids[s * n / seqs..(s + 1) * n / seqs]))
                .collect();
            self.forward_last(&inputs)
                .with_context(|| format!("warming {n} rows"))?;
            run.push(n);
        }
        Ok(run)
    }

    /// Runs `seqs` as one packed batch and returns, per sequence (in order), the final-normed
    /// hidden state at its last token (`hidden_size` values each).
    ///
    /// Errors: an empty batch or sequence, a batch over the limits, a token id out of the
    /// vocabulary, positions of the wrong length.
    pub fn forward_last(&mut self, seqs: &[SequenceInput<'_>]) -> Result<Vec<Vec<f32>>> {
        self.forward_last_with_embeddings(seqs, &[])
    }

    /// As [`Self::forward_last`], with some token embeddings replaced: `overrides[s]` (if present)
    /// applies to sequence `s`; `overrides` may be shorter than `seqs`. Errors if the number of
    /// positions holding the token differs from the number of rows given.
    pub fn forward_last_with_embeddings(
        &mut self,
        seqs: &[SequenceInput<'_>],
        overrides: &[Option<EmbeddingOverride<'_>>],
    ) -> Result<Vec<Vec<f32>>> {
        self.run(seqs, overrides, &[], None)
    }

    /// What one layer of this model keeps in a snapshot.
    /// What a prefix-state snapshot of this model costs ([`PrefixState::size_bytes`] of one).
    pub fn snapshot_cost(&self) -> SnapshotCost {
        let (mut fixed, mut per_token) = (0, 0);
        for shape in self.layer_shapes() {
            match shape {
                LayerShape::DeltaNet {
                    state_len,
                    window_len,
                } => fixed += 4 * (state_len + window_len),
                LayerShape::Attention { kv_width } => per_token += 4 * 2 * kv_width,
            }
        }
        SnapshotCost { fixed, per_token }
    }

    fn layer_shapes(&self) -> Vec<LayerShape> {
        let d = &self.dims;
        let window_len = (d.conv_kernel - 1) * d.delta.qkv_width();
        self.layers
            .iter()
            .map(|layer| match layer.mixer {
                MixerBufs::Linear(_) => LayerShape::DeltaNet {
                    state_len: d.delta.state_len(),
                    window_len,
                },
                MixerBufs::Full(_) => LayerShape::Attention {
                    kv_width: d.kv_width(),
                },
            })
            .collect()
    }

    /// Runs `segs` as one packed batch, as [`Self::forward_last_with_embeddings`] does, where each
    /// segment may continue a [`PrefixState`] and may ask for the one at its end (taken in this
    /// pass). A batch in which no segment resumes or snapshots runs exactly as
    /// [`Self::forward_last_with_embeddings`]. Only the segments' own tokens count against the
    /// [`BatchLimits`]; a resumed prefix costs its attention layers' keys.
    ///
    /// Errors as [`Self::forward_last_with_embeddings`], and for a prefix state of another model's
    /// shape, or a backend that does not carry states (CUDA, for now).
    pub fn forward_segments(
        &mut self,
        segs: &[Segment<'_>],
        overrides: &[Option<EmbeddingOverride<'_>>],
    ) -> Result<Vec<SegmentOutput>> {
        let grid = self.backend.snapshot_grid().max(1);
        for (i, seg) in segs.iter().enumerate() {
            if let Some(at) = seg.snapshot_at {
                let len = seg.input.token_ids.len();
                ensure!(
                    seg.snapshot && at <= len && (at == len || at.is_multiple_of(grid)),
                    "sequence {i}: a snapshot after {at} of {len} tokens (snapshot asked: {}; \
                     {} takes one at a multiple of {grid} or at the end)",
                    seg.snapshot,
                    self.backend.name()
                );
            }
        }
        let seqs: Vec<SequenceInput> = segs.iter().map(|s| s.input).collect();
        let any_resume = segs.iter().any(|s| s.resume.is_some());
        let any_snapshot = segs.iter().any(|s| s.snapshot);
        if !any_resume && !any_snapshot {
            let hidden = self.forward_last_with_embeddings(&seqs, overrides)?;
            return Ok(hidden
                .into_iter()
                .map(|last_hidden| SegmentOutput {
                    last_hidden,
                    snapshot: None,
                })
                .collect());
        }
        let shapes = self.layer_shapes();
        for (i, seg) in segs.iter().enumerate() {
            if let Some(state) = seg.resume {
                state
                    .check_shape(&shapes)
                    .with_context(|| format!("sequence {i}"))?;
            }
        }
        let starts: Vec<u32> = segs
            .iter()
            .map(|s| s.resume.map_or(0, PrefixState::next_position))
            .collect();
        let rows: usize = seqs.iter().map(|s| s.token_ids.len()).sum();
        // Refused before any state is staged for it.
        self.limits.check(rows, segs.len())?;
        // A pass the backend captures stages its states in the arena (buffers of fixed
        // addresses); any other allocates its own.
        let captured = self.arena_shape(segs, rows);
        // Prefix values held on the host, uploaded once for the staging and the snapshots.
        let uploaded = Self::upload_host_values(&self.backend, segs)?;
        let mut carry = match captured {
            Some(shape) => self.stage_carry_in_arena(segs, &uploaded, &shapes, shape)?,
            None => self.stage_carry(segs, &uploaded, &shapes, rows)?,
        };
        let answered = self
            .run(&seqs, overrides, &starts, Some((&mut carry, captured)))
            .and_then(|hidden| {
                let snapshots = self.read_snapshots(segs, &uploaded, &starts, &carry)?;
                Ok((hidden, snapshots))
            });
        if captured.is_some() {
            self.arena
                .as_mut()
                .expect("a pass staged in the arena")
                .give_back(carry);
        }
        let (hidden, mut snapshots) = answered?;
        Ok(hidden
            .into_iter()
            .zip(snapshots.iter_mut())
            .map(|(last_hidden, snapshot)| SegmentOutput {
                last_hidden,
                snapshot: snapshot.take(),
            })
            .collect())
    }

    /// The shape a carried pass of `segs` (`rows` own tokens) is captured at, when the backend
    /// captures it and it fits the arena: its sequences, its rows, its prefixes.
    fn arena_shape(&self, segs: &[Segment<'_>], rows: usize) -> Option<PassShape> {
        let arena = self.arena.as_ref().filter(|a| a.is_whole())?;
        let base = self.backend.pass_shape(rows, segs.len())?;
        if base.seqs > arena.seqs || self.limits.check(base.rows, base.seqs).is_err() {
            return None;
        }
        let prefix_rows = if segs.iter().any(|s| s.resume.is_some()) {
            captured_prefix_rows(
                segs.iter()
                    .filter_map(|s| s.resume)
                    .map(PrefixState::tokens)
                    .sum(),
                arena.prefix_rows,
            )?
        } else {
            0
        };
        Some(PassShape {
            carry: CarryShape {
                prefix_rows,
                snapshot: segs.iter().any(|s| s.snapshot),
                snapshot_inside: segs.iter().any(|s| s.snapshot_at.is_some()),
            },
            ..base
        })
    }

    /// [`Self::stage_carry`] into the arena's buffers, for a pass captured at `shape`: the same
    /// values at the same places, and the prefix offsets padded as the sequences are. The
    /// buffers go back with [`CarryArena::give_back`].
    fn stage_carry_in_arena(
        &mut self,
        segs: &[Segment<'_>],
        uploaded: &Uploads<'_, B>,
        shapes: &[LayerShape],
        shape: PassShape,
    ) -> Result<Carry<B>> {
        let arena = self.arena.as_mut().context("no carry arena")?;
        let mut carry = arena.lend(shape.carry);
        let filled = Self::fill_carry(
            &self.backend,
            Some(&arena.zeros),
            (segs, uploaded),
            shapes,
            shape.seqs,
            &mut carry,
        );
        match filled {
            Ok(()) => Ok(carry),
            Err(err) => {
                arena.give_back(carry);
                Err(err)
            }
        }
    }

    /// Writes what `segs` resume from into the parts of `carry` that are present, packed over the
    /// sequences (the prefix offsets padded to `seqs` sequences): each sequence's DeltaNet state
    /// and window at its slot, the attention prefixes back to back. A sequence that resumes from
    /// nothing gets `zeros` in its slot, or nothing where the buffers are fresh (allocated zeroed).
    /// Every copy goes to the backend at once ([`Backend::copy_many`]: one launch on a GPU, where
    /// a layer's copies are tiny beside their launches); values held on the host come from their
    /// `uploaded` copies.
    fn fill_carry(
        be: &B,
        zeros: Option<&B::Buf>,
        (segs, uploaded): (&[Segment<'_>], &Uploads<'_, B>),
        shapes: &[LayerShape],
        seqs: usize,
        carry: &mut Carry<B>,
    ) -> Result<()> {
        let e = |err| anyhow!("{}: {err}", be.name());
        let source = |values| held_in(values, uploaded);
        let mut dsts: Vec<&mut B::Buf> = Vec::new();
        let mut parts: Vec<CopyPart<'_, B::Buf>> = Vec::new();
        for (i, (layer, layer_shape)) in carry.layers.iter_mut().zip(shapes).enumerate() {
            match (layer, *layer_shape) {
                (
                    LayerCarry::DeltaNet {
                        state_in: Some(state_in),
                        window_in: Some(window_in),
                        ..
                    },
                    LayerShape::DeltaNet {
                        state_len,
                        window_len,
                    },
                ) => {
                    let first = dsts.len();
                    dsts.extend([state_in, window_in]);
                    let slots = [(delta_state as Part, state_len), (delta_window, window_len)];
                    for (s, seg) in segs.iter().enumerate() {
                        for (dst, (part, slot)) in (first..).zip(slots) {
                            let (src, len) =
                                match (seg.resume.and_then(|st| part(&st.layers()[i])), zeros) {
                                    (Some(values), _) => (source(values)?, values.len()),
                                    (None, Some(zeros)) => (zeros, slot),
                                    (None, None) => continue,
                                };
                            parts.push(CopyPart {
                                src,
                                src_at: 0,
                                dst,
                                dst_at: s * slot,
                                len,
                            });
                        }
                    }
                }
                (
                    LayerCarry::Attention {
                        prefix: Some((k, v)),
                        ..
                    },
                    LayerShape::Attention { .. },
                ) => {
                    let first = dsts.len();
                    dsts.extend([k, v]);
                    let mut at = 0;
                    for state in segs.iter().filter_map(|s| s.resume) {
                        let layer = &state.layers()[i];
                        let (Some(k_values), Some(v_values)) = (keys(layer), values(layer)) else {
                            bail!("layer {i}: a prefix state without keys and values");
                        };
                        for (dst, held) in [(first, k_values), (first + 1, v_values)] {
                            parts.push(CopyPart {
                                src: source(held)?,
                                src_at: 0,
                                dst,
                                dst_at: at,
                                len: held.len(),
                            });
                        }
                        at += k_values.len();
                    }
                }
                (
                    LayerCarry::DeltaNet {
                        state_in: None,
                        window_in: None,
                        ..
                    },
                    LayerShape::DeltaNet { .. },
                )
                | (LayerCarry::Attention { prefix: None, .. }, LayerShape::Attention { .. }) => {}
                _ => bail!("layer {i}: no room staged for the prefix states"),
            }
        }
        be.copy_many(&mut dsts, &parts).map_err(e)?;
        if let Some((cu_prefix, _)) = carry.cu_prefix.as_mut() {
            let mut cu = vec![0u32];
            for seg in segs {
                cu.push(cu[cu.len() - 1] + seg.resume.map_or(0, PrefixState::tokens) as u32);
            }
            be.write_idx(cu_prefix, &padded_offsets(&cu, seqs))
                .map_err(e)?;
        }
        if let Some(idx) = carry.snapshot_at.as_mut() {
            let mut at: Vec<u32> = segs.iter().map(|s| snapshot_tokens(s) as u32).collect();
            at.resize(seqs, 0);
            be.write_idx(idx, &at).map_err(e)?;
        }
        Ok(())
    }

    /// The values `segs` resume from that are held on the host (a snapshot given as
    /// [`Values::host`], or one another backend took), each uploaded into a buffer of this
    /// backend, with the values it stands for.
    fn upload_host_values<'s>(be: &B, segs: &[Segment<'s>]) -> Result<Vec<(&'s Values, B::Buf)>> {
        let e = |err| anyhow!("{}: {err}", be.name());
        let mut uploaded = Vec::new();
        for state in segs.iter().filter_map(|s| s.resume) {
            for layer in state.layers() {
                for part in [delta_state as Part, delta_window, keys, values] {
                    let Some(held) = part(layer).filter(|v| !v.is_empty()) else {
                        continue;
                    };
                    if held.buffer::<B::Buf>().is_some() {
                        continue;
                    }
                    let host = held.as_host().with_context(|| {
                        format!("a prefix state held by another backend than {}", be.name())
                    })?;
                    let mut buf = be.alloc(host.len()).map_err(e)?;
                    be.write(&mut buf, host).map_err(e)?;
                    uploaded.push((held, buf));
                }
            }
        }
        Ok(uploaded)
    }

    /// Packs what `segs` resume from into one buffer per layer and part (device-to-device
    /// copies, [`Self::fill_carry`]) and allocates room for the snapshots they ask for. An f32
    /// activation on every backend: a state is never rounded.
    fn stage_carry(
        &self,
        segs: &[Segment<'_>],
        uploaded: &Uploads<'_, B>,
        shapes: &[LayerShape],
        rows: usize,
    ) -> Result<Carry<B>> {
        let be = &self.backend;
        let n = segs.len();
        let room = CarryRoom {
            seqs: n,
            prefix_rows: segs
                .iter()
                .filter_map(|s| s.resume)
                .map(PrefixState::tokens)
                .sum(),
            rows,
            resume: segs.iter().any(|s| s.resume.is_some()),
            snapshot: segs.iter().any(|s| s.snapshot),
            snapshot_at: segs.iter().any(|s| s.snapshot_at.is_some()),
        };
        let (mut carry, _) = Carry::allocate(be, shapes, room)?;
        Self::fill_carry(be, None, (segs, uploaded), shapes, n, &mut carry)?;
        Ok(carry)
    }

    /// `state` with every part read back to the host (for tests and tools; serving keeps
    /// snapshots where they were taken).
    pub fn snapshot_on_host(&self, state: &PrefixState) -> Result<PrefixState> {
        let be = &self.backend;
        let e = |err| anyhow!("{}: {err}", be.name());
        let read = |values: &Values| -> Result<Values> {
            if let Some(host) = values.as_host() {
                return Ok(Values::host(host.to_vec()));
            }
            let buf = values.buffer::<B::Buf>().with_context(|| {
                format!("a prefix state held by another backend than {}", be.name())
            })?;
            Ok(Values::host(be.read(buf, values.len()).map_err(e)?))
        };
        let layers = state
            .layers()
            .iter()
            .map(|layer| {
                Ok(match layer {
                    LayerState::DeltaNet { state, conv_window } => LayerState::DeltaNet {
                        state: read(state)?,
                        conv_window: read(conv_window)?,
                    },
                    LayerState::Attention { k, v } => LayerState::Attention {
                        k: read(k)?,
                        v: read(v)?,
                    },
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(PrefixState::new(
            state.tokens(),
            state.next_position(),
            layers,
        ))
    }

    /// The snapshots `segs` asked for, cut out of what the pass wrote into `carry` (on the
    /// device).
    fn read_snapshots(
        &self,
        segs: &[Segment<'_>],
        uploaded: &Uploads<'_, B>,
        starts: &[u32],
        carry: &Carry<B>,
    ) -> Result<Vec<Option<PrefixState>>> {
        let be = &self.backend;
        let e = |err| anyhow!("{}: {err}", be.name());
        if !segs.iter().any(|s| s.snapshot) {
            return Ok(vec![None; segs.len()]);
        }
        // Every snapshot part gets a buffer of its own, filled by one `copy_many`: per sequence
        // and layer, a DeltaNet state and window cut out of the pass's packed outputs, or an
        // attention layer's keys and values (the prefix's first, then the segment's own rows).
        let mut bufs: Vec<(B::Buf, usize)> = Vec::new();
        let mut parts: Vec<CopyPart<'_, B::Buf>> = Vec::new();
        let mut room = |len: usize| -> Result<usize> {
            bufs.push((be.alloc(len.max(1)).map_err(e)?, len));
            Ok(bufs.len() - 1)
        };
        // Per sequence, per layer: its kind and its two parts' buffers.
        let mut per_seq: Vec<Vec<(LayerKind, usize, usize)>> =
            segs.iter().map(|_| Vec::new()).collect();
        let kv_w = self.dims.kv_width();
        for (i, layer) in carry.layers.iter().enumerate() {
            match layer {
                LayerCarry::DeltaNet {
                    state_out: Some(state),
                    window_out: Some(window),
                    ..
                } => {
                    let (state_len, window_len) = (
                        self.dims.delta.state_len(),
                        (self.dims.conv_kernel - 1) * self.dims.delta.qkv_width(),
                    );
                    for (s, out) in per_seq.iter_mut().enumerate() {
                        if !segs[s].snapshot {
                            continue;
                        }
                        let mut pair = [0; 2];
                        for (at, (src, len)) in [(state, state_len), (window, window_len)]
                            .into_iter()
                            .enumerate()
                        {
                            pair[at] = room(len)?;
                            parts.push(CopyPart {
                                src,
                                src_at: s * len,
                                dst: pair[at],
                                dst_at: 0,
                                len,
                            });
                        }
                        out.push((LayerKind::LinearAttention, pair[0], pair[1]));
                    }
                }
                LayerCarry::Attention {
                    kv_out: Some((k_out, v_out)),
                    ..
                } => {
                    let mut start = 0;
                    for (s, out) in per_seq.iter_mut().enumerate() {
                        let own = segs[s].input.token_ids.len() * kv_w;
                        // The rows up to the snapshot's point (the segment's own, past it, not).
                        let kept = snapshot_tokens(&segs[s]) * kv_w;
                        if segs[s].snapshot {
                            let prefix = segs[s].resume.map(|state| &state.layers()[i]);
                            let mut pair = [0; 2];
                            for (at, (part, rows_out)) in [(keys as Part, k_out), (values, v_out)]
                                .into_iter()
                                .enumerate()
                            {
                                let before = prefix.and_then(part).filter(|v| !v.is_empty());
                                let held = before.map_or(0, Values::len);
                                pair[at] = room(held + kept)?;
                                if let Some(before) = before {
                                    parts.push(CopyPart {
                                        src: held_in(before, uploaded)?,
                                        src_at: 0,
                                        dst: pair[at],
                                        dst_at: 0,
                                        len: held,
                                    });
                                }
                                parts.push(CopyPart {
                                    src: rows_out,
                                    src_at: start,
                                    dst: pair[at],
                                    dst_at: held,
                                    len: kept,
                                });
                            }
                            out.push((LayerKind::FullAttention, pair[0], pair[1]));
                        }
                        start += own;
                    }
                }
                _ => bail!("no room was made for the snapshots asked for"),
            }
        }
        let mut dsts: Vec<&mut B::Buf> = bufs.iter_mut().map(|(buf, _)| buf).collect();
        be.copy_many(&mut dsts, &parts).map_err(e)?;
        let mut filled: Vec<Option<Values>> = bufs
            .into_iter()
            .map(|(buf, len)| Some(Values::in_buffer(len, buf)))
            .collect();
        let mut take = |at: usize| filled[at].take().context("a snapshot part taken twice");
        let per_seq: Vec<Vec<LayerState>> = per_seq
            .into_iter()
            .map(|layers| {
                layers
                    .into_iter()
                    .map(|(kind, a, b)| {
                        Ok(match kind {
                            LayerKind::LinearAttention => LayerState::DeltaNet {
                                state: take(a)?,
                                conv_window: take(b)?,
                            },
                            LayerKind::FullAttention => LayerState::Attention {
                                k: take(a)?,
                                v: take(b)?,
                            },
                        })
                    })
                    .collect::<Result<_>>()
            })
            .collect::<Result<_>>()?;
        Ok(segs
            .iter()
            .zip(per_seq)
            .zip(starts)
            .map(|((seg, layers), &start)| {
                seg.snapshot.then(|| {
                    let len = snapshot_tokens(seg);
                    let prefix = seg.resume.map_or(0, PrefixState::tokens);
                    // Text continues position by position; after M-RoPE positions, one past the
                    // largest (as Qwen's text after an image does).
                    let next = match seg.input.positions {
                        None => start + len as u32,
                        Some(p) => p[..len]
                            .iter()
                            .flatten()
                            .map(|&x| x + 1)
                            .fold(start, u32::max),
                    };
                    PrefixState::new(prefix + len, next, layers)
                })
            })
            .collect())
    }

    /// The forward pass; `starts[s]` is sequence `s`'s first text position (all 0 when empty), and
    /// `carry` the states the sequences resume from and the snapshots they ask for, with the
    /// shape the pass is captured at when the carry is in the arena (`None`: as launched).
    fn run(
        &mut self,
        seqs: &[SequenceInput<'_>],
        overrides: &[Option<EmbeddingOverride<'_>>],
        starts: &[u32],
        carry: Option<(&mut Carry<B>, Option<PassShape>)>,
    ) -> Result<Vec<Vec<f32>>> {
        ensure!(
            overrides.len() <= seqs.len(),
            "{} embedding overrides for {} sequences",
            overrides.len(),
            seqs.len()
        );
        // A plain pass may run its layers padded to a captured shape (`Backend::pass_shape`);
        // a carried one at the shape its arena carry was staged for, or at its own.
        let (carry, carried_shape) = match carry {
            Some((carry, shape)) => (Some(carry), Some(shape)),
            None => (None, None),
        };
        let (n, rows, shape) =
            self.stage_inputs(seqs, starts, |be, rows, n| match carried_shape {
                Some(shape) => shape,
                None => be.pass_shape(rows, n),
            })?;
        // With overrides, `residual` already holds the (edited) input embeddings.
        let embedded = overrides.iter().any(Option::is_some);
        if embedded {
            self.apply_overrides(seqs, overrides, rows)?;
        }
        let Self {
            backend: be,
            dims: d,
            limits: _,
            embed,
            final_norm,
            layers,
            ws,
            arena: _,
        } = self;
        let e = |err| anyhow!("{}: {err}", be.name());
        let h = d.hidden;

        if !embedded {
            be.embedding(embed, d.vocab, &ws.ids, rows, h, &mut ws.residual)
                .map_err(e)?;
        }
        let model = (&*be, &*d, &layers[..], &*final_norm);
        match shape {
            Some(shape) => {
                // The backend may run this twice (once as a batch, once to capture it) or not at
                // all (a replay); a failure keeps its context here.
                let mut failure = None;
                let mut carry = carry;
                let mut body = || {
                    let carry = carry.as_deref_mut();
                    Self::layers(model, ws, (shape.seqs, shape.rows), carry).map_err(|err| {
                        let brief = KernelError::Backend(format!("{err:#}"));
                        failure = Some(err);
                        brief
                    })
                };
                let ran = be.run_layers(shape, &mut body);
                if let Err(err) = ran {
                    return Err(failure.take().unwrap_or_else(|| anyhow::Error::new(err)));
                }
            }
            None => Self::layers(model, ws, (n, rows), carry)?,
        }
        // `proj` holds the final-normed last rows, one per sequence.
        let flat = be.read(&ws.proj, n * h).map_err(e)?;
        Ok(flat.chunks_exact(h).map(<[f32]>::to_vec).collect())
    }

    /// Every layer of a pass over `n` sequences in `rows` rows, from the input embeddings in
    /// `residual` to the final-normed last row of each sequence in `proj`.
    fn layers(
        (be, d, layers, final_norm): (&B, &Dims, &[LayerBufs<B>], &B::Buf),
        ws: &mut Workspace<B>,
        (n, rows): (usize, usize),
        mut carry: Option<&mut Carry<B>>,
    ) -> Result<()> {
        let e = |err| anyhow!("{}: {err}", be.name());
        let h = d.hidden;
        let norm = |weight, rows| RowNorm {
            weight,
            rows,
            dim: h,
            eps: d.eps,
        };
        be.rms_norm(
            &ws.residual,
            norm(&layers[0].input_norm, rows),
            &mut ws.normed,
        )
        .map_err(e)?;
        let last_layer = layers.len() - 1;
        for i in 0..layers.len() {
            let layer = &layers[i];
            // The answer reads each sequence's last position only, so after the last layer's
            // mixer the rest of the layer runs on one row per sequence, whose residual rows
            // `ws.last` holds. An attention mixer there computes just those rows, adding them
            // to `ws.last` (gathered first); a DeltaNet mixer runs on every row.
            let last = i == last_layer;
            let compact_mixer = last && matches!(layer.mixer, MixerBufs::Full(_));
            let gather_last = |ws: &mut Workspace<B>| {
                let batch = Varlen {
                    cu_seqlens: &ws.cu_seqlens,
                    num_seqs: n,
                    rows,
                };
                be.gather_last(&ws.residual, batch, h, &mut ws.last)
            };
            if compact_mixer {
                gather_last(ws).map_err(e)?;
            }
            let layer_carry = carry.as_deref_mut().map(|c| {
                let Carry {
                    layers,
                    cu_prefix,
                    snapshot_at,
                } = c;
                (&mut layers[i], &*cu_prefix, snapshot_at.as_ref())
            });
            match &layer.mixer {
                MixerBufs::Linear(w) => Self::delta_net(be, d, w, ws, (n, rows), layer_carry),
                MixerBufs::Full(w) => {
                    Self::attention(be, d, w, ws, (n, rows, compact_mixer), layer_carry)
                }
            }
            .with_context(|| format!("layer {i} mixer"))?;
            if last && !compact_mixer {
                gather_last(ws).map_err(e)?;
            }
            let m = if last { n } else { rows };
            let residual = if last { &mut ws.last } else { &mut ws.residual };
            be.rms_norm(residual, norm(&layer.post_norm, m), &mut ws.normed)
                .map_err(e)?;
            // SwiGLU MLP, its down projection added to the residual stream.
            be.gemm(
                &ws.normed,
                &layer.gate_up,
                GemmShape::new(m, h, 2 * d.inter),
                &mut ws.gate_up,
            )
            .map_err(e)?;
            let down = Projection {
                w: &layer.down,
                out_dim: h,
                store: Store::Add,
            };
            be.swiglu_gemm(&ws.gate_up, m, d.inter, down, &mut ws.core, residual)
                .map_err(e)?;
            // The next layer's input norm feeds only GEMMs (`normed` may be bf16); the final
            // norm feeds the f32 readout, so it goes to an f32 buffer (`proj` is free by now).
            let (next_norm, out) = match layers.get(i + 1) {
                Some(next) => (&next.input_norm, &mut ws.normed),
                None => (final_norm, &mut ws.proj),
            };
            be.rms_norm(residual, norm(next_norm, m), out).map_err(e)?;
        }
        Ok(())
    }

    /// Embeds the staged batch into `residual` and replaces the overridden rows: from a buffer
    /// of the backend by device copies (one launch for every run of consecutive image tokens of
    /// the batch), from the host through an upload and a scatter.
    fn apply_overrides(
        &mut self,
        seqs: &[SequenceInput<'_>],
        overrides: &[Option<EmbeddingOverride<'_>>],
        rows: usize,
    ) -> Result<()> {
        let h = self.dims.hidden;
        let be = &self.backend;
        let e = |err| anyhow!("{}: {err}", be.name());
        let ws = &mut self.ws;
        be.embedding(
            &self.embed,
            self.dims.vocab,
            &ws.ids,
            rows,
            h,
            &mut ws.residual,
        )
        .map_err(e)?;
        let mut copies = Vec::new();
        let mut start = 0;
        for (s, seq) in seqs.iter().enumerate() {
            let Some(Some(o)) = overrides.get(s) else {
                start += seq.token_ids.len();
                continue;
            };
            let slots: Vec<usize> = seq
                .token_ids
                .iter()
                .enumerate()
                .filter(|(_, &t)| t == o.token_id)
                .map(|(i, _)| start + i)
                .collect();
            start += seq.token_ids.len();
            if slots.is_empty() {
                continue;
            }
            let need = (o.first_row + slots.len()) * h;
            ensure!(
                need <= o.values.len(),
                "sequence {s}: {} positions hold token {}; from row {} of {h} values they need \
                 {need} values, {} were given",
                slots.len(),
                o.token_id,
                o.first_row,
                o.values.len()
            );
            match o.values.buffer::<B::Buf>().filter(|buf| be.can_read(buf)) {
                Some(src) => {
                    // Image tokens come in runs (one per image): one part per run.
                    let mut i = 0;
                    while i < slots.len() {
                        let run = slots[i..]
                            .iter()
                            .enumerate()
                            .take_while(|&(k, &slot)| slot == slots[i] + k)
                            .count();
                        copies.push(CopyPart {
                            src,
                            src_at: (o.first_row + i) * h,
                            dst: 0,
                            dst_at: slots[i] * h,
                            len: run * h,
                        });
                        i += run;
                    }
                }
                None => {
                    let host = o.values.as_host().with_context(|| {
                        format!(
                            "sequence {s}: image features held by another device than {}",
                            be.name()
                        )
                    })?;
                    let host = &host[o.first_row * h..need];
                    let mut src = be.alloc(host.len()).map_err(e)?;
                    be.write(&mut src, host).map_err(e)?;
                    let at: Vec<u32> = slots.iter().map(|&slot| slot as u32).collect();
                    let mut idx = be.alloc_idx(at.len()).map_err(e)?;
                    be.write_idx(&mut idx, &at).map_err(e)?;
                    be.scatter_rows(&src, &idx, at.len(), h, &mut ws.residual)
                        .map_err(e)?;
                }
            }
        }
        if !copies.is_empty() {
            be.copy_many(&mut [&mut ws.residual], &copies).map_err(e)?;
        }
        Ok(())
    }

    /// Validates the batch and writes ids, positions and `cu_seqlens` to the backend. Returns
    /// (sequences, tokens) and the shape its layers run at when `shape_of(backend, tokens,
    /// sequences)` pads it to one that fits the limits (`cu_seqlens` then ends with the padding
    /// sequences).
    fn stage_inputs(
        &mut self,
        seqs: &[SequenceInput<'_>],
        starts: &[u32],
        shape_of: impl FnOnce(&B, usize, usize) -> Option<PassShape>,
    ) -> Result<(usize, usize, Option<PassShape>)> {
        ensure!(!seqs.is_empty(), "empty batch");
        let rows: usize = seqs.iter().map(|s| s.token_ids.len()).sum();
        self.limits.check(rows, seqs.len())?;
        let mut ids = Vec::with_capacity(rows);
        let mut positions = Vec::with_capacity(3 * rows);
        let mut cu = Vec::with_capacity(seqs.len() + 1);
        cu.push(0u32);
        for (s, seq) in seqs.iter().enumerate() {
            let len = seq.token_ids.len();
            ensure!(len > 0, "sequence {s} is empty");
            if let Some(&bad) = seq
                .token_ids
                .iter()
                .find(|&&id| id as usize >= self.dims.vocab)
            {
                bail!(
                    "sequence {s}: token id {bad} is outside the vocabulary ({})",
                    self.dims.vocab
                );
            }
            ids.extend_from_slice(seq.token_ids);
            match seq.positions {
                Some(p) => {
                    ensure!(
                        p.len() == len,
                        "sequence {s}: {} positions for {len} tokens",
                        p.len()
                    );
                    positions.extend(p.iter().flatten());
                }
                None => {
                    let start = starts.get(s).copied().unwrap_or(0);
                    positions.extend((start..start + len as u32).flat_map(|p| [p, p, p]))
                }
            }
            cu.push((ids.len()) as u32);
        }
        let be = &self.backend;
        let e = |err| anyhow!("{}: {err}", be.name());
        let limits = self.limits;
        let shape = shape_of(be, rows, seqs.len()).filter(|s| limits.check(s.rows, s.seqs).is_ok());
        if let Some(shape) = shape {
            cu = padded_offsets(&cu, shape.seqs);
        }
        be.write_idx(&mut self.ws.ids, &ids).map_err(e)?;
        be.write_idx(&mut self.ws.positions, &positions)
            .map_err(e)?;
        be.write_idx(&mut self.ws.cu_seqlens, &cu).map_err(e)?;
        Ok((seqs.len(), rows, shape))
    }

    /// Gated DeltaNet: `normed` → added to `residual`.
    fn delta_net(
        be: &B,
        d: &Dims,
        w: &DeltaNetBufs<B>,
        ws: &mut Workspace<B>,
        (n, rows): (usize, usize),
        carry: Option<CarriedLayer<'_, B>>,
    ) -> Result<()> {
        let e = |err| anyhow!("{}: {err}", be.name());
        let batch = Varlen {
            cu_seqlens: &ws.cu_seqlens,
            num_seqs: n,
            rows,
        };
        let (h, hv) = (d.hidden, d.delta.v_heads);
        let [qkv_at, z_at, b_at, a_at] = d.delta_in_blocks();
        // One GEMM for the four input projections; the ops below read their column blocks in place.
        be.gemm(
            &ws.normed,
            &w.in_proj,
            GemmShape::new(rows, h, d.delta_in_width()),
            &mut ws.mixer_mid,
        )
        .map_err(e)?;
        // The conv (+ the q/k L2 norm), the gates and the delta rule; `conv`, `beta` and `decay`
        // are scratch for backends that run them as separate passes.
        let gates = DeltaGates {
            b: &ws.mixer_mid,
            b_at,
            a: &ws.mixer_mid,
            a_at,
            a_log: &w.a_log,
            dt_bias: &w.dt_bias,
            heads: hv,
        };
        let input = DeltaNetInput {
            x: &ws.mixer_mid,
            x_at: qkv_at,
            conv_weight: &w.conv1d,
            kernel: d.conv_kernel,
            l2_eps: L2_NORM_EPS,
            gates,
        };
        let scratch = DeltaNetScratch {
            conv: &mut ws.conv,
            beta: &mut ws.beta,
            g: &mut ws.decay,
        };
        match carry {
            None => {
                let state = DeltaState {
                    initial: None,
                    final_out: None,
                    final_at: None,
                };
                be.delta_net_core(input, batch, d.delta, state, scratch, &mut ws.core)
            }
            Some((
                LayerCarry::DeltaNet {
                    state_in,
                    window_in,
                    state_out,
                    window_out,
                },
                _,
                snapshot_at,
            )) => {
                let carry = DeltaCarry {
                    state: DeltaState {
                        initial: state_in.as_ref(),
                        final_out: state_out.as_mut(),
                        final_at: snapshot_at,
                    },
                    window: ConvWindow {
                        input: window_in.as_ref(),
                        output: window_out.as_mut(),
                        output_at: snapshot_at,
                    },
                };
                be.delta_net_core_carried(input, batch, d.delta, carry, scratch, &mut ws.core)
            }
            Some(_) => bail!("an attention layer's carry at a DeltaNet layer"),
        }
        .map_err(e)?;
        let norm = GatedNorm {
            z: &ws.mixer_mid,
            z_at,
            weight: &w.norm,
            rows,
            heads: hv,
            dim: d.delta.v_dim,
            eps: d.eps,
        };
        let out_proj = Projection {
            w: &w.out_proj,
            out_dim: h,
            store: Store::Add,
        };
        be.gated_rms_norm_gemm(&mut ws.core, norm, out_proj, &mut ws.residual)
            .map_err(e)?;
        Ok(())
    }

    /// Gated full attention: `normed` → added to `residual`; with `last_only`, each sequence's last
    /// row only, added to `last[s]`.
    fn attention(
        be: &B,
        d: &Dims,
        w: &AttentionBufs<B>,
        ws: &mut Workspace<B>,
        (n, rows, last_only): (usize, usize, bool),
        carry: Option<CarriedLayer<'_, B>>,
    ) -> Result<()> {
        let e = |err| anyhow!("{}: {err}", be.name());
        let h = d.hidden;
        // One GEMM for q|gate, k and v; the attention reads their column blocks in place.
        be.gemm(
            &ws.normed,
            &w.qkv_proj,
            GemmShape::new(rows, h, d.attn.stacked_width()),
            &mut ws.proj,
        )
        .map_err(e)?;
        let batch = Varlen {
            cu_seqlens: &ws.cu_seqlens,
            num_seqs: n,
            rows,
        };
        let prologue = QkPrologue {
            q_norm: &w.q_norm,
            k_norm: &w.k_norm,
            positions: &ws.positions,
            rope: &d.rope,
            eps: d.eps,
        };
        match carry {
            None => be.gated_attention(
                &mut ws.proj,
                prologue,
                batch,
                d.attn,
                last_only,
                &mut ws.mixer_mid,
            ),
            Some((LayerCarry::Attention { prefix, kv_out }, cu_prefix, _)) => {
                let prefix = match (prefix, cu_prefix) {
                    (Some((k, v)), Some((cu_prefix, rows))) => Some(PrefixKv {
                        k: &*k,
                        v: &*v,
                        cu_prefix,
                        rows: *rows,
                    }),
                    _ => None,
                };
                let output = AttentionOutput {
                    out: &mut ws.mixer_mid,
                    last_only,
                    kv: kv_out.as_mut().map(|(k, v)| (k, v)),
                };
                be.gated_attention_carried(&mut ws.proj, prologue, batch, d.attn, prefix, output)
            }
            Some(_) => bail!("a DeltaNet layer's carry at an attention layer"),
        }
        .map_err(e)?;
        let (out_rows, residual) = if last_only {
            (n, &mut ws.last)
        } else {
            (rows, &mut ws.residual)
        };
        be.gemm_to(
            &ws.mixer_mid,
            &w.o_proj,
            GemmShape::new(out_rows, d.attn_out_width(), h),
            Store::Add,
            residual,
        )
        .map_err(e)?;
        Ok(())
    }
}

/// How many of `seg`'s own tokens its snapshot covers.
fn snapshot_tokens(seg: &Segment<'_>) -> usize {
    let len = seg.input.token_ids.len();
    seg.snapshot_at.map_or(len, |at| at.min(len))
}

/// Prefix values held on the host, each with its upload into a buffer of the backend
/// ([`TextModel::upload_host_values`]).
type Uploads<'s, B> = [(&'s Values, <B as Buffers>::Buf)];

/// The buffer holding `values`: its own, or the upload standing for it.
fn held_in<'v, Buf: 'static>(
    values: &'v Values,
    uploaded: &'v [(&Values, Buf)],
) -> Result<&'v Buf> {
    match values.buffer::<Buf>() {
        Some(buf) => Ok(buf),
        None => uploaded
            .iter()
            .find(|(held, _)| std::ptr::eq(*held, values))
            .map(|(_, buf)| buf)
            .context("a prefix state held by another backend"),
    }
}

/// One part of a layer's prefix state.
type Part = fn(&LayerState) -> Option<&Values>;

fn delta_state(layer: &LayerState) -> Option<&Values> {
    match layer {
        LayerState::DeltaNet { state, .. } => Some(state),
        LayerState::Attention { .. } => None,
    }
}

fn delta_window(layer: &LayerState) -> Option<&Values> {
    match layer {
        LayerState::DeltaNet { conv_window, .. } => Some(conv_window),
        LayerState::Attention { .. } => None,
    }
}

fn keys(layer: &LayerState) -> Option<&Values> {
    match layer {
        LayerState::Attention { k, .. } => Some(k),
        LayerState::DeltaNet { .. } => None,
    }
}

fn values(layer: &LayerState) -> Option<&Values> {
    match layer {
        LayerState::Attention { v, .. } => Some(v),
        LayerState::DeltaNet { .. } => None,
    }
}

#[cfg(test)]
mod arena_tests {
    use instinct_kernels::CpuBackend;

    use crate::decider::{Decider, Prompt, QuestionSegment};
    use crate::forward::{BatchLimits, Segment, SequenceInput};
    use crate::prefix::PrefixState;

    fn demo(backend: CpuBackend) -> (Decider<CpuBackend>, Vec<u32>) {
        let loaded = crate::demo::load_text(backend, BatchLimits::new(512, 8)).unwrap();
        let text = loaded
            .tokenizer
            .encode(&"Pick the safe action. ".repeat(40))
            .unwrap();
        (loaded.decider, text)
    }

    /// The snapshot of the first 64 ids.
    fn prefix(d: &mut Decider<CpuBackend>, text: &[u32]) -> PrefixState {
        let mut out = d
            .decide_segments(&[QuestionSegment::prefix(&text[..64], None)])
            .unwrap();
        out.remove(0).snapshot.unwrap()
    }

    /// A resumed tail's answer, from a snapshot of the first 64 ids.
    fn resumed(d: &mut Decider<CpuBackend>, text: &[u32]) -> Vec<f32> {
        let state = prefix(d, text);
        let tail = QuestionSegment::answer(Prompt::text(&text[64..150], 4), Some(&state));
        d.decide_segments(&[tail])
            .unwrap()
            .remove(0)
            .probabilities
            .unwrap()
    }

    /// Whether the tail [`resumed`] runs would stage its carry in the arena (at a captured shape).
    fn tail_uses_the_arena(d: &mut Decider<CpuBackend>, text: &[u32]) -> bool {
        let state = prefix(d, text);
        let tail = Segment {
            input: SequenceInput::text(&text[64..150]),
            resume: Some(&state),
            snapshot: false,
            snapshot_at: None,
        };
        d.model_mut().arena_shape(&[tail], 86).is_some()
    }

    /// An arena missing a part (a pass that panicked while it held it) is no longer used: later
    /// carried passes stage their own carry and answer as before, instead of resuming from
    /// nothing.
    #[test]
    fn an_arena_missing_a_part_is_not_used() {
        let (mut plain, text) = demo(CpuBackend::new());
        let (mut padded, _) = demo(CpuBackend::padding_passes());
        assert!(padded.reserve_carry_arena().unwrap() > 0);
        let want = resumed(&mut plain, &text);
        assert_eq!(resumed(&mut padded, &text), want);
        let model = padded.model_mut();
        let arena = model.arena.as_mut().unwrap();
        assert!(arena.bytes > 0);
        assert!(arena.is_whole());
        let lost = arena.parts.cu_prefix.take();
        assert!(!arena.is_whole());
        assert!(!tail_uses_the_arena(&mut padded, &text));
        assert_eq!(resumed(&mut padded, &text), want);
        let arena = padded.model_mut().arena.as_mut().unwrap();
        arena.parts.cu_prefix = lost;
        assert!(arena.is_whole());
        assert!(tail_uses_the_arena(&mut padded, &text));
    }

    /// An arena reserved for more prefix rows than the default holds a pass that resumes from
    /// more than 2,048 (five questions, each resumed from 448 ids: 2,240, launched for 4,096), and
    /// that pass answers as it does staged on its own and as on a backend that pads nothing.
    #[test]
    fn an_arena_for_more_prefix_rows_holds_larger_resumed_passes_with_the_same_answers() {
        const CUT: usize = 448;
        let (mut plain, _) = demo(CpuBackend::new());
        let (mut small, _) = demo(CpuBackend::padding_passes());
        let (mut large, _) = demo(CpuBackend::padding_passes());
        let small_bytes = small.reserve_carry_arena().unwrap();
        assert!(
            small.reserve_carry_arena_for(100).is_err(),
            "not a power of two"
        );
        let large_bytes = large.reserve_carry_arena_for(4096).unwrap();
        assert!(large_bytes > small_bytes && small_bytes > 0);
        let loaded = crate::demo::load_text(CpuBackend::new(), BatchLimits::new(512, 8)).unwrap();
        let texts: Vec<Vec<u32>> = (0..5)
            .map(|k| {
                let text = format!("Question {k}. ") + &"Pick the safe action. ".repeat(100);
                let ids = loaded.tokenizer.encode(&text).unwrap();
                assert!(ids.len() > CUT + 40, "{} ids", ids.len());
                ids[..CUT + 40].to_vec()
            })
            .collect();
        let run = |d: &mut Decider<CpuBackend>| {
            let states: Vec<PrefixState> = texts
                .iter()
                .map(|t| {
                    let segment = QuestionSegment::prefix(&t[..CUT], None);
                    d.decide_segments(&[segment])
                        .unwrap()
                        .remove(0)
                        .snapshot
                        .unwrap()
                })
                .collect();
            let segs: Vec<Segment> = texts
                .iter()
                .zip(&states)
                .map(|(t, state)| Segment {
                    input: SequenceInput::text(&t[CUT..]),
                    resume: Some(state),
                    snapshot: false,
                    snapshot_at: None,
                })
                .collect();
            let in_arena = d.model_mut().arena_shape(&segs, 5 * 40).is_some();
            let tails: Vec<QuestionSegment> = texts
                .iter()
                .zip(&states)
                .map(|(t, state)| QuestionSegment::answer(Prompt::text(&t[CUT..], 4), Some(state)))
                .collect();
            let answers: Vec<Vec<f32>> = d
                .decide_segments(&tails)
                .unwrap()
                .into_iter()
                .map(|out| out.probabilities.unwrap())
                .collect();
            (in_arena, answers)
        };
        let (_, want) = run(&mut plain);
        let (small_arena, small_got) = run(&mut small);
        let (large_arena, large_got) = run(&mut large);
        assert!(
            !small_arena,
            "2,240 prefix rows do not fit the default arena"
        );
        assert!(large_arena, "they fit one reserved for 4,096");
        assert_eq!(small_got, want);
        assert_eq!(large_got, want);
    }

    /// A model holds no arena until [`super::TextModel::reserve_carry_arena`] allocates it (a
    /// server reserves it only where prefix reuse or chunking is on); reserving returns its bytes
    /// once, then 0, and 0 on a backend that captures no passes. A carried pass answers the same
    /// bits without the arena (staged on its own, run as launched) as from it.
    #[test]
    fn the_arena_is_allocated_only_when_reserved_and_changes_no_answer() {
        let (mut plain, text) = demo(CpuBackend::new());
        let (mut padded, _) = demo(CpuBackend::padding_passes());
        assert!(plain.model_mut().arena.is_none());
        assert!(padded.model_mut().arena.is_none(), "none after loading");
        let want = resumed(&mut plain, &text);
        assert!(!tail_uses_the_arena(&mut padded, &text));
        assert_eq!(resumed(&mut padded, &text), want, "without the arena");
        assert!(
            padded.model_mut().arena.is_none(),
            "a carried pass reserves none"
        );

        assert_eq!(
            plain.reserve_carry_arena().unwrap(),
            0,
            "no captured passes"
        );
        assert!(plain.model_mut().arena.is_none());
        let bytes = padded.reserve_carry_arena().unwrap();
        assert!(bytes > 0);
        assert_eq!(padded.model_mut().arena.as_ref().unwrap().bytes, bytes);
        assert_eq!(padded.reserve_carry_arena().unwrap(), 0, "reserved once");
        assert!(tail_uses_the_arena(&mut padded, &text));
        assert_eq!(resumed(&mut padded, &text), want, "from the arena");
        assert!(padded.model_mut().arena.as_ref().unwrap().is_whole());
    }
}
