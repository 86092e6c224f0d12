//! `y = x Wᵀ` (`kernels/cuda/gemm.cu` for the shapes cuBLASLt refuses): cuBLASLt with bf16
//! operands first, the shared-memory tiled kernel otherwise.

use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};
use half::bf16;

use super::super::blas::{Epilogue, GemmInput};
use super::super::buffers::{out_buf, weight, CudaBuf, OutBuf};
use super::super::launch::{to_i32, to_u32, Gpu};
use super::elementwise::round_to_bf16;
use crate::backend::{GemmShape, KernelResult, Store};
use crate::error::KernelError;

/// Tile edge of the naive GEMM (`GEMM_TILE` in gemm.cu).
const GEMM_TILE: u32 = 16;

/// A GEMM's `x`: an f32 activation (rounded to bf16 on the way) or a bf16 GEMM input, of at least
/// `need` values.
fn gemm_input<'a>(op: &'static str, x: &'a CudaBuf, need: usize) -> KernelResult<&'a CudaBuf> {
    if x.len() < need {
        return Err(KernelError::invalid(
            op,
            format!("x holds {} values, needs {need}", x.len()),
        ));
    }
    Ok(x)
}

pub(crate) fn gemm_to(
    gpu: &Gpu,
    (x, w): (&CudaBuf, &CudaBuf),
    shape: GemmShape,
    store: Store,
    y: &mut CudaBuf,
) -> KernelResult<()> {
    const OP: &str = "gemm";
    let (rows, in_dim, out_dim) = (shape.rows, shape.in_dim, shape.out_dim);
    let x = gemm_input(OP, x, shape.x_len())?;
    let w = weight(OP, "w", w, shape.w_len())?;
    let y = out_buf(OP, "y", y, shape.y_len())?;
    if rows == 0 || out_dim == 0 || (in_dim == 0 && store == Store::Add) {
        return Ok(());
    }
    // A bf16 `y` (from alloc_gemm_input) gets cuBLASLt's bf16 output; only f32 has a fallback,
    // and only f32 can be added to.
    let y = match y {
        OutBuf::F32(y) => y,
        OutBuf::Bf16(_) if store == Store::Add => {
            return Err(KernelError::invalid(
                OP,
                "y must be f32 to be added to (bf16 GEMM outputs are replaced only)",
            ));
        }
        OutBuf::Bf16(y) => {
            let how = (store, Epilogue::None);
            if in_dim > 0 && blas_gemm(gpu, x, shape, (w, OutBuf::Bf16(y)), how)? {
                return Ok(());
            }
            return Err(KernelError::invalid(
                OP,
                format!(
                    "cuBLASLt has no bf16-output algorithm for {rows}x{in_dim} -> {out_dim}; \
                     give an f32 y"
                ),
            ));
        }
    };
    let how = (store, Epilogue::None);
    if in_dim > 0 && blas_gemm(gpu, x, shape, (w, OutBuf::F32(&mut *y)), how)? {
        return Ok(());
    }
    tiled_gemm(gpu, (x, w), shape, store, y)
}

