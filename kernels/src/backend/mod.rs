//! The backend interface: every op the Qwen3.5 text forward pass needs, over buffers the backend
//! owns.
//!
//! Conventions shared by all ops:
//! - Activations are row-major `[rows, width]` f32 buffers; a "row" is one token of the packed batch.
//!   An operand that comes with a [`Strided`] may instead be a column block of wider rows (one
//!   block of a stacked projection's output), read in place.
//! - Linear weights are `[out, in]` (PyTorch layout) and ops compute `y = x Wᵀ`.
//! - Sequences are packed back to back with no padding. Their boundaries live in a backend index
//!   buffer (`cu_seqlens`, `num_seqs + 1` entries, starting at 0), so a device backend can replay
//!   one captured launch sequence for any batch that fits the sizes it was captured for.
//! - Buffers are allocated once (weights uploaded once, activations sized for the largest batch)
//!   and may be longer than an op needs; an op touches only the prefix it is asked for.
//! - Ops never allocate caller-visible memory; a backend may keep its own scratch.

mod args;
mod composed;
mod dims;
mod layout;
mod pass;
mod rope;

pub use args::{
    AttentionOutput, Conv1d, ConvWindow, CopyPart, DeltaCarry, DeltaInputs, DeltaNetInput,
    DeltaNetScratch, GateOutputs, GatedNorm, GemmShape, L2Heads, PrefixKv, Projection, QkPrologue,
    RowNorm,
};
pub(crate) use composed::{
    conv1d_silu_then_l2, delta_net_core_apart, delta_net_core_carried_apart, qk_norm_then_rope,
    stacked_norm_rope,
};
pub use dims::{AttentionDims, DeltaDims, DeltaGates, DeltaState};
pub use layout::{HeadLayout, Strided, Varlen};
pub use pass::{
    captured_prefix_rows, captured_shape, padded_offsets, CarryShape, PassShape,
    CAPTURED_MAX_PREFIX_ROWS, CAPTURED_MAX_ROWS,
};
pub use rope::Rope;

use crate::error::KernelError;
use crate::patches::PatchRows;

/// Result of a backend call.
pub type KernelResult<T> = Result<T, KernelError>;

/// Whether a projection's result replaces its output or is added to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Store {
    /// `y = x Wᵀ`.
    Replace,
    /// `y += x Wᵀ`: a block's output projection adds itself to the residual stream. On a GPU the
    /// GEMM does the add as it writes, so no separate pass reads and rewrites the stream.
    Add,
}

/// The buffer types of a backend (split from [`Backend`] so helper structs can name them).
pub trait Buffers {
    /// A buffer of f32 values (sendable, so a prefix-state snapshot can stay in one and be
    /// shared by the engines of its device).
    type Buf: Send + Sync + 'static;
    /// A buffer of u32 values (token ids, positions, `cu_seqlens`).
    type Idx;
}

/// Everything the model needs from a compute backend. See the module docs for the conventions.
pub trait Backend: Buffers {
    /// A short name for logs (`"cpu"`, `"cuda:0"`).
    fn name(&self) -> String;

    /// The token counts at which [`DeltaState::final_at`] (and [`ConvWindow::output_at`]) may take
    /// a sequence's state short of its end: multiples of this. The default takes any.
    fn snapshot_grid(&self) -> usize {
        1
    }

    /// The row counts at which one forward pass each, before serving, does all the work this
    /// backend keys by batch shape (the CUDA backend times its GEMM algorithms once per row
    /// bucket): one per bucket up to `max_rows`, ending with `max_rows` itself. The default is the
    /// powers of two.
    fn warm_rows(&self, max_rows: usize) -> Vec<usize> {
        bucket_tops(max_rows, |rows| rows.next_power_of_two())
    }

    /// Whether a warm-up forward at `rows` would do nothing a forward at `like` (already run)
    /// did not: the CUDA backend says so when every GEMM shape timed at `like`'s row bucket has a
    /// stored winner at `rows`' bucket too. The default, `false`, warms every row count.
    fn warm_like(&self, _rows: usize, _like: usize) -> bool {
        false
    }

    /// Takes up, before warming, what another copy of the model on the same device stored since
    /// this one started (the CUDA backend re-reads its GEMM tuning file: the screenshot copy then
    /// times nothing the text copy just timed). The default does nothing.
    fn reload_warm_state(&self) {}

    // ---- captured passes ------------------------------------------------------------------------

    /// The shape ([`PassShape`]) a pass of `rows` tokens in `seqs` sequences runs its layers at,
    /// padded so that a captured launch sequence serves it; `None` runs it at its own. The model
    /// adds what the sequences carry ([`CarryShape`]). The default: its own.
    fn pass_shape(&self, _rows: usize, _seqs: usize) -> Option<PassShape> {
        None
    }

