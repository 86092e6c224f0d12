//! What several op files share: the batch check, the CUDA buffer types as the generic argument
//! structs name them, the checked argument packs of the gate and delta-rule kernels, and the
//! tail of the fused projections. Kept apart from `mod.rs` so that every op file imports only
//! downwards.

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaSlice, LaunchArgs, PushKernelArg};
use half::bf16;

use super::super::blas::{Epilogue, GemmInput};
use super::super::buffers::{act, act_mut, idx, in_buf, weight, CudaBuf, InBuf, OutBuf};
use super::super::device::driver_err;
use super::super::launch::{to_i32, Gpu};
use crate::backend::{
    Buffers, DeltaDims, DeltaGates, DeltaInputs, DeltaState, KernelResult, Projection, Store,
    Varlen,
};
use crate::error::KernelError;

/// The buffer types of the CUDA backend, as the generic argument structs name them (the ops take
/// any `B` with these types, so they need not name the backend).
pub(crate) trait CudaBuffers: Buffers<Buf = CudaBuf, Idx = CudaSlice<u32>> {}
impl<B: Buffers<Buf = CudaBuf, Idx = CudaSlice<u32>> + ?Sized> CudaBuffers for B {}

/// Sets a kernel's dynamic shared memory limit (above the default 48 KB a kernel must opt
/// in: a driver call on the function, made with its context current).
pub(crate) fn opt_in_smem(
    gpu: &Gpu,
    op: &'static str,
    kernel: &str,
    bytes: usize,
) -> KernelResult<()> {
    let f = gpu.device.function(kernel)?;
    gpu.device
        .ctx
        .bind_to_thread()
        .map_err(|e| driver_err(op, e))?;
    f.set_attribute(
        CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        to_i32(op, "shared memory", bytes)?,
    )
    .map_err(|e| driver_err(op, e))
}

/// Checks the host-known part of a batch (`cu_seqlens` has `num_seqs + 1` entries, `batch.rows`
/// fits in `rows_cap`, the rows every buffer of the op holds) and returns the rows to launch over.
/// The contents of `cu_seqlens` stay on the device: kernels read them there and never step beyond
/// the returned row count, whatever they hold.
pub(crate) fn check_batch(
    op: &'static str,
    batch: &Varlen<'_, CudaSlice<u32>>,
    rows_cap: usize,
) -> KernelResult<usize> {
    idx(op, "cu_seqlens", batch.cu_seqlens, batch.num_seqs + 1)?;
    if batch.rows > rows_cap {
        return Err(KernelError::invalid(
            op,
            format!("batch has {} rows, buffers hold {rows_cap}", batch.rows),
        ));
    }
    Ok(batch.rows)
}

/// The checked weight and f32 output of the projection a fused op ends with, over `rows` rows of
/// `in_dim`; `None` when the projection writes nothing (no rows or no output columns).
pub(crate) fn projection_operands<'w, 'y>(
    op: &'static str,
    proj: &Projection<'w, CudaBuf>,
    (rows, in_dim): (usize, usize),
    y: &'y mut CudaBuf,
) -> KernelResult<Option<(&'w CudaSlice<bf16>, &'y mut CudaSlice<f32>)>> {
    let w = weight(op, "w", proj.w, proj.out_dim * in_dim)?;
    let y = act_mut(op, "y", y, rows * proj.out_dim)?;
    Ok((rows > 0 && proj.out_dim > 0).then_some((w, y)))
}

/// The cuBLASLt GEMM of a fused op, whose `convert` writes the bf16 input (the op's first half)
/// into the GEMM's scratch. `Ok(false)`, nothing launched, where cuBLASLt has no plan for the
/// shape (or `in_dim` is 0, so `convert` only ever runs with a non-empty input): the caller then
/// runs the op's two halves.
pub(crate) fn fused_gemm(
    gpu: &Gpu,
    (rows, in_dim): (usize, usize),
    (w, out_dim, y): (&CudaSlice<bf16>, usize, &mut CudaSlice<f32>),
    store: Store,
    convert: impl FnOnce(&mut CudaSlice<bf16>) -> KernelResult<()>,
) -> KernelResult<bool> {
    let output = (w, out_dim, OutBuf::F32(y));
    Ok(in_dim > 0
        && gpu.blas.gemm(
            rows,
            in_dim,
            output,
            (store, Epilogue::None),
            GemmInput::Convert(convert),
        )?)
}

/// The checked inputs of the gates as the conv kernel and `gdr_prepare_conv` read them (`gb` ..
/// `dt_bias`).
pub(crate) struct GateInputs<'a> {
    b: InBuf<'a>,
    a: InBuf<'a>,
    /// b's row stride and offset, a's, and the heads.
    ints: [i32; 5],
    a_log: &'a CudaSlice<bf16>,
    dt_bias: &'a CudaSlice<bf16>,
}

