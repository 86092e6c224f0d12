//! The backend interface the model is written against, and the CPU reference backend (f32, the
//! oracle every other backend is tested against).

pub mod backend;
pub mod cpu;
pub mod cuda;
pub mod error;
pub mod patches;

pub use backend::{
    AttentionDims, AttentionOutput, Backend, Buffers, Conv1d, ConvWindow, CopyPart, DeltaCarry,
    DeltaDims, DeltaGates, DeltaInputs, DeltaNetInput, DeltaNetScratch, DeltaState, GateOutputs,
    GatedNorm, GemmShape, HeadLayout, KernelResult, L2Heads, PassShape, PrefixKv, Projection,
    QkPrologue, Rope, RowNorm, Store, Strided, Varlen,
};
pub use cpu::CpuBackend;
pub use error::KernelError;