    /// Runs a pass's layers at `shape` (inputs staged before, the readback after): replays what
    /// was captured for `shape`, or runs `layers` (and may capture it for the next batch of that
    /// shape). `layers` must launch the same work for every batch of `shape`, reading all that is
    /// batch-specific from device buffers. The default runs `layers`.
    fn run_layers(
        &self,
        _shape: PassShape,
        layers: &mut dyn FnMut() -> KernelResult<()>,
    ) -> KernelResult<()> {
        layers()
    }

    // ---- memory -------------------------------------------------------------------------------

    /// A zeroed f32 buffer of `len` values.
    fn alloc(&self, len: usize) -> KernelResult<Self::Buf>;
    /// A zeroed buffer of `len` values for a GEMM input that only the norms write (`rms_norm`,
    /// `add_rms_norm` as `out`) and only GEMMs read, or for a GEMM output that only `swiglu` and
    /// `swiglu_gemm` read (the MLP's gate|up), or only `conv1d_silu(_l2)`, `delta_gates` and the
    /// gated norms (as `z`) read (a Gated DeltaNet layer's stacked in-projection), or for the
    /// vision tower's GEMM inputs (its pixels, its LayerNorms', GELUs' and attention's outputs):
    /// a device backend may hold it in its GEMM operand precision (bf16 on CUDA, as a bf16
    /// model's activations are). The default is [`Self::alloc`].
    fn alloc_gemm_input(&self, len: usize) -> KernelResult<Self::Buf> {
        self.alloc(len)
    }

