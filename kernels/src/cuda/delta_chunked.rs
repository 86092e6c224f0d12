//! The chunked gated delta rule (`delta_chunked.cu`): one block per (sequence, value head, slice of
//! value columns) walking its sequence 64 tokens at a time, for prefill, in f32 SIMT arithmetic.
//! (A 3xTF32 tensor-core variant of the same kernel was measured slower on the H200: 9.7 against
//! 8.2 ms per layer at 15,446 tokens, 14.3 against 12.2 ms at 128 × 300; it was dropped.)

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaSlice, LaunchConfig};

use super::backend::{to_i32, to_u32, CudaBackend, DeltaArgs};
use super::buffers::CudaBuf;
use super::device::driver_err;
use crate::backend::{DeltaDims, DeltaState, KernelResult, Varlen};
use crate::error::KernelError;

/// Tokens per chunk (`DC_CHUNK`).
const CHUNK: usize = 64;
/// Key heads are zero-padded to this width (`DC_DK`); wider ones run the recurrent kernel.
const MAX_K: usize = 128;
/// Widest value head the chunked kernel takes; wider ones run the recurrent kernel.
const MAX_V: usize = 128;
/// Threads per block (`DC_THREADS`).
const THREADS: u32 = 256;
/// Row stride of the kernel's 64×64 A and P tiles (`DC_AP`).
const AP_STRIDE: usize = 68;
/// Dynamic shared memory of the kernel with `sv` value columns per block: k and q/W tiles, the
/// state slice, the v/U/V' tile, A and P, and five per-token vectors (the layout at the top of
/// `delta_chunked` in the .cu file).
fn smem_bytes(sv: usize) -> usize {
    4 * (2 * CHUNK * MAX_K + MAX_K * sv + CHUNK * sv + 2 * CHUNK * AP_STRIDE + 5 * CHUNK)
}

/// The kernel and its shared memory for `sv`-column slices.
fn kernel_for(sv: usize) -> (&'static str, usize) {
    match sv {
        64 => ("gated_delta_rule_chunked_v64", smem_bytes(64)),
        _ => ("gated_delta_rule_chunked_v32", smem_bytes(32)),
    }
}

/// Whether 64-column slices beat 32-column ones for `pairs` (sequence, head) pairs on `sms` SMs
/// (one block per SM fits, by shared memory). A 64-column block costs about 3/2 of a 32-column
/// one per chunk (A, P and W are recomputed per slice, the rest scales with the width), so wide
/// slices win unless narrow ones fill the GPU in as many waves: one long prompt (32 pairs) runs
/// 128 narrow blocks in one wave rather than 64 wide ones with half the SMs idle. Sequences are
/// assumed equally long.
fn wide_slices_win(pairs: usize, v_dim: usize, sms: usize) -> bool {
    let waves = |sv: usize| (pairs * v_dim.div_ceil(sv)).div_ceil(sms);
    v_dim > 32 && 3 * waves(64) <= 2 * waves(32)
}

impl CudaBackend {
    /// Whether [`Self::delta_rule_chunked`] takes `dims` on this GPU (else the recurrent kernel
    /// runs, which also reports invalid dims).
    pub(super) fn delta_chunked_supports(&self, dims: DeltaDims) -> bool {
        let DeltaDims {
            k_heads,
            v_heads,
            k_dim,
            v_dim,
        } = dims;
        let shapes = k_heads > 0
            && v_heads.is_multiple_of(k_heads)
            && (1..=MAX_K).contains(&k_dim)
            && (1..=MAX_V).contains(&v_dim);
        // Opt-in shared memory per block: 227 KB on Hopper, 163 KB on A100.
        shapes && self.device.max_smem_optin >= kernel_for(32).1
    }

    /// The gated delta rule by 64-token chunks; the caller checked
    /// [`Self::delta_chunked_supports`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn delta_rule_chunked(
        &self,
        qkv: &CudaBuf,
        beta: &CudaBuf,
        g: &CudaBuf,
        batch: Varlen<'_, CudaSlice<u32>>,
        dims: DeltaDims,
        state: DeltaState<'_, Self>,
        out: &mut CudaBuf,
    ) -> KernelResult<()> {
        const OP: &str = "gated_delta_rule_chunked";
        let DeltaDims { v_heads, v_dim, .. } = dims;
        if !self.delta_chunked_supports(dims) {
            return Err(KernelError::invalid(
                OP,
                format!(
                    "unsupported dims {dims:?} (k_dim, v_dim ≤ 128, v_heads a multiple of k_heads)"
                ),
            ));
        }
        let Some(args) = DeltaArgs::check(OP, qkv, beta, g, batch, dims, state, out)? else {
            return Ok(());
        };

        let sms = self.device.sm_count.max(1);
        let fits_64 = self.device.max_smem_optin >= kernel_for(64).1;
        let sv = if fits_64 && wide_slices_win(batch.num_seqs * v_heads, v_dim, sms) {
            64
        } else {
            32
        };
        let (kernel, smem) = kernel_for(sv);
        let smem_a = to_u32(OP, "shared memory", smem)?;
        let cfg = LaunchConfig {
            grid_dim: (
                to_u32(OP, "num_seqs", batch.num_seqs)?,
                to_u32(OP, "v_heads", v_heads)?,
                to_u32(OP, "value slices", v_dim.div_ceil(sv))?,
            ),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: smem_a,
        };
        let f = self.device.function(kernel)?;
        // Above the default 48 KB of dynamic shared memory a kernel must opt in (a driver call on
        // the function, made with its context current).
        self.device
            .ctx
            .bind_to_thread()
            .map_err(|e| driver_err(OP, e))?;
        f.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            to_i32(OP, "shared memory", smem)?,
        )
        .map_err(|e| driver_err(OP, e))?;
        self.launch_delta(OP, kernel, args, cfg)
    }
}
