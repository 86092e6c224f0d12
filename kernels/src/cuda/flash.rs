//! Launch of the tensor-core flash attention kernels (`kernels/cuda/flash_attention.cu`).
//!
//! [`CudaBackend::attention`](crate::Backend::attention) checks the arguments, then routes head
//! dims this kernel supports here and keeps the naive `attention_gated` kernel for the rest.

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::backend::{to_i32, to_u32, CudaBackend};
use super::device::driver_err;
use crate::backend::{AttentionDims, KernelResult, Varlen};

/// Query rows per block (`FA_BM`).
const BM: usize = 128;
/// Keys per shared-memory tile (`FA_BN`).
const BN: usize = 64;
/// Threads per block (`FA_THREADS`: 8 warps of 16 query rows).
const THREADS: u32 = 256;
/// bf16 padding per shared-memory row (`FA_PAD`).
const PAD: usize = 8;

/// The kernel entry point for `head_dim` and the head size it lays its tiles out for, or `None`
/// where the naive kernel must run (head dims that are not a multiple of 16, or above 256).
pub(super) fn flash_variant(head_dim: usize) -> Option<(&'static str, usize)> {
    if head_dim == 0 || !head_dim.is_multiple_of(16) {
        return None;
    }
    match head_dim {
        1..=64 => Some(("flash_attention_d64", 64)),
        65..=128 => Some(("flash_attention_d128", 128)),
        129..=256 => Some(("flash_attention_d256", 256)),
        _ => None,
    }
}

/// Dynamic shared memory of the kernel laid out for head size `d`: the Q tile, one K and one V
/// tile, bf16 with padded rows. 132 KiB at d = 256 (one block per SM on H200 and A100).
pub(super) fn flash_smem_bytes(d: usize) -> usize {
    (BM + 2 * BN) * (d + PAD) * 2
}

/// Query tiles to launch for a batch: `Σ ceil(len_s / BM) ≤ ceil(rows / BM) + num_seqs`, an
/// upper bound that needs no look at `cu_seqlens` (blocks beyond the real count exit at once).
pub(super) fn flash_tiles(rows: usize, num_seqs: usize) -> usize {
    rows.div_ceil(BM) + num_seqs
}

impl CudaBackend {
    /// Gated causal GQA attention with the flash kernel. The caller (`attention`) has checked the
    /// dims, that every buffer holds `batch.rows` rows, and that `flash_variant(head_dim)` is
    /// `Some`; `batch.rows` and `batch.num_seqs` are non-zero.
    pub(super) fn flash_attention(
        &self,
        qg: &CudaSlice<f32>,
        k: &CudaSlice<f32>,
        v: &CudaSlice<f32>,
        batch: Varlen<'_, CudaSlice<u32>>,
        dims: AttentionDims,
        out: &mut CudaSlice<f32>,
    ) -> KernelResult<()> {
        const OP: &str = "attention";
        let Some((name, d)) = flash_variant(dims.head_dim) else {
            return Err(crate::error::KernelError::invalid(
                OP,
                format!("flash attention does not take head_dim {}", dims.head_dim),
            ));
        };
        let smem = flash_smem_bytes(d);
        let f = self.device.function(name)?;
        // Above 48 KiB a kernel must opt in. Setting it on every launch costs a host-side driver
        // call, is no stream operation (so it is fine during graph capture), and keeps the
        // attribute with the function, whichever backend instance launches it.
        f.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            to_i32(OP, "shared memory", smem)?,
        )
        .map_err(|e| driver_err("attention: shared memory opt-in", e))?;
        let cfg = LaunchConfig {
            grid_dim: (
                to_u32(OP, "query tiles", flash_tiles(batch.rows, batch.num_seqs))?,
                to_u32(OP, "q_heads", dims.q_heads)?,
                1,
            ),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: to_u32(OP, "shared memory", smem)?,
        };
        let num_seqs = to_i32(OP, "num_seqs", batch.num_seqs)?;
        let rows = to_u32(OP, "rows", batch.rows)?;
        let q_heads = to_i32(OP, "q_heads", dims.q_heads)?;
        let kv_heads = to_i32(OP, "kv_heads", dims.kv_heads)?;
        let head_dim = to_i32(OP, "head_dim", dims.head_dim)?;
        let mut launch = self.device.stream.launch_builder(f);
        launch
            .arg(qg)
            .arg(k)
            .arg(v)
            .arg(batch.cu_seqlens)
            .arg(&num_seqs)
            .arg(&rows)
            .arg(out)
            .arg(&q_heads)
            .arg(&kv_heads)
            .arg(&head_dim)
            .arg(&dims.scale);
        // SAFETY: argument types match the kernel; it clamps every sequence boundary to `rows`,
        // which every buffer holds (checked by the caller).
        unsafe { launch.launch(cfg) }.map_err(|e| driver_err(OP, e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_dims_route_to_the_smallest_layout_that_holds_them() {
        assert_eq!(flash_variant(256), Some(("flash_attention_d256", 256)));
        assert_eq!(flash_variant(144), Some(("flash_attention_d256", 256)));
        assert_eq!(flash_variant(128), Some(("flash_attention_d128", 128)));
        assert_eq!(flash_variant(80), Some(("flash_attention_d128", 128)));
        assert_eq!(flash_variant(64), Some(("flash_attention_d64", 64)));
        assert_eq!(flash_variant(16), Some(("flash_attention_d64", 64)));
        for naive in [0, 8, 24, 40, 100, 255, 272, 512] {
            assert_eq!(flash_variant(naive), None, "head_dim {naive}");
        }
    }

    #[test]
    fn shared_memory_fits_one_block_per_sm() {
        // H200 allows 227 KiB per block, A100 163 KiB.
        assert_eq!(flash_smem_bytes(256), 135_168);
        assert!(flash_smem_bytes(256) <= 163 * 1024);
    }

    #[test]
    fn the_grid_bounds_the_tiles_of_any_split() {
        // Σ ceil(len / BM) over any split of `rows` into `n` sequences is at most this.
        for lens in [
            &[1usize][..],
            &[128],
            &[129],
            &[1, 127, 128, 129, 300],
            &[15_446],
        ] {
            let rows: usize = lens.iter().sum();
            let tiles: usize = lens.iter().map(|l| l.div_ceil(BM)).sum();
            assert!(tiles <= flash_tiles(rows, lens.len()), "{lens:?}");
        }
    }
}