    /// A zeroed u32 buffer of `len` values.
    fn alloc_idx(&self, len: usize) -> KernelResult<Self::Idx>;
    /// Waits until every op queued so far has finished, so that another backend on the same
    /// device may read what they wrote (a vision tower's features, read by a language copy's
    /// ops on their own stream). The default returns at once: its ops finish before they return.
    fn synchronize(&self) -> KernelResult<()> {
        Ok(())
    }
    /// Whether this backend's ops may read `buf`, which another backend of its kind may have
    /// allocated (on a GPU: one on the same device). The default: any.
    fn can_read(&self, _buf: &Self::Buf) -> bool {
        true
    }
    /// A new buffer holding `data` (weights are uploaded once with this).
    fn upload(&self, data: &[f32]) -> KernelResult<Self::Buf>;
    /// A new buffer holding the concatenation of `parts` (a stacked projection's weights, uploaded
    /// without first being copied together on the host where the backend can).
    fn upload_stacked(&self, parts: &[&[f32]]) -> KernelResult<Self::Buf> {
        self.upload(&parts.concat())
    }
    /// Copies `data` into the start of `dst`.
    fn write(&self, dst: &mut Self::Buf, data: &[f32]) -> KernelResult<()>;
    /// Copies the concatenation of `parts` into the start of `dst` (several host arrays into one
    /// buffer without first joining them on the host, where the backend can; a screenshot's
    /// patch rows go through [`VisionBackend::write_patch_rows`] instead). Into a
    /// buffer from [`Self::alloc_gemm_input`], a device backend may round on the host and return
    /// once the values are on the device.
    fn write_parts(&self, dst: &mut Self::Buf, parts: &[&[f32]]) -> KernelResult<()> {
        self.write(dst, &parts.concat())
    }
    /// Copies `data` into the start of `dst`.
    fn write_idx(&self, dst: &mut Self::Idx, data: &[u32]) -> KernelResult<()>;
    /// The first `len` values of `src`, on the host.
    fn read(&self, src: &Self::Buf, len: usize) -> KernelResult<Vec<f32>>;
    /// Copies `len` values of `src` from `src_at` into `dst` from `dst_at`, on the device (f32
    /// buffers from [`Self::alloc`]: prefix states move between a batch's packed buffers and the
    /// snapshots kept for later batches without a trip through the host).
    fn copy(
        &self,
        src: &Self::Buf,
        src_at: usize,
        dst: &mut Self::Buf,
        dst_at: usize,
        len: usize,
    ) -> KernelResult<()>;
    /// [`Self::copy`] of every part, into `dsts[part.dst]`: the states a carried pass starts from,
    /// staged at once (a backend may do them in one launch, where each copy is tiny beside its
    /// launch). No part may write what another reads or writes.
    fn copy_many(
        &self,
        dsts: &mut [&mut Self::Buf],
        parts: &[CopyPart<'_, Self::Buf>],
    ) -> KernelResult<()> {
        for p in parts {
            let dst = dsts.get_mut(p.dst).ok_or_else(|| {
                KernelError::invalid("copy_many", format!("no destination {}", p.dst))
            })?;
            self.copy(p.src, p.src_at, dst, p.dst_at, p.len)?;
        }
        Ok(())
    }

    // ---- ops ----------------------------------------------------------------------------------

    /// `out[t] = table[ids[t]]` for `t < rows`; `table` is `[vocab, dim]`.
    fn embedding(
        &self,
        table: &Self::Buf,
        vocab: usize,
        ids: &Self::Idx,
        rows: usize,
        dim: usize,
        out: &mut Self::Buf,
    ) -> KernelResult<()>;

    /// Zero-centred RMSNorm: `out = x / sqrt(mean(x²) + eps) · (1 + w)` per row of `dim`.
    fn rms_norm(
        &self,
        x: &Self::Buf,
        norm: RowNorm<'_, Self::Buf>,
        out: &mut Self::Buf,
    ) -> KernelResult<()>;

    /// `residual += delta`, then `out = rms_norm(residual)` (zero-centred, as [`Self::rms_norm`]).
    fn add_rms_norm(
        &self,
        residual: &mut Self::Buf,
        delta: &Self::Buf,
        norm: RowNorm<'_, Self::Buf>,
        out: &mut Self::Buf,
    ) -> KernelResult<()>;

    /// `y = x Wᵀ` with `x: [rows, in_dim]`, `w: [out_dim, in_dim]`, `y: [rows, out_dim]`.
    fn gemm(
        &self,
        x: &Self::Buf,
        w: &Self::Buf,
        shape: GemmShape,
        y: &mut Self::Buf,
    ) -> KernelResult<()> {
        self.gemm_to(x, w, shape, Store::Replace, y)
    }

    /// [`Self::gemm`], replacing `y` or adding to it as `store` says.
    fn gemm_to(
        &self,
        x: &Self::Buf,
        w: &Self::Buf,
        shape: GemmShape,
        store: Store,
        y: &mut Self::Buf,
    ) -> KernelResult<()>;

    /// Sizes any scratch the GEMMs need for inputs of up to `values` values now, so that no
    /// forward pass allocates. Backends without scratch do nothing.
    fn reserve_gemm_input(&self, values: usize) -> KernelResult<()> {
        let _ = values;
        Ok(())
    }

    /// Zero-centred RMSNorm of every head in place (q/k norm): `(1 + w)` with `w: [head_dim]`.
    fn head_rms_norm(
        &self,
        x: &mut Self::Buf,
        weight: &Self::Buf,
        layout: HeadLayout,
        rows: usize,
        eps: f32,
    ) -> KernelResult<()>;

    /// Rotary embedding in place on every head. `positions` is `[rows, 3]` (temporal, height,
    /// width; equal for text).
    fn rope(
        &self,
        x: &mut Self::Buf,
        layout: HeadLayout,
        positions: &Self::Idx,
        rows: usize,
        rope: &Rope,
    ) -> KernelResult<()>;

    /// An attention layer's q and k preparation, in one pass where the backend can:
    /// [`Self::head_rms_norm`] of `q`'s heads and of `k`'s (each given as buffer, norm weight,
    /// head layout), then [`Self::rope`] on both. The same values, bit for bit, as those four
    /// calls.
    fn qk_norm_rope(
        &self,
        q: (&mut Self::Buf, &Self::Buf, HeadLayout),
        k: (&mut Self::Buf, &Self::Buf, HeadLayout),
        positions: &Self::Idx,
        rows: usize,
        rope: &Rope,
        eps: f32,
    ) -> KernelResult<()> {
        qk_norm_then_rope(self, q, k, (positions, rows), (rope, eps))
    }

    /// Causal GQA attention within each sequence, with the sigmoid output gate (see
    /// [`AttentionDims`] for the row layouts).
    fn attention(
        &self,
        qg: &Self::Buf,
        k: &Self::Buf,
        v: &Self::Buf,
        batch: Varlen<'_, Self::Idx>,
        dims: AttentionDims,
        out: &mut Self::Buf,
    ) -> KernelResult<()>;

    /// [`Self::attention`] at each sequence's last position only: `out[s]` (`[num_seqs,
    /// q_heads·head_dim]`) is the gated output of row `cu_seqlens[s + 1] − 1`, which attends to the
    /// whole sequence. A decision reads only the last position, so its last layer needs no more.
    fn attention_last(
        &self,
        qg: &Self::Buf,
        k: &Self::Buf,
        v: &Self::Buf,
        batch: Varlen<'_, Self::Idx>,
        dims: AttentionDims,
        out: &mut Self::Buf,
    ) -> KernelResult<()>;

    /// One gated attention layer's core on its stacked projection `qkv` (rows
    /// [`AttentionDims::stacked_width`] wide: q|gate per query head, then k, then v): the q and k
    /// head norms and rope ([`Self::qk_norm_rope`] as `prologue` says), then
    /// [`Self::attention`] (every row into `out`, `[batch.rows, q_heads·head_dim]`) or, with
    /// `last_only`, [`Self::attention_last`] (`[num_seqs, q_heads·head_dim]`). `qkv` is scratch
    /// afterwards. `out` may come from [`Self::alloc_gemm_input`]: o_proj is its only reader.
    fn gated_attention(
        &self,
        qkv: &mut Self::Buf,
        prologue: QkPrologue<'_, Self>,
        batch: Varlen<'_, Self::Idx>,
        dims: AttentionDims,
        last_only: bool,
        out: &mut Self::Buf,
    ) -> KernelResult<()>;

    /// [`Self::gated_attention`] for sequences that may continue a prefix (a prefix-state
    /// snapshot, or the previous chunk of a long prompt): sequence `s`'s queries attend to all of
    /// its rows in `prefix`, then causally to its own rows. `output.kv`, if given, receives every
    /// row's k (after norm and rope) and v, so that the batch's ends can be snapshotted. The
    /// positions in `prologue` are the batch's own, continuing each prefix.
    ///
    /// With no prefix and no kv output this is [`Self::gated_attention`], bit for bit. The default
    /// refuses anything else: a backend opts in by overriding it (the CPU and CUDA backends do).
    fn gated_attention_carried(
        &self,
        qkv: &mut Self::Buf,
        prologue: QkPrologue<'_, Self>,
        batch: Varlen<'_, Self::Idx>,
        dims: AttentionDims,
        prefix: Option<PrefixKv<'_, Self>>,
        output: AttentionOutput<'_, Self::Buf>,
    ) -> KernelResult<()> {
        if prefix.is_some() || output.kv.is_some() {
            return Err(prefix_unsupported("gated_attention_carried", self));
        }
        self.gated_attention(qkv, prologue, batch, dims, output.last_only, output.out)
    }

    /// Causal depthwise conv1d (no bias) then SiLU, per sequence: `out_t[c] = silu(Σ_i w[c][i] ·
    /// x_{t-kernel+1+i}[c])`, `w: [channels, kernel]`. `x` rows (of `channels`) sit at `x_at`, so
    /// the conv can read its block of a stacked projection; `out` is dense `[rows, channels]`.
    /// Inputs before a sequence's start are zero, or come from `window.input` (`[num_seqs,
    /// kernel-1, channels]`, oldest first: the last pre-conv rows before the sequence).
    /// `window.output`, if given, receives the same layout for the end of each sequence (for
    /// resuming it later).
    fn conv1d_silu(
        &self,
        conv: Conv1d<'_, Self::Buf>,
        batch: Varlen<'_, Self::Idx>,
        window: ConvWindow<'_, Self::Buf, Self::Idx>,
        out: &mut Self::Buf,
    ) -> KernelResult<()>;

    /// L2 norm of every head in place: `x · 1/sqrt(Σx² + eps)`.
    fn l2_norm(
        &self,
        x: &mut Self::Buf,
        layout: HeadLayout,
        rows: usize,
        eps: f32,
    ) -> KernelResult<()>;

    /// [`Self::conv1d_silu`] then [`Self::l2_norm`] of the output's heads in `l2` (DeltaNet's q and
    /// k heads) over the batch's rows, in one pass where the backend can: the same values, bit for
    /// bit (rows of `out` that belong to no sequence are left as `conv1d_silu` leaves them).
    fn conv1d_silu_l2(
        &self,
        conv: Conv1d<'_, Self::Buf>,
        batch: Varlen<'_, Self::Idx>,
        l2: L2Heads,
        out: &mut Self::Buf,
    ) -> KernelResult<()> {
        conv1d_silu_then_l2(self, conv, batch, l2, out)
    }

    /// [`Self::conv1d_silu_l2`] and [`Self::delta_gates`] (over the batch's rows) of one Gated
    /// DeltaNet layer, in one pass where the backend can: the same values, bit for bit, as the two
    /// calls.
    fn conv1d_silu_l2_gates(
        &self,
        conv: Conv1d<'_, Self::Buf>,
        batch: Varlen<'_, Self::Idx>,
        l2: L2Heads,
        out: &mut Self::Buf,
        gates: DeltaGates<'_, Self::Buf>,
        gates_out: GateOutputs<'_, Self::Buf>,
    ) -> KernelResult<()> {
        self.conv1d_silu_l2(conv, batch, l2, out)?;
        self.delta_gates(gates, batch.rows, gates_out)
    }

    /// Gated DeltaNet gates over `rows` rows of `heads`: `beta = sigmoid(b)` and
    /// `g = −exp(a_log) · softplus(a + dt_bias)` (log decay; softplus returns its input above 20).
    /// `b` and `a` rows sit at `b_at` / `a_at` (they may be two column blocks of one stacked
    /// projection); `beta` and `g` are dense `[rows, heads]`, as the delta rule reads them.
    fn delta_gates(
        &self,
        gates: DeltaGates<'_, Self::Buf>,
        rows: usize,
        out: GateOutputs<'_, Self::Buf>,
    ) -> KernelResult<()>;

    /// Gated delta rule over each sequence, chunked (64 tokens, chunk grid starting at each
    /// sequence start). Same result as [`Self::gated_delta_rule_recurrent`] up to rounding.
    fn gated_delta_rule_chunked(
        &self,
        inputs: DeltaInputs<'_, Self::Buf>,
        batch: Varlen<'_, Self::Idx>,
        dims: DeltaDims,
        state: DeltaState<'_, Self>,
        out: &mut Self::Buf,
    ) -> KernelResult<()>;

    /// A Gated DeltaNet layer's core on its stacked input projection `x`:
    /// [`Self::conv1d_silu_l2_gates`] (the conv + SiLU over the q|k|v block at `input.x_at`, with
    /// `input.kernel` taps and no carried window; q and k L2-normalised per head
    /// ([`DeltaDims::qk_layout`], `input.l2_eps`); the gates) into `scratch`, then
    /// [`Self::gated_delta_rule_chunked`] into `out`. A backend that reads the projection in the
    /// delta rule itself (CUDA) may leave the scratch untouched; the result is the same.
    fn delta_net_core(
        &self,
        input: DeltaNetInput<'_, Self::Buf>,
        batch: Varlen<'_, Self::Idx>,
        dims: DeltaDims,
        state: DeltaState<'_, Self>,
        scratch: DeltaNetScratch<'_, Self::Buf>,
        out: &mut Self::Buf,
    ) -> KernelResult<()> {
        delta_net_core_apart(self, input, (batch, dims), state, scratch, out)
    }

    /// [`Self::delta_net_core`] with the conv window carried as well as the recurrent state
    /// ([`DeltaCarry`]): sequences may resume from a snapshot's window and state, and the ends of
    /// the batch's sequences may be written out. The conv reads `carry.window.input` before each
    /// sequence's first row instead of zeros (as [`Self::conv1d_silu`] does).
    ///
    /// With no window this is [`Self::delta_net_core`]. The default refuses a window: a backend
    /// opts in by overriding it (the CPU and CUDA backends do).
    fn delta_net_core_carried(
        &self,
        input: DeltaNetInput<'_, Self::Buf>,
        batch: Varlen<'_, Self::Idx>,
        dims: DeltaDims,
        carry: DeltaCarry<'_, Self>,
        scratch: DeltaNetScratch<'_, Self::Buf>,
        out: &mut Self::Buf,
    ) -> KernelResult<()> {
        if carry.window.input.is_some() || carry.window.output.is_some() {
            return Err(prefix_unsupported("delta_net_core_carried", self));
        }
        self.delta_net_core(input, batch, dims, carry.state, scratch, out)
    }

    /// Gated delta rule token by token: `S ← e^g S; δ = β (v − Sᵀk); S ← S + k δᵀ; o = Sᵀ q`.
    fn gated_delta_rule_recurrent(
        &self,
        inputs: DeltaInputs<'_, Self::Buf>,
        batch: Varlen<'_, Self::Idx>,
        dims: DeltaDims,
        state: DeltaState<'_, Self>,
        out: &mut Self::Buf,
    ) -> KernelResult<()>;

    /// Gated RMSNorm in place, each head of `dim` on its own: `x ← w · x / sqrt(mean(x²) + eps) ·
    /// silu(z)` (plain `w: [dim]`, shared by all heads). `x` is dense `[rows, heads·dim]`; the rows
    /// of `z` (`heads·dim` each) sit at `z_at` (a column block of a stacked projection).
    fn gated_rms_norm(&self, x: &mut Self::Buf, norm: GatedNorm<'_, Self::Buf>)
        -> KernelResult<()>;

    /// SwiGLU: `out[t][i] = silu(gate_up[t][i]) · gate_up[t][inter + i]` with `gate_up:
    /// [rows, 2·inter]`.
    fn swiglu(
        &self,
        gate_up: &Self::Buf,
        rows: usize,
        inter: usize,
        out: &mut Self::Buf,
    ) -> KernelResult<()>;

    /// Gated RMSNorm then a projection: `y = g Wᵀ` (or `y += g Wᵀ`, as `proj.store` says) with
    /// `g = gated_rms_norm(x, norm)` (as [`Self::gated_rms_norm`]) and the GEMM over `norm.rows`
    /// rows of `heads·dim`. `x` may be left normalised in place, or untouched by a backend that
    /// feeds the normalised values straight into its GEMM.
    fn gated_rms_norm_gemm(
        &self,
        x: &mut Self::Buf,
        norm: GatedNorm<'_, Self::Buf>,
        proj: Projection<'_, Self::Buf>,
        y: &mut Self::Buf,
    ) -> KernelResult<()> {
        self.gated_rms_norm(x, norm)?;
        let shape = proj.shape(norm.rows, norm.width());
        self.gemm_to(x, proj.w, shape, proj.store, y)
    }

    /// SwiGLU then a projection: `y = swiglu(gate_up) Wᵀ` (or `+=`, as `proj.store` says),
    /// `gate_up: [rows, 2·inter]`, `proj.w: [out_dim, inter]`. `act` (`[rows, inter]`) may receive
    /// the SwiGLU output; a backend that feeds it straight into its GEMM leaves `act` untouched.
    fn swiglu_gemm(
        &self,
        gate_up: &Self::Buf,
        rows: usize,
        inter: usize,
        proj: Projection<'_, Self::Buf>,
        act: &mut Self::Buf,
        y: &mut Self::Buf,
    ) -> KernelResult<()> {
        self.swiglu(gate_up, rows, inter, act)?;
        self.gemm_to(act, proj.w, proj.shape(rows, inter), proj.store, y)
    }

    /// `out[slots[i]] = rows[i]` for `i < count`, rows of `width` (a screenshot's image features
    /// put in place of its image tokens' embeddings); the other rows of `out` stay as they were.
    /// A slot past `out`'s rows is refused on the CPU and skipped on a GPU (whose slots are in
    /// device memory): the caller checks its slots.
    fn scatter_rows(
        &self,
        rows: &Self::Buf,
        slots: &Self::Idx,
        count: usize,
        width: usize,
        out: &mut Self::Buf,
    ) -> KernelResult<()>;

    /// `out[s] = x[cu_seqlens[s + 1] − 1]` (each sequence's last row), `[num_seqs, dim]`.
    fn gather_last(
        &self,
        x: &Self::Buf,
        batch: Varlen<'_, Self::Idx>,
        dim: usize,
        out: &mut Self::Buf,
    ) -> KernelResult<()>;
}

/// The refusal of a backend that does not carry prefix states (yet): a clear error instead of
/// answers computed as if there were no prefix.
fn prefix_unsupported<B: Backend + ?Sized>(op: &'static str, backend: &B) -> KernelError {
    KernelError::invalid(
        op,
        format!(
            "prefix states are not implemented on {} yet",
            backend.name()
        ),
    )
}

/// Which GELU: the tanh approximation (`gelu_pytorch_tanh`, vision block MLPs) or the exact erf
/// form (`nn.GELU()`, the vision merger).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gelu {
    Tanh,
    Erf,
}

/// The extra ops of the Qwen3.5 vision tower (a ViT), on top of [`Backend`]. A separate trait so
/// a backend can serve text before it has them.
pub trait VisionBackend: Backend {
    /// LayerNorm with weight and bias per row of `dim`: `out = (x − mean) / sqrt(var + eps) · w + b`
    /// (biased variance), in `out`'s precision (from [`Backend::alloc_gemm_input`] when only a GEMM
    /// reads it: rounded as that GEMM would round it).
    fn layer_norm(
        &self,
        x: &Self::Buf,
        norm: RowNorm<'_, Self::Buf>,
        bias: &Self::Buf,
        out: &mut Self::Buf,
    ) -> KernelResult<()>;

