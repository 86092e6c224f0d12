//! Weight upload, and writes into bf16 buffers (the vision tower's pixels), through a page-locked
//! staging buffer: each chunk of f32 host values is rounded to bf16 by all cores straight into
//! pinned memory, then copied to the device from there. A copy from pageable memory goes through
//! the driver's own bounce buffers at a fraction of the bus speed, and rounding a whole tensor into
//! a fresh heap vector first costs a page fault per 4 KiB. Each pass's indices go up through
//! pinned memory too ([`IndexStaging`]), without waiting.

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, PinnedHostSlice};
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

/// Values each half of [`IndexStaging`] holds at first (256 KiB: a batch of ~20k rows' ids,
/// positions and offsets).
const INDEX_HALF_VALUES: usize = 1 << 16;

/// One half of [`IndexStaging`]: pinned memory, how much of it is written, and the event that
/// marks the end of its last copy (recorded when the writes move to the other half).
#[derive(Default)]
struct IndexHalf {
    host: Option<PinnedHostSlice<u32>>,
    used: usize,
    copied: Option<CudaEvent>,
}

/// Double-buffered pinned staging of the per-pass index uploads (token ids, positions, sequence
/// offsets): each write copies its values into the current half of page-locked memory and queues
/// an asynchronous copy from there, so the host never waits on the bus or the driver's bounce
/// buffers, and the values may be dropped at once. Writes fill one half after the other; a half
/// is rewritten only after the event recorded when the writes left it, i.e. after every copy
/// from it has run: the host goes on preparing the next pass while the current one's copies
/// and kernels run.
#[derive(Default)]
pub(super) struct IndexStaging {
    halves: Mutex<([IndexHalf; 2], usize)>,
}

impl IndexStaging {
    /// Queues the copy of `data` into the start of `dst` on `stream`; returns once queued.
    pub fn write(
        &self,
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        dst: &mut CudaSlice<u32>,
        data: &[u32],
    ) -> KernelResult<()> {
        let err = |e| driver_err("write_idx", e);
        let n = data.len();
        debug_assert!(n <= dst.len(), "checked by the callers");
        if n == 0 {
            return Ok(());
        }
        let mut guard = crate::cuda::lock(&self.halves);
        let (halves, current) = &mut *guard;
        let room = |h: &IndexHalf| h.host.as_ref().map_or(0, |p| p.len()) - h.used;
        if room(&halves[*current]) < n {
            // Leave this half: its event marks the end of every copy queued from it.
            let left = &mut halves[*current];
            if left.used > 0 {
                match &left.copied {
                    Some(event) => event.record(stream).map_err(err)?,
                    None => left.copied = Some(stream.record_event(None).map_err(err)?),
                }
            }
            *current ^= 1;
            let next = &mut halves[*current];
            if let Some(event) = &next.copied {
                event.synchronize().map_err(err)?;
            }
            next.used = 0;
            if room(next) < n {
                next.host = None;
                let len = n.next_power_of_two().max(INDEX_HALF_VALUES);
                // SAFETY: only values written below are ever copied from the buffer.
                next.host = Some(unsafe { ctx.alloc_pinned::<u32>(len) }.map_err(err)?);
            }
        }
        let half = &mut halves[*current];
        let at = half.used;
        let host = &mut half
            .host
            .as_mut()
            .expect("room checked above")
            .as_mut_slice()
            .map_err(err)?[at..at + n];
        host.copy_from_slice(data);
        // From a plain slice of pinned memory the copy is asynchronous.
        stream
            .memcpy_htod(&*host, &mut dst.slice_mut(..n))
            .map_err(err)?;
        half.used += n;
        Ok(())
    }
}
