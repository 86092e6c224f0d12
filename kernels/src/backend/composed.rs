//! Composite ops as their parts: the trait's defaults, and a fusing backend's path for the shapes
//! its kernel does not take.

use super::{
    AttentionDims, Backend, Conv1d, ConvWindow, DeltaCarry, DeltaDims, DeltaInputs, DeltaNetInput,
    DeltaNetScratch, DeltaState, GateOutputs, HeadLayout, KernelResult, L2Heads, QkPrologue, Rope,
    Varlen,
};

/// [`Backend::conv1d_silu_l2`] as its two ops: the trait's default, and a fusing backend's path for
/// layouts its kernel does not take.
pub(crate) fn conv1d_silu_then_l2<B: Backend + ?Sized>(
    be: &B,
    conv: Conv1d<'_, B::Buf>,
    batch: Varlen<'_, B::Idx>,
    l2: L2Heads,
    out: &mut B::Buf,
) -> KernelResult<()> {
    be.conv1d_silu(conv, batch, ConvWindow::none(), out)?;
    be.l2_norm(out, l2.layout, batch.rows, l2.eps)
}

/// [`Backend::qk_norm_rope`] as its four ops: the trait's default, and a fusing backend's path for
/// shapes its kernel does not take.
pub(crate) fn qk_norm_then_rope<B: Backend + ?Sized>(
    be: &B,
    q: (&mut B::Buf, &B::Buf, HeadLayout),
    k: (&mut B::Buf, &B::Buf, HeadLayout),
    (positions, rows): (&B::Idx, usize),
    (rope, eps): (&Rope, f32),
) -> KernelResult<()> {
    let ((q, q_norm, q_layout), (k, k_norm, k_layout)) = (q, k);
    be.head_rms_norm(q, q_norm, q_layout, rows, eps)?;
    be.head_rms_norm(k, k_norm, k_layout, rows, eps)?;
    be.rope(q, q_layout, positions, rows, rope)?;
    be.rope(k, k_layout, positions, rows, rope)
}

/// The q and k head norms then rope of a stacked attention projection (`qkv`, rows
/// [`AttentionDims::stacked_width`] wide), in place, as the four ops: the prologue a resumable
/// attention layer runs before its keys are kept.
pub(crate) fn stacked_norm_rope<B: Backend + ?Sized>(
    be: &B,
    qkv: &mut B::Buf,
    prologue: QkPrologue<'_, B>,
    (dims, rows): (AttentionDims, usize),
) -> KernelResult<()> {
    let (q_at, k_at) = (dims.stacked_q_heads(), dims.stacked_k_heads());
    let (positions, eps) = (prologue.positions, prologue.eps);
    be.head_rms_norm(qkv, prologue.q_norm, q_at, rows, eps)?;
    be.head_rms_norm(qkv, prologue.k_norm, k_at, rows, eps)?;
    be.rope(qkv, q_at, positions, rows, prologue.rope)?;
    be.rope(qkv, k_at, positions, rows, prologue.rope)
}

/// [`Backend::delta_net_core`] as its two ops: the trait's default, and a fusing backend's path for
/// shapes its kernel does not take.
pub(crate) fn delta_net_core_apart<B: Backend + ?Sized>(
    be: &B,
    input: DeltaNetInput<'_, B::Buf>,
    (batch, dims): (Varlen<'_, B::Idx>, DeltaDims),
    state: DeltaState<'_, B>,
    scratch: DeltaNetScratch<'_, B::Buf>,
    out: &mut B::Buf,
) -> KernelResult<()> {
    let DeltaNetScratch { conv, beta, g } = scratch;
    let conv_in = delta_conv(&input, dims);
    let l2 = L2Heads {
        layout: dims.qk_layout(),
        eps: input.l2_eps,
    };
    be.conv1d_silu_l2_gates(
        conv_in,
        batch,
        l2,
        conv,
        input.gates,
        GateOutputs { beta, g },
    )?;
    let inputs = DeltaInputs {
        qkv: &*conv,
        beta: &*beta,
        g: &*g,
    };
    be.gated_delta_rule_chunked(inputs, batch, dims, state, out)
}

/// The conv over the q|k|v block of a DeltaNet layer's stacked projection.
fn delta_conv<'a, Buf>(input: &DeltaNetInput<'a, Buf>, dims: DeltaDims) -> Conv1d<'a, Buf> {
    Conv1d {
        x: input.x,
        x_at: input.x_at,
        weight: input.conv_weight,
        channels: dims.qkv_width(),
        kernel: input.kernel,
    }
}

/// [`Backend::delta_net_core_carried`] as its ops: the conv with the carried window, the q/k L2
/// norm, the gates and the chunked rule with the carried state. The same ops as
/// [`delta_net_core_apart`] when nothing is carried.
pub(crate) fn delta_net_core_carried_apart<B: Backend + ?Sized>(
    be: &B,
    input: DeltaNetInput<'_, B::Buf>,
    (batch, dims): (Varlen<'_, B::Idx>, DeltaDims),
    carry: DeltaCarry<'_, B>,
    scratch: DeltaNetScratch<'_, B::Buf>,
    out: &mut B::Buf,
) -> KernelResult<()> {
    let DeltaNetScratch { conv, beta, g } = scratch;
    let conv_in = delta_conv(&input, dims);
    be.conv1d_silu(conv_in, batch, carry.window, conv)?;
    be.l2_norm(conv, dims.qk_layout(), batch.rows, input.l2_eps)?;
    be.delta_gates(input.gates, batch.rows, GateOutputs { beta, g })?;
    let inputs = DeltaInputs {
        qkv: &*conv,
        beta: &*beta,
        g: &*g,
    };
    be.gated_delta_rule_chunked(inputs, batch, dims, carry.state, out)
}
