//! The gated delta rule token by token (`kernels/cuda/delta.cu`): the kernel for head sizes the
//! chunked form does not take, and the recurrent op itself.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::super::buffers::CudaBuf;
use super::super::launch::{to_i32, to_u32, Gpu};
use super::shared::{CudaBuffers, DeltaArgs};
use crate::backend::{DeltaDims, DeltaInputs, DeltaState, KernelResult, Varlen};
use crate::error::KernelError;

/// Largest key head of the delta rule kernel (`DELTA_MAX_K` in delta.cu).
const DELTA_MAX_K: usize = 128;
/// Largest value head of the delta rule kernel, one thread per value (`DELTA_MAX_THREADS`).
const DELTA_MAX_THREADS: usize = 256;

/// The gated delta rule, token by token (see delta.cu).
pub(crate) fn delta_rule<B: CudaBuffers + ?Sized>(
    gpu: &Gpu,
    inputs: DeltaInputs<'_, CudaBuf>,
    (batch, dims): (Varlen<'_, CudaSlice<u32>>, DeltaDims),
    state: DeltaState<'_, B>,
    out: &mut CudaBuf,
) -> KernelResult<()> {
    const OP: &str = "gated_delta_rule";
    let (k_heads, v_heads, k_dim, v_dim) = (dims.k_heads, dims.v_heads, dims.k_dim, dims.v_dim);
    if k_heads == 0 || k_dim == 0 || v_dim == 0 || !v_heads.is_multiple_of(k_heads) {
        return Err(KernelError::invalid(
            OP,
            format!("v_heads {v_heads} must be a multiple of k_heads {k_heads}; dims > 0"),
        ));
    }
    if k_dim > DELTA_MAX_K || v_dim > DELTA_MAX_THREADS {
        return Err(KernelError::invalid(
            OP,
            format!("k_dim {k_dim} (max {DELTA_MAX_K}) or v_dim {v_dim} (max {DELTA_MAX_THREADS}) too large"),
        ));
    }
    let Some(mut args) = DeltaArgs::check(OP, inputs, batch, dims, state, out)? else {
        return Ok(());
    };
    let cfg = LaunchConfig {
        grid_dim: (
            to_u32(OP, "num_seqs", batch.num_seqs)?,
            to_u32(OP, "v_heads", v_heads)?,
            1,
        ),
        block_dim: (to_u32(OP, "v_dim", v_dim.div_ceil(32) * 32)?, 1, 1),
        shared_mem_bytes: 0,
    };
    let k_heads_a = to_i32(OP, "k_heads", dims.k_heads)?;
    let v_heads_a = to_i32(OP, "v_heads", dims.v_heads)?;
    let k_dim_a = to_i32(OP, "k_dim", dims.k_dim)?;
    let v_dim_a = to_i32(OP, "v_dim", dims.v_dim)?;
    let scale = (dims.k_dim as f64).powf(-0.5) as f32;
    let rows_cap_a = to_u32(OP, "rows", args.rows_cap)?;
    // SAFETY: argument types match the kernel; state buffers hold num_seqs states (checked
    // by DeltaArgs); the kernel clamps every sequence to rows_cap rows; the launch is sized for
    // it (one thread per value column).
    unsafe {
        gpu.launch(OP, "gated_delta_rule_recurrent", cfg, |launch| {
            launch.arg(args.qkv).arg(args.beta).arg(args.g);
            args.push_states_and_out(launch);
            launch
                .arg(&k_heads_a)
                .arg(&v_heads_a)
                .arg(&k_dim_a)
                .arg(&v_dim_a)
                .arg(&scale)
                .arg(&rows_cap_a);
        })
    }
}
