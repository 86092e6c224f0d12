//! Device memory the backend owns beyond the caller's buffers: the scratch the ops share (grown to
//! the largest batch seen, never shrunk: the start-up warm-up runs the largest, so serving never
//! allocates) and the count of every activation byte, scratch included.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;

use super::device::driver_err;
use super::graphs::CaptureGuard;
use crate::backend::KernelResult;

/// Tokens per chunk of the chunked delta rule (`DC_CHUNK` in delta_chunked.cu). A sequence resumed
/// from a prefix state at a multiple of it runs the whole prompt's chunks.
pub const DELTA_CHUNK: usize = 64;
/// Key and value heads of the chunked delta rule are zero-padded to this width (`DC_DK`).
pub(crate) const DELTA_MAX_HEAD: usize = 128;

/// The scratch of every op that keeps one, and the activation bytes allocated so far.
#[derive(Default)]
pub(crate) struct Workspace {
    /// Bytes of activation and index buffers and of the scratch below (for metrics).
    buffer_bytes: AtomicU64,
    /// Flash attention's bf16 copies of Q, K and V, and its split rows.
    pub flash: GrownScratch<FlashScratch>,
    /// The chunked delta rule's scratch between its two kernels.
    pub delta: GrownScratch<DeltaScratch>,
    /// Refuses what a pass being captured cannot hold, and counts scratch replacements (which
    /// make captured passes stale); shared with cuBLASLt's scratch.
    pub capture: Arc<CaptureGuard>,
}

impl Workspace {
    pub fn add_bytes(&self, bytes: u64) {
        self.buffer_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    fn release_bytes(&self, bytes: u64) {
        self.buffer_bytes.fetch_sub(bytes, Ordering::Relaxed);
    }

    pub fn bytes(&self) -> u64 {
        self.buffer_bytes.load(Ordering::Relaxed)
    }
}

/// A scratch kind: the buffers of one op.
pub(crate) trait Scratch {
    /// What the op needs it to hold, in the scratch's own unit (rows, pairs ...).
    type Need: Copy;
    /// Whether it holds `need`.
    fn holds(&self, need: Self::Need) -> bool;
    /// What a replacement must hold: `need` and all this one holds (so a scratch only grows, and
    /// passes that need more of one part and less of another do not replace it back and forth:
    /// each replacement makes the captured passes stale).
    fn covering(&self, need: Self::Need) -> Self::Need;
    /// Device bytes it holds.
    fn bytes(&self) -> u64;
}

/// The workspace's slot for one scratch kind.
pub(crate) struct GrownScratch<T>(Mutex<Option<T>>);

impl<T> Default for GrownScratch<T> {
    fn default() -> Self {
        Self(Mutex::new(None))
    }
}

/// The locked scratch, holding at least what was asked.
pub(crate) struct ScratchGuard<'a, T>(MutexGuard<'a, Option<T>>);

impl<T> ScratchGuard<'_, T> {
    /// The scratch, for as long as the lock is held.
    pub(crate) fn scratch(&mut self) -> &mut T {
        self.0.as_mut().expect("filled by GrownScratch::get")
    }
}

impl<T: Scratch> GrownScratch<T> {
    /// The scratch, first replaced by `make(need)` when it does not hold `need` (the old one is
    /// freed first, so the two never coexist on the device); `counter` keeps the byte count.
    pub(crate) fn get(
        &self,
        counter: &Workspace,
        op: &'static str,
        need: T::Need,
        make: impl FnOnce(T::Need) -> KernelResult<T>,
    ) -> KernelResult<ScratchGuard<'_, T>> {
        let mut slot = super::lock(&self.0);
        if !slot.as_ref().is_some_and(|s| s.holds(need)) {
            counter.capture.replace(op)?;
            let need = slot.as_ref().map_or(need, |s| s.covering(need));
            if let Some(old) = slot.take() {
                counter.release_bytes(old.bytes());
            }
            let fresh = make(need)?;
            counter.add_bytes(fresh.bytes());
            *slot = Some(fresh);
        }
        Ok(ScratchGuard(slot))
    }
}

/// bf16 Q `[rows][q_heads][d]` and K, V `[rows][kv_heads][d]` (head size padded to the kernel's
/// `d` with zeros), grown to the largest batch seen (the start-up warm-up runs the largest), never
/// shrunk.
/// Also the split last-row kernel's partial rows (`[num_seqs][q_heads][splits][d + 2]` f32).
pub(crate) struct FlashScratch {
    pub q: CudaSlice<bf16>,
    pub k: CudaSlice<bf16>,
    pub v: CudaSlice<bf16>,
    pub partial: CudaSlice<f32>,
}

impl Scratch for FlashScratch {
    /// Values of Q, of K (or V), and of the partial rows.
    type Need = (usize, usize, usize);

    fn holds(&self, (q_len, kv_len, partial_len): Self::Need) -> bool {
        self.q.len() >= q_len && self.k.len() >= kv_len && self.partial.len() >= partial_len
    }

    fn covering(&self, (q_len, kv_len, partial_len): Self::Need) -> Self::Need {
        (
            q_len.max(self.q.len()),
            kv_len.max(self.k.len()),
            partial_len.max(self.partial.len()),
        )
    }

    fn bytes(&self) -> u64 {
        2 * (self.q.len() + self.k.len() + self.v.len()) as u64 + 4 * self.partial.len() as u64
    }
}

/// Per-token scratch between the two kernels of the chunked delta rule, `[rows][v_heads][..]`: W,
/// e^γ·scale·q and e^{γ_last−γ}·k in bf16 (128 per head), U in f32 (128), a row of P in bf16 (64),
/// γ in f32.
/// Grown to the largest batch seen (the start-up warm-up runs the largest), never shrunk.
pub(crate) struct DeltaScratch {
    /// Capacity in (row, value head) pairs.
    pairs: usize,
    pub w: CudaSlice<bf16>,
    pub u: CudaSlice<f32>,
    pub q: CudaSlice<bf16>,
    pub k: CudaSlice<bf16>,
    pub p: CudaSlice<bf16>,
    pub gam: CudaSlice<f32>,
}

impl Scratch for DeltaScratch {
    /// (row, value head) pairs.
    type Need = usize;

    fn holds(&self, pairs: usize) -> bool {
        self.pairs >= pairs
    }

    fn covering(&self, pairs: usize) -> usize {
        pairs.max(self.pairs)
    }

    fn bytes(&self) -> u64 {
        (self.pairs * Self::BYTES_PER_PAIR) as u64
    }
}

impl DeltaScratch {
    /// Device bytes per (row, value head) pair.
    const BYTES_PER_PAIR: usize = 3 * 2 * DELTA_MAX_HEAD + 4 * DELTA_MAX_HEAD + 2 * DELTA_CHUNK + 4;

    /// Zeroed buffers for `pairs` pairs.
    pub fn new(stream: &Arc<CudaStream>, pairs: usize) -> KernelResult<Self> {
        const OP: &str = "gated_delta_rule_chunked scratch";
        let bf = |n: usize| stream.alloc_zeros::<bf16>(n).map_err(|e| driver_err(OP, e));
        let f = |n: usize| stream.alloc_zeros::<f32>(n).map_err(|e| driver_err(OP, e));
        Ok(Self {
            pairs,
            w: bf(pairs * DELTA_MAX_HEAD)?,
            u: f(pairs * DELTA_MAX_HEAD)?,
            q: bf(pairs * DELTA_MAX_HEAD)?,
            k: bf(pairs * DELTA_MAX_HEAD)?,
            p: bf(pairs * DELTA_CHUNK)?,
            gam: f(pairs)?,
        })
    }
}
