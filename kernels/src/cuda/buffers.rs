//! Device buffers of the CUDA backend: f32 activations and bf16 weights behind one `Buf` type.

use cudarc::driver::{CudaSlice, LaunchArgs, PushKernelArg};
use half::bf16;

use crate::backend::KernelResult;
use crate::error::KernelError;

/// Element type of a [`CudaBuf`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    Bf16,
}

/// A device buffer. [`crate::Backend::alloc`] gives f32 (activations, states);
/// [`crate::Backend::upload`] gives bf16 (weights: the model uploads exactly its weights with it);
/// [`crate::Backend::alloc_gemm_input`] gives bf16 too (a norm's output that only GEMMs read).
/// Ops check that every argument has the type its kernel reads.
#[derive(Debug)]
pub enum CudaBuf {
    F32(CudaSlice<f32>),
    Bf16(CudaSlice<bf16>),
}

impl CudaBuf {
    /// The GPU it was allocated on.
    pub fn ordinal(&self) -> usize {
        match self {
            Self::F32(s) => s.ordinal(),
            Self::Bf16(s) => s.ordinal(),
        }
    }

    pub fn dtype(&self) -> DType {
        match self {
            Self::F32(_) => DType::F32,
            Self::Bf16(_) => DType::Bf16,
        }
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            Self::F32(s) => s.len(),
            Self::Bf16(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn too_short(op: &'static str, what: &str, len: usize, need: usize) -> KernelError {
    KernelError::invalid(op, format!("{what} holds {len} values, needs {need}"))
}

/// Refuses a copy of `len` values from `src_at` of a source holding `src_len` into `dst_at` of a
/// destination holding `dst_len` that would run past either.
pub(crate) fn check_copy(
    op: &'static str,
    (src_len, src_at): (usize, usize),
    (dst_len, dst_at): (usize, usize),
    len: usize,
) -> KernelResult<()> {
    for (what, held, need) in [
        ("source", src_len, src_at + len),
        ("destination", dst_len, dst_at + len),
    ] {
        if held < need {
            return Err(too_short(op, what, held, need));
        }
    }
    Ok(())
}

fn wrong_type(op: &'static str, what: &str, want: DType, got: DType) -> KernelError {
    KernelError::invalid(
        op,
        format!(
            "{what} must be {want:?} (f32 buffers come from alloc, bf16 weights from upload), \
             got {got:?}"
        ),
    )
}

/// `buf` as an f32 activation of at least `need` values.
pub(crate) fn act<'a>(
    op: &'static str,
    what: &str,
    buf: &'a CudaBuf,
    need: usize,
) -> KernelResult<&'a CudaSlice<f32>> {
    match buf {
        CudaBuf::F32(s) if s.len() >= need => Ok(s),
        CudaBuf::F32(s) => Err(too_short(op, what, s.len(), need)),
        other => Err(wrong_type(op, what, DType::F32, other.dtype())),
    }
}

/// `buf` as a writable f32 activation of at least `need` values.
pub(crate) fn act_mut<'a>(
    op: &'static str,
    what: &str,
    buf: &'a mut CudaBuf,
    need: usize,
) -> KernelResult<&'a mut CudaSlice<f32>> {
    let (dtype, len) = (buf.dtype(), buf.len());
    match buf {
        CudaBuf::F32(s) if len >= need => Ok(s),
        CudaBuf::F32(_) => Err(too_short(op, what, len, need)),
        CudaBuf::Bf16(_) => Err(wrong_type(op, what, DType::F32, dtype)),
    }
}

/// A writable activation of either type: f32, or bf16 (from `alloc_gemm_input`) where only GEMMs
/// read it (a norm's output) or only SwiGLU does (a GEMM's gate|up output).
pub(crate) enum OutBuf<'a> {
    F32(&'a mut CudaSlice<f32>),
    Bf16(&'a mut CudaSlice<bf16>),
}

impl OutBuf<'_> {
    pub fn is_bf16(&self) -> bool {
        matches!(self, Self::Bf16(_))
    }

    /// Pushes the slice as the launch's next argument.
    pub fn push<'b>(&'b mut self, launch: &mut LaunchArgs<'b>) {
        match self {
            Self::F32(s) => launch.arg(&mut **s),
            Self::Bf16(s) => launch.arg(&mut **s),
        };
    }
}

/// `buf` as a writable activation of either type of at least `need` values.
pub(crate) fn out_buf<'a>(
    op: &'static str,
    what: &str,
    buf: &'a mut CudaBuf,
    need: usize,
) -> KernelResult<OutBuf<'a>> {
    let len = buf.len();
    if len < need {
        return Err(too_short(op, what, len, need));
    }
    Ok(match buf {
        CudaBuf::F32(s) => OutBuf::F32(s),
        CudaBuf::Bf16(s) => OutBuf::Bf16(s),
    })
}

/// A read-only activation of either type (for ops with one kernel entry point per input type).
#[derive(Clone, Copy)]
pub(crate) enum InBuf<'a> {
    F32(&'a CudaSlice<f32>),
    Bf16(&'a CudaSlice<bf16>),
}

impl<'a> InBuf<'a> {
    pub fn is_bf16(&self) -> bool {
        matches!(self, Self::Bf16(_))
    }

    /// Pushes the slice as the launch's next argument.
    pub fn push(&self, launch: &mut LaunchArgs<'a>) {
        match self {
            Self::F32(s) => launch.arg(*s),
            Self::Bf16(s) => launch.arg(*s),
        };
    }
}

/// `buf` as a read-only activation of either type of at least `need` values.
pub(crate) fn in_buf<'a>(
    op: &'static str,
    what: &str,
    buf: &'a CudaBuf,
    need: usize,
) -> KernelResult<InBuf<'a>> {
    if buf.len() < need {
        return Err(too_short(op, what, buf.len(), need));
    }
    Ok(match buf {
        CudaBuf::F32(s) => InBuf::F32(s),
        CudaBuf::Bf16(s) => InBuf::Bf16(s),
    })
}

/// `buf` as a bf16 weight of at least `need` values.
pub(crate) fn weight<'a>(
    op: &'static str,
    what: &str,
    buf: &'a CudaBuf,
    need: usize,
) -> KernelResult<&'a CudaSlice<bf16>> {
    match buf {
        CudaBuf::Bf16(s) if s.len() >= need => Ok(s),
        CudaBuf::Bf16(s) => Err(too_short(op, what, s.len(), need)),
        other => Err(wrong_type(op, what, DType::Bf16, other.dtype())),
    }
}

/// An index buffer of at least `need` values.
pub(crate) fn idx<'a>(
    op: &'static str,
    what: &str,
    buf: &'a CudaSlice<u32>,
    need: usize,
) -> KernelResult<&'a CudaSlice<u32>> {
    if buf.len() < need {
        return Err(too_short(op, what, buf.len(), need));
    }
    Ok(buf)
}