impl<'a> GateInputs<'a> {
    /// Checks `gates` for `rows` rows read by a kernel whose x is bf16 (`x_bf16`) or f32.
    pub(crate) fn new(
        op: &'static str,
        gates: &DeltaGates<'a, CudaBuf>,
        rows: usize,
        x_bf16: bool,
    ) -> KernelResult<Self> {
        let heads = gates.heads;
        let b = in_buf(op, "b", gates.b, gates.b_at.required_len(rows, heads))?;
        let a = in_buf(op, "a", gates.a, gates.a_at.required_len(rows, heads))?;
        if b.is_bf16() != x_bf16 || a.is_bf16() != x_bf16 {
            return Err(KernelError::invalid(
                op,
                "the gates' b and a must have x's type (the kernel reads all three)",
            ));
        }
        let i = |what, v| to_i32(op, what, v);
        Ok(Self {
            b,
            a,
            ints: [
                i("b row stride", gates.b_at.row_stride)?,
                i("b offset", gates.b_at.offset)?,
                i("a row stride", gates.a_at.row_stride)?,
                i("a offset", gates.a_at.offset)?,
                i("gate heads", heads)?,
            ],
            a_log: weight(op, "a_log", gates.a_log, heads)?,
            dt_bias: weight(op, "dt_bias", gates.dt_bias, heads)?,
        })
    }

    /// The gate heads, as the conv kernel takes them.
    pub(crate) fn heads(&self) -> &i32 {
        &self.ints[4]
    }

    /// Pushes `gb, gb_stride, gb_offset, ga, ga_stride, ga_offset, a_log, dt_bias`.
    pub(crate) fn push<'b>(&'b self, launch: &mut LaunchArgs<'b>) {
        self.b.push(launch);
        launch.arg(&self.ints[0]).arg(&self.ints[1]);
        self.a.push(launch);
        launch
            .arg(&self.ints[2])
            .arg(&self.ints[3])
            .arg(self.a_log)
            .arg(self.dt_bias);
    }
}

/// The checked buffers of a delta-rule launch.
pub(crate) struct DeltaArgs<'a> {
    pub qkv: &'a CudaSlice<f32>,
    pub beta: &'a CudaSlice<f32>,
    pub g: &'a CudaSlice<f32>,
    pub cu_seqlens: &'a CudaSlice<u32>,
    pub initial: Option<&'a CudaSlice<f32>>,
    pub final_out: Option<&'a mut CudaSlice<f32>>,
    /// Per sequence, after how many tokens `final_out` takes the state (`None`: at the end).
    pub final_at: Option<&'a CudaSlice<u32>>,
    pub out: &'a mut CudaSlice<f32>,
    /// Rows every buffer holds and the batch covers: the kernels clamp the sequences to it.
    pub rows_cap: usize,
    /// Whether the states are present, as the kernels take it.
    has_initial: i32,
    has_final: i32,
    has_final_at: i32,
}

impl<'a> DeltaArgs<'a> {
    /// Checks buffer types and lengths against `dims` and the batch; `None` when there is nothing
    /// to compute (no sequence or no value head).
    pub(crate) fn check<B: CudaBuffers + ?Sized>(
        op: &'static str,
        inputs: DeltaInputs<'a, CudaBuf>,
        batch: Varlen<'a, CudaSlice<u32>>,
        dims: DeltaDims,
        state: DeltaState<'a, B>,
        out: &'a mut CudaBuf,
    ) -> KernelResult<Option<Self>> {
        let DeltaInputs { qkv, beta, g } = inputs;
        let v_heads = dims.v_heads;
        let rows_cap = [
            qkv.len() / dims.qkv_width().max(1),
            beta.len() / v_heads.max(1),
            g.len() / v_heads.max(1),
            out.len() / (v_heads * dims.v_dim).max(1),
        ]
        .into_iter()
        .min()
        .unwrap_or(0);
        let rows_cap = check_batch(op, &batch, rows_cap)?;
        let state_len = batch.num_seqs * dims.state_len();
        let has_initial = i32::from(state.initial.is_some());
        let has_final = i32::from(state.final_out.is_some());
        let has_final_at = i32::from(state.final_at.is_some());
        let args = Self {
            qkv: act(op, "qkv", qkv, 0)?,
            beta: act(op, "beta", beta, 0)?,
            g: act(op, "g", g, 0)?,
            cu_seqlens: batch.cu_seqlens,
            initial: state
                .initial
                .map(|s| act(op, "initial state", s, state_len))
                .transpose()?,
            final_out: state
                .final_out
                .map(|s| act_mut(op, "final state", s, state_len))
                .transpose()?,
            final_at: state
                .final_at
                .map(|at| idx(op, "final_at", at, batch.num_seqs))
                .transpose()?,
            out: act_mut(op, "out", out, 0)?,
            rows_cap,
            has_initial,
            has_final,
            has_final_at,
        };
        Ok((batch.num_seqs > 0 && v_heads > 0).then_some(args))
    }

    /// Pushes the arguments every delta-rule kernel takes in this order: `cu_seqlens, initial,
    /// has_initial, final_state, has_final, final_at, has_final_at, out`. The kernels never touch
    /// an absent state or count (has_* = 0); qkv and cu_seqlens stand in for them as valid
    /// pointers.
    pub(crate) fn push_states_and_out<'b>(&'b mut self, launch: &mut LaunchArgs<'b>) {
        launch
            .arg(self.cu_seqlens)
            .arg(self.initial.unwrap_or(self.qkv))
            .arg(&self.has_initial);
        match self.final_out.as_deref_mut() {
            Some(final_state) => launch.arg(final_state),
            None => launch.arg(self.qkv),
        };
        launch
            .arg(&self.has_final)
            .arg(self.final_at.unwrap_or(self.cu_seqlens))
            .arg(&self.has_final_at)
            .arg(&mut *self.out);
    }
}
