//! Device scratch owned by the backend that grows to the largest batch seen and never shrinks (the
//! start-up warm-up runs the largest, so serving never allocates), its bytes counted with the
//! activation buffers.

use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, MutexGuard};

use super::backend::CudaBackend;
use crate::backend::KernelResult;
use crate::error::KernelError;

/// A scratch kind: the buffers of one op.
pub(super) trait Scratch {
    /// What the op needs it to hold, in the scratch's own unit (rows, pairs ...).
    type Need: Copy;
    /// Whether it holds `need`.
    fn holds(&self, need: Self::Need) -> bool;
    /// Device bytes it holds.
    fn bytes(&self) -> u64;
}

/// The backend's slot for one scratch kind.
pub(super) struct GrownScratch<T>(Mutex<Option<T>>);

impl<T> Default for GrownScratch<T> {
    fn default() -> Self {
        Self(Mutex::new(None))
    }
}

/// The locked scratch, holding at least what was asked.
pub(super) struct ScratchGuard<'a, T>(MutexGuard<'a, Option<T>>);

impl<T> Deref for ScratchGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.0.as_ref().expect("filled by GrownScratch::get")
    }
}

impl<T> DerefMut for ScratchGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.0.as_mut().expect("filled by GrownScratch::get")
    }
}

impl<T: Scratch> GrownScratch<T> {
    /// The scratch, first replaced by `make(need)` when it does not hold `need` (the old one is
    /// freed first, so the two never coexist on the device).
    pub(super) fn get(
        &self,
        backend: &CudaBackend,
        op: &'static str,
        need: T::Need,
        make: impl FnOnce(T::Need) -> KernelResult<T>,
    ) -> KernelResult<ScratchGuard<'_, T>> {
        let mut slot = self
            .0
            .lock()
            .map_err(|_| KernelError::invalid(op, "scratch poisoned by an earlier panic"))?;
        if !slot.as_ref().is_some_and(|s| s.holds(need)) {
            if let Some(old) = slot.take() {
                backend.release_buffer_bytes(old.bytes());
            }
            let fresh = make(need)?;
            backend.add_buffer_bytes(fresh.bytes());
            *slot = Some(fresh);
        }
        Ok(ScratchGuard(slot))
    }
}
