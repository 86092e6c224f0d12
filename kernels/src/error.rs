//! Errors a backend call can return.

/// Why a backend op refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// The arguments do not fit together (a buffer too short, a bad `cu_seqlens`, an id out of
    /// range). Names the op.
    #[error("{op}: {detail}")]
    Invalid { op: &'static str, detail: String },
    /// The device or driver failed.
    #[error("backend failure: {0}")]
    Backend(String),
    /// The device can never run again in this process: a sticky CUDA error (an illegal address,
    /// a failed launch, an ECC error, ...) leaves the context unusable. Only a new process helps.
    #[error("device lost: {0}")]
    DeviceLost(String),
}

impl KernelError {
    pub(crate) fn invalid(op: &'static str, detail: impl Into<String>) -> Self {
        Self::Invalid {
            op,
            detail: detail.into(),
        }
    }
}
