//! The CUDA backend: kernels written in CUDA C++ (`kernels/cuda/*.cu`), embedded in the binary,
//! compiled by NVRTC at start-up for the GPU's architecture and cached on disk.
//!
//! Everything CUDA is loaded at run time (cudarc with dynamic loading), so this module builds and
//! its compile-only parts ([`Compiler`], [`KERNEL_SOURCES`]) run on a machine without a GPU or a
//! driver. Weights live on the device in bf16, activations in f32 (see [`CudaBuf`]).

mod backend;
mod blas;
mod buffers;
mod cache;
mod compile;
mod device;
mod graphs;
mod launch;
mod libs;
mod ops;
mod sources;
mod toolkit;
mod tuning;
mod upload;
mod workspace;

pub use backend::{CudaBackend, MemoryProbe};
pub use buffers::{CudaBuf, DType};
pub use cache::{CacheKey, KernelCache};
pub use compile::{CompiledKernel, Compiler, GpuArch};
pub use device::{gpu_count, CudaOptions};
pub use graphs::{GraphProbe, GraphStats};
pub use libs::{preload, CudaLibrary};
pub use sources::{KernelSource, KERNEL_SOURCES};
pub use toolkit::{CudaToolkit, DEFAULT_TOOLKIT_ROOT, TOOLKIT_ENV_VARS};
pub use workspace::DELTA_CHUNK as DELTA_CHUNK_TOKENS;

/// Locks `m`, going on past the panic of an earlier holder: an engine survives a panicked batch
/// (it answers that batch's requests 500 and takes the next), and nothing these locks guard (GEMM
/// plans and picks, scratch buffers, graphs, the staging buffer) is left wrong by a call cut
/// short: a buffer's contents are rewritten by its next user, a map entry is whole or absent.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    /// A lock whose holder panicked still opens, with what the holder left.
    #[test]
    fn a_lock_outlives_a_panicked_holder() {
        let m = Arc::new(Mutex::new(1));
        let held = Arc::clone(&m);
        let panicked = std::thread::spawn(move || {
            let mut guard = held.lock().unwrap();
            *guard = 2;
            panic!("a batch panics while holding the lock");
        })
        .join();
        assert!(panicked.is_err());
        assert!(m.is_poisoned());
        assert_eq!(*super::lock(&m), 2);
    }
}
