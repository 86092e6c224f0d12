//! Composite ops as their parts: the trait's defaults, and a fusing backend's path for the shapes
//! its kernel does not take.

use super::{
    Backend, DeltaDims, DeltaGates, DeltaState, HeadLayout, KernelResult, Rope, Strided, Varlen,
};

/// [`Backend::conv1d_silu_l2`] as its two ops: the trait's default, and a fusing backend's path for
/// layouts its kernel does not take.
#[allow(clippy::too_many_arguments)]
pub(crate) fn conv1d_silu_then_l2<B: Backend + ?Sized>(
    be: &B,
    x: &B::Buf,
    x_at: Strided,
    weight: &B::Buf,
    batch: Varlen<'_, B::Idx>,
    channels: usize,
    kernel: usize,
    l2: HeadLayout,
    eps: f32,
    out: &mut B::Buf,
) -> KernelResult<()> {
    be.conv1d_silu(x, x_at, weight, batch, channels, kernel, None, None, out)?;
    be.l2_norm(out, l2, batch.rows, eps)
}

/// [`Backend::qk_norm_rope`] as its four ops: the trait's default, and a fusing backend's path for
/// shapes its kernel does not take.
pub(crate) fn qk_norm_then_rope<B: Backend + ?Sized>(
    be: &B,
    (q, q_norm, q_layout): (&mut B::Buf, &B::Buf, HeadLayout),
    (k, k_norm, k_layout): (&mut B::Buf, &B::Buf, HeadLayout),
    positions: &B::Idx,
    rows: usize,
    rope: &Rope,
    eps: f32,
) -> KernelResult<()> {
    be.head_rms_norm(q, q_norm, q_layout, rows, eps)?;
    be.head_rms_norm(k, k_norm, k_layout, rows, eps)?;
    be.rope(q, q_layout, positions, rows, rope)?;
    be.rope(k, k_layout, positions, rows, rope)
}

/// [`Backend::delta_gates`] of `gates` over `rows` rows: the second half of
/// [`Backend::conv1d_silu_l2_gates`] where a backend does not fuse it.
pub(crate) fn gates_apart<B: Backend + ?Sized>(
    be: &B,
    gates: DeltaGates<'_, B::Buf>,
    rows: usize,
    (beta, g): (&mut B::Buf, &mut B::Buf),
) -> KernelResult<()> {
    let DeltaGates {
        b,
        b_at,
        a,
        a_at,
        a_log,
        dt_bias,
        heads,
    } = gates;
    be.delta_gates(b, b_at, a, a_at, a_log, dt_bias, rows, heads, beta, g)
}

/// [`Backend::delta_net_core`] as its two ops: the trait's default, and a fusing backend's path for
/// shapes its kernel does not take.
#[allow(clippy::too_many_arguments)]
pub(crate) fn delta_net_core_apart<B: Backend + ?Sized>(
    be: &B,
    (x, x_at): (&B::Buf, Strided),
    (conv_weight, kernel, l2_eps): (&B::Buf, usize, f32),
    gates: DeltaGates<'_, B::Buf>,
    batch: Varlen<'_, B::Idx>,
    dims: DeltaDims,
    state: DeltaState<'_, B>,
    (conv, beta, g): (&mut B::Buf, &mut B::Buf, &mut B::Buf),
    out: &mut B::Buf,
) -> KernelResult<()> {
    be.conv1d_silu_l2_gates(
        x,
        x_at,
        conv_weight,
        batch,
        dims.qkv_width(),
        kernel,
        (dims.qk_layout(), l2_eps),
        conv,
        gates,
        (beta, g),
    )?;
    be.gated_delta_rule_chunked(conv, beta, g, batch, dims, state, out)
}
