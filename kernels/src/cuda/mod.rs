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
