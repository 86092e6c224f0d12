//! The CUDA ops, one file per kernel file of `kernels/cuda/` (`norms.rs` launches `norms.cu` ...).
//! Each op checks its arguments, picks its kernel and states the grid and the arguments; the launch
//! itself is [`Gpu::launch`](super::launch::Gpu::launch). The ops borrow the [`Gpu`](super::launch::Gpu) context and
//! never the backend: routing between a fused kernel and its parts lives in the backend facade.

pub(crate) mod attention;
pub(crate) mod conv;
pub(crate) mod delta;
pub(crate) mod delta_chunked;
pub(crate) mod elementwise;
pub(crate) mod flash_attention;
pub(crate) mod gemm;
pub(crate) mod norms;
pub(crate) mod rope;
mod shared;
pub(crate) mod vision;