    /// Writes the patch rows of each image (its u8 pixels normalized and packed as
    /// [`crate::patches::patchify`] packs them) into `dst`, a buffer from
    /// [`Backend::alloc_gemm_input`] (the patch embedding's input), from the image's `first_row`:
    /// in `dst`'s precision, so on a GPU as bf16, each value rounded to nearest even as the GEMM
    /// would round it. Rows no image covers are left as they were.
    fn write_patch_rows(&self, dst: &mut Self::Buf, images: &[PatchRows<'_>]) -> KernelResult<()>;

    /// `x[t] += bias` for every row `t < rows` of `dim`.
    fn add_bias(
        &self,
        x: &mut Self::Buf,
        bias: &Self::Buf,
        rows: usize,
        dim: usize,
    ) -> KernelResult<()>;

    /// `x[i] += delta[i]` for `i < len`.
    fn add_in_place(&self, x: &mut Self::Buf, delta: &Self::Buf, len: usize) -> KernelResult<()>;

    /// GELU in place over the first `len` values.
    fn gelu(&self, x: &mut Self::Buf, len: usize, kind: Gelu) -> KernelResult<()>;

    /// `out = gelu(x + bias)` for every row `t < rows` of `dim`, `out` in its own precision (from
    /// [`Backend::alloc_gemm_input`] when a GEMM reads it next: rounded as that GEMM would round
    /// `x`). `x` may be left with the bias added. The default is [`Self::add_bias`], then
    /// [`Self::gelu`], then a copy; a backend may do it in one pass with the same arithmetic.
    fn bias_gelu(
        &self,
        x: &mut Self::Buf,
        bias: &Self::Buf,
        (rows, dim): (usize, usize),
        kind: Gelu,
        out: &mut Self::Buf,
    ) -> KernelResult<()> {
        self.add_bias(x, bias, rows, dim)?;
        self.gelu(x, rows * dim, kind)?;
        self.copy(x, 0, out, 0, rows * dim)
    }

    /// `residual += x + bias` for every row `t < rows` of `dim` (`x` may be left with the bias
    /// added). The default is [`Self::add_bias`] then [`Self::add_in_place`]; a backend may do it
    /// in one pass with the same adds.
    fn add_bias_residual(
        &self,
        residual: &mut Self::Buf,
        x: &mut Self::Buf,
        bias: &Self::Buf,
        (rows, dim): (usize, usize),
    ) -> KernelResult<()> {
        self.add_bias(x, bias, rows, dim)?;
        self.add_in_place(residual, x, rows * dim)
    }

    /// `out = gelu(x Wᵀ + bias)` (`w: [out_dim, in_dim]`, `bias: [out_dim]`, as uploaded), `out`
    /// in its own precision as [`Self::bias_gelu`]'s. The default is [`Backend::gemm`] into
    /// `scratch` (f32, at least `rows · out_dim` values), then [`Self::bias_gelu`]. A backend may
    /// instead add the bias and apply the GELU in the GEMM's epilogue, leaving `scratch` as it
    /// was: one pass less over the output, with that GEMM's own GELU (not the same bits).
    fn gemm_bias_gelu(
        &self,
        x: &Self::Buf,
        (w, bias): (&Self::Buf, &Self::Buf),
        shape: GemmShape,
        kind: Gelu,
        (scratch, out): (&mut Self::Buf, &mut Self::Buf),
    ) -> KernelResult<()> {
        gemm_bias_gelu_apart(self, x, (w, bias), shape, kind, (scratch, out))
    }

    /// `residual += x Wᵀ + bias`, the bias added to the product first (as
    /// [`Self::add_bias_residual`] adds); `bias_f32` is the bias in f32 (from [`Backend::alloc`]).
    /// The default is [`Backend::gemm`] into `scratch` (f32, at least `rows · out_dim` values),
    /// then [`Self::add_bias_residual`]. A backend may do both adds, in that order, in the GEMM's
    /// epilogue (reading `bias_f32`), leaving `scratch` as it was.
    fn gemm_bias_residual(
        &self,
        x: &Self::Buf,
        (w, bias, bias_f32): (&Self::Buf, &Self::Buf, &Self::Buf),
        shape: GemmShape,
        scratch: &mut Self::Buf,
        residual: &mut Self::Buf,
    ) -> KernelResult<()> {
        let _ = bias_f32;
        gemm_bias_residual_apart(self, x, (w, bias), shape, scratch, residual)
    }

    /// 2-D axial rotary embedding in place on every head, rotating the whole head (`head_dim`
    /// divisible by 4). `positions` is `[rows, 2]` (patch row, patch column). With `D = head_dim`,
    /// `inv_freq_i = theta^(−2i/(D/2))` for `i < D/4`; the angles are `[row·inv_freq, col·inv_freq]`
    /// (`D/2` values) and pair `(d, d + D/2)` rotates by angle `d`.
    fn rope_axial(
        &self,
        x: &mut Self::Buf,
        layout: HeadLayout,
        positions: &Self::Idx,
        rows: usize,
        theta: f32,
    ) -> KernelResult<()>;

    /// Full (bidirectional) multi-head attention within each segment of `batch`. `qkv` rows are
    /// `[q: heads·head_dim][k: heads·head_dim][v: heads·head_dim]`; `out` rows are
    /// `[heads·head_dim]`, in `out`'s precision (from [`Backend::alloc_gemm_input`] when only a GEMM
    /// reads it: rounded as that GEMM would round it). Scores are scaled by `scale`.
    fn attention_bidirectional(
        &self,
        qkv: &Self::Buf,
        batch: Varlen<'_, Self::Idx>,
        heads: usize,
        head_dim: usize,
        scale: f32,
        out: &mut Self::Buf,
    ) -> KernelResult<()>;

    /// A ViT block's attention from its qkv product before the bias: `qkv += bias` (`bias` of
    /// `3·heads·head_dim`), q and k rotated by [`Self::rope_axial`] (`positions`, `theta`), then
    /// [`Self::attention_bidirectional`]. `qkv` may be left with any of the first two applied. The
    /// default runs the four ops; a backend may apply the bias and the rotary on the way into its
    /// attention, with the same arithmetic.
    fn bias_rope_attention(
        &self,
        (qkv, bias): (&mut Self::Buf, &Self::Buf),
        (positions, theta): (&Self::Idx, f32),
        batch: Varlen<'_, Self::Idx>,
        (heads, head_dim, scale): (usize, usize, f32),
        out: &mut Self::Buf,
    ) -> KernelResult<()> {
        bias_rope_attention_apart(
            self,
            (qkv, bias),
            (positions, theta),
            batch,
            (heads, head_dim, scale),
            out,
        )
    }
}

/// [`VisionBackend::gemm_bias_gelu`] as its two ops, the GEMM into `scratch` then `bias_gelu` (its
/// default, and a backend's way where its GEMM cannot take the epilogue).
pub fn gemm_bias_gelu_apart<B: VisionBackend + ?Sized>(
    be: &B,
    x: &B::Buf,
    (w, bias): (&B::Buf, &B::Buf),
    shape: GemmShape,
    kind: Gelu,
    (scratch, out): (&mut B::Buf, &mut B::Buf),
) -> KernelResult<()> {
    be.gemm(x, w, shape, scratch)?;
    be.bias_gelu(scratch, bias, (shape.rows, shape.out_dim), kind, out)
}

/// [`VisionBackend::gemm_bias_residual`] as its two ops, the GEMM into `scratch` then
/// `add_bias_residual` (its default, and a backend's way where its GEMM cannot take the epilogue).
pub fn gemm_bias_residual_apart<B: VisionBackend + ?Sized>(
    be: &B,
    x: &B::Buf,
    (w, bias): (&B::Buf, &B::Buf),
    shape: GemmShape,
    scratch: &mut B::Buf,
    residual: &mut B::Buf,
) -> KernelResult<()> {
    be.gemm(x, w, shape, scratch)?;
    be.add_bias_residual(residual, scratch, bias, (shape.rows, shape.out_dim))
}

/// [`VisionBackend::bias_rope_attention`] as its four ops, one after the other (its default, and a
/// backend's way where it cannot fuse them).
pub fn bias_rope_attention_apart<B: VisionBackend + ?Sized>(
    be: &B,
    (qkv, bias): (&mut B::Buf, &B::Buf),
    (positions, theta): (&B::Idx, f32),
    batch: Varlen<'_, B::Idx>,
    (heads, head_dim, scale): (usize, usize, f32),
    out: &mut B::Buf,
) -> KernelResult<()> {
    let width = heads * head_dim;
    be.add_bias(qkv, bias, batch.rows, 3 * width)?;
    let q = HeadLayout {
        heads,
        head_dim,
        head_stride: head_dim,
        row_stride: 3 * width,
        offset: 0,
    };
    be.rope_axial(qkv, q, positions, batch.rows, theta)?;
    let k = HeadLayout { offset: width, ..q };
    be.rope_axial(qkv, k, positions, batch.rows, theta)?;
    be.attention_bidirectional(qkv, batch, heads, head_dim, scale, out)
}

/// The largest row count of every bucket that `bucket` (a non-decreasing map from a row count to the
/// top of its bucket) makes of `1..=max_rows`, the last one cut to `max_rows`. Empty for 0.
pub fn bucket_tops(max_rows: usize, bucket: impl Fn(usize) -> usize) -> Vec<usize> {
    let mut tops = Vec::new();
    let mut rows = 1;
    while rows <= max_rows {
        let top = bucket(rows).max(rows).min(max_rows);
        tops.push(top);
        rows = top + 1;
    }
    tops
}

#[cfg(test)]
mod bucket_tests {
    use super::bucket_tops;

    #[test]
    fn bucket_tops_cover_every_row_count_once() {
        let pow2 = |r: usize| r.next_power_of_two();
        assert_eq!(bucket_tops(0, pow2), Vec::<usize>::new());
        assert_eq!(bucket_tops(1, pow2), [1]);
        assert_eq!(bucket_tops(100, pow2), [1, 2, 4, 8, 16, 32, 64, 100]);
        assert_eq!(bucket_tops(128, pow2), [1, 2, 4, 8, 16, 32, 64, 128]);
    }
}