/// `y = x Wᵀ` with cuBLASLt's `epilogue` (its bias of `out_dim` values: f32 to an f32 `y`, bf16
/// with the GELU to a bf16 one), replacing `y` or adding to it; `false` (nothing done) where
/// cuBLASLt has no algorithm for it, so the caller runs the GEMM and the epilogue's op apart.
pub(crate) fn gemm_epilogue(
    gpu: &Gpu,
    (x, w, bias): (&CudaBuf, &CudaBuf, &CudaBuf),
    shape: GemmShape,
    (store, gelu): (Store, bool),
    y: &mut CudaBuf,
) -> KernelResult<bool> {
    const OP: &str = "gemm epilogue";
    let x = gemm_input(OP, x, shape.x_len())?;
    let w = weight(OP, "w", w, shape.w_len())?;
    let y = out_buf(OP, "y", y, shape.y_len())?;
    if shape.rows == 0 || shape.out_dim == 0 || shape.in_dim == 0 {
        return Ok(false);
    }
    let out_dim = shape.out_dim;
    let epilogue = match (gelu, bias) {
        (true, CudaBuf::Bf16(b)) if b.len() >= out_dim => {
            Epilogue::GeluBias(b.device_ptr(&gpu.device.stream).0)
        }
        (false, CudaBuf::F32(b)) if b.len() >= out_dim => {
            Epilogue::Bias(b.device_ptr(&gpu.device.stream).0)
        }
        _ => {
            return Err(KernelError::invalid(
                OP,
                format!(
                    "the bias must hold {out_dim} values, bf16 with the GELU, f32 without (got {} {:?})",
                    bias.len(),
                    bias.dtype()
                ),
            ))
        }
    };
    if y.is_bf16() != gelu {
        return Ok(false);
    }
    blas_gemm(gpu, x, shape, (w, y), (store, epilogue))
}

/// A cuBLASLt GEMM (`x` rounded to bf16 on the way if f32); `false` if it has no plan.
fn blas_gemm(
    gpu: &Gpu,
    x: &CudaBuf,
    shape: GemmShape,
    (w, y): (&CudaSlice<bf16>, OutBuf<'_>),
    how: (Store, Epilogue),
) -> KernelResult<bool> {
    let (rows, in_dim, out_dim) = (shape.rows, shape.in_dim, shape.out_dim);
    let output = (w, out_dim, y);
    match x {
        CudaBuf::F32(x) => {
            let convert =
                |x_bf16: &mut CudaSlice<bf16>| round_to_bf16(gpu, x, rows * in_dim, x_bf16);
            gpu.blas
                .gemm(rows, in_dim, output, how, GemmInput::Convert(convert))
        }
        CudaBuf::Bf16(x) => {
            let ready = GemmInput::<fn(&mut CudaSlice<bf16>) -> KernelResult<()>>::Ready(x);
            gpu.blas.gemm(rows, in_dim, output, how, ready)
        }
    }
}

/// The shared-memory tiled GEMM (an f32 `x` is used unrounded): for shapes cuBLASLt refuses.
fn tiled_gemm(
    gpu: &Gpu,
    (x, w): (&CudaBuf, &CudaSlice<bf16>),
    shape: GemmShape,
    store: Store,
    y: &mut CudaSlice<f32>,
) -> KernelResult<()> {
    const OP: &str = "gemm";
    let (rows, in_dim, out_dim) = (shape.rows, shape.in_dim, shape.out_dim);
    let add = i32::from(store == Store::Add);
    let rows_a = to_i32(OP, "rows", rows)?;
    let in_a = to_i32(OP, "in_dim", in_dim)?;
    let out_a = to_i32(OP, "out_dim", out_dim)?;
    let cfg = LaunchConfig {
        grid_dim: (
            to_u32(OP, "grid", out_dim.div_ceil(GEMM_TILE as usize))?,
            to_u32(OP, "grid", rows.div_ceil(GEMM_TILE as usize))?,
            1,
        ),
        block_dim: (GEMM_TILE, GEMM_TILE, 1),
        shared_mem_bytes: 0,
    };
    if cfg.grid_dim.1 > 65_535 {
        return Err(KernelError::invalid(OP, format!("{rows} rows is too many")));
    }
    let kernel = match x {
        CudaBuf::F32(_) => "gemm_xwt",
        CudaBuf::Bf16(_) => "gemm_xwt_bf16x",
    };
    // SAFETY: argument types match the kernel; lengths checked above.
    unsafe {
        gpu.launch(OP, kernel, cfg, |launch| {
            match x {
                CudaBuf::F32(x) => launch.arg(x),
                CudaBuf::Bf16(x) => launch.arg(x),
            };
            launch
                .arg(w)
                .arg(y)
                .arg(&rows_a)
                .arg(&in_a)
                .arg(&out_a)
                .arg(&add);
        })
    }
}
