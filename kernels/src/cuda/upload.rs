//! Weight upload, and writes into bf16 buffers (the vision tower's pixels), through a page-locked
//! staging buffer: each chunk of f32 host values is rounded to bf16 by all cores straight into
//! pinned memory, then copied to the device from there. A copy from pageable memory goes through
//! the driver's own bounce buffers at a fraction of the bus speed, and rounding a whole tensor into
//! a fresh heap vector first costs a page fault per 4 KiB.

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, PinnedHostSlice};
use half::bf16;
use rayon::prelude::*;

use super::device::driver_err;
use crate::backend::KernelResult;

/// Values per staging chunk (32 MiB of bf16): large enough that a copy runs at full speed, small
/// enough to pin once and keep.
const STAGE_VALUES: usize = 16 << 20;
/// Values each core rounds at a time.
const ROUND_VALUES: usize = 1 << 16;

/// The pinned staging buffer, allocated at the first upload and kept.
#[derive(Default)]
pub(super) struct Staging {
    buf: Mutex<Option<PinnedHostSlice<bf16>>>,
}

impl Staging {
    /// One bf16 device buffer holding the concatenation of `parts`, each value rounded to nearest
    /// even (the same bits as `bf16::from_f32`).
    pub fn upload(
        &self,
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        parts: &[&[f32]],
    ) -> KernelResult<CudaSlice<bf16>> {
        let err = |e| driver_err("upload", e);
        let total: usize = parts.iter().map(|p| p.len()).sum();
        if total == 0 {
            return stream.alloc_zeros::<bf16>(0).map_err(err);
        }
        // SAFETY: `write` fills every value (the parts fill the buffer exactly) before the buffer
        // is handed out.
        let mut dst = unsafe { stream.alloc::<bf16>(total) }.map_err(err)?;
        self.write(ctx, stream, &mut dst, parts)?;
        Ok(dst)
    }

    /// Writes the concatenation of `parts`, rounded to nearest even, into the start of `dst`,
    /// and returns once it is there: the stream is synchronized after each chunk, so anything
    /// queued on it before finishes too.
    pub fn write(
        &self,
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        dst: &mut CudaSlice<bf16>,
        parts: &[&[f32]],
    ) -> KernelResult<()> {
        let err = |e| driver_err("write", e);
        let total: usize = parts.iter().map(|p| p.len()).sum();
        if total == 0 {
            return Ok(());
        }
        debug_assert!(total <= dst.len(), "checked by the callers");
        let mut guard = crate::cuda::lock(&self.buf);
        if guard.is_none() {
            // SAFETY: the buffer is only read after the chunk it holds has been written into it.
            *guard = Some(unsafe { ctx.alloc_pinned::<bf16>(STAGE_VALUES) }.map_err(err)?);
        }
        let stage = guard.as_mut().expect("allocated above");
        let mut at = 0;
        for src in parts.iter().flat_map(|part| part.chunks(STAGE_VALUES)) {
            let host = &mut stage.as_mut_slice().map_err(err)?[..src.len()];
            host.par_chunks_mut(ROUND_VALUES)
                .zip(src.par_chunks(ROUND_VALUES))
                .for_each(|(out, values)| {
                    for (o, &v) in out.iter_mut().zip(values) {
                        *o = bf16::from_f32(v);
                    }
                });
            stream
                .memcpy_htod(&*host, &mut dst.slice_mut(at..at + src.len()))
                .map_err(err)?;
            // From pinned memory the copy runs asynchronously: it must end before the next chunk
            // overwrites the buffer.
            stream.synchronize().map_err(err)?;
            at += src.len();
        }
        Ok(())
    }
}
