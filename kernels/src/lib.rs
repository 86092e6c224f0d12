//! The backend interface the model is written against, and the CPU reference backend (f32, the
//! oracle every other backend is tested against).

pub mod backend;
pub mod cpu;
pub mod cuda;
pub mod error;

pub use backend::{
    AttentionDims, Backend, Buffers, DeltaDims, DeltaGates, DeltaState, HeadLayout, KernelResult,
    Rope, Store, Strided, Varlen,
};
pub use cpu::CpuBackend;
pub use error::KernelError;
