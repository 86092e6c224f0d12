//! What every op launches with: the GPU context the backend owns, the one launch helper, and the
//! conversions and launch shapes the ops share.

use cudarc::driver::{LaunchArgs, LaunchConfig};

use super::blas::Blas;
use super::device::{driver_err, Device};
use super::workspace::Workspace;
use crate::backend::KernelResult;
use crate::error::KernelError;

/// Threads per block of the element-wise and row kernels.
pub(crate) const BLOCK: u32 = 256;

/// Everything an op reads from the backend: the device (its kernels, stream and limits), cuBLASLt,
/// and the scratch the ops share. The backend owns it; the op files borrow it, so they never need
/// the backend itself.
pub(crate) struct Gpu {
    pub device: Device,
    pub blas: Blas,
    pub workspace: Workspace,
}

impl Gpu {
    /// Launches kernel `kernel` on the backend's stream with the arguments `push` adds, in order:
    /// the one place that looks a kernel up, builds its launch and maps the driver's error to `op`.
    ///
    /// # Safety
    /// `push` must add arguments of the kernel's parameter types in its order, and `cfg` and the
    /// buffers must keep every access of the kernel in bounds (each caller says why at its call).
    pub(crate) unsafe fn launch<'a>(
        &'a self,
        op: &'static str,
        kernel: &str,
        cfg: LaunchConfig,
        push: impl FnOnce(&mut LaunchArgs<'a>),
    ) -> KernelResult<()> {
        let f = self.device.function(kernel)?;
        let mut launch = self.device.stream.launch_builder(f);
        push(&mut launch);
        // SAFETY: the caller's contract (above).
        unsafe { launch.launch(cfg) }.map_err(|e| driver_err(op, e))?;
        Ok(())
    }
}

pub(crate) fn to_i32(op: &'static str, what: &str, v: usize) -> KernelResult<i32> {
    i32::try_from(v).map_err(|_| KernelError::invalid(op, format!("{what} {v} exceeds i32")))
}

pub(crate) fn to_u32(op: &'static str, what: &str, v: usize) -> KernelResult<u32> {
    u32::try_from(v).map_err(|_| KernelError::invalid(op, format!("{what} {v} exceeds u32")))
}

/// A 1-D launch with one thread per item.
pub(crate) fn linear(op: &'static str, items: usize, block: u32) -> KernelResult<LaunchConfig> {
    let blocks = to_u32(op, "grid size", items.div_ceil(block as usize))?;
    Ok(LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// One block of [`BLOCK`] threads per row.
pub(crate) fn per_row(op: &'static str, rows: usize) -> KernelResult<LaunchConfig> {
    Ok(LaunchConfig {
        grid_dim: (to_u32(op, "rows", rows)?, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// A 2-D grid of `(x, y)` blocks of `threads` threads, without dynamic shared memory.
pub(crate) fn grid_2d(x: u32, y: u32, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (x, y, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}
