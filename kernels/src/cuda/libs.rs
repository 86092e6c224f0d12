//! The CUDA shared libraries cudarc opens at run time, checked before first use so a missing one is
//! a clear error (cudarc itself panics on the first call into a library it cannot open).

use std::path::Path;

use crate::backend::KernelResult;
use crate::error::KernelError;

/// A CUDA library the backend loads dynamically.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CudaLibrary {
    /// The driver API (`libcuda`), installed with the GPU driver.
    Driver,
    /// The runtime compiler (`libnvrtc`), part of the CUDA toolkit.
    Nvrtc,
    /// cuBLASLt (`libcublasLt`), part of the CUDA toolkit.
    CublasLt,
}

impl CudaLibrary {
    /// The file name cudarc (built for CUDA 13) looks for first among its candidates.
    pub fn file_name(self) -> &'static str {
        match self {
            Self::Driver => "libcuda.so.1",
            Self::Nvrtc => "libnvrtc.so.13",
            Self::CublasLt => "libcublasLt.so.13",
        }
    }

    /// Whether cudarc can open this library (searching the dynamic loader's paths, or finding a copy
    /// already loaded by [`preload`]).
    pub fn is_present(self) -> bool {
        // SAFETY: these only try to open the library (dlopen); they call nothing in it.
        unsafe {
            match self {
                Self::Driver => cudarc::driver::sys::is_culib_present(),
                Self::Nvrtc => cudarc::nvrtc::sys::is_culib_present(),
                Self::CublasLt => cudarc::cublaslt::sys::is_culib_present(),
            }
        }
    }

    /// Fails with an error naming the library unless it can be opened.
    pub fn require(self) -> KernelResult<()> {
        if self.is_present() {
            return Ok(());
        }
        let hint = match self {
            Self::Driver => "is the NVIDIA driver installed and the GPU visible?",
            Self::Nvrtc | Self::CublasLt => {
                "install the CUDA 13 toolkit and point CUDA_HOME (or INSTINCT_CUDA_HOME) at it, \
                 or add its library directory to LD_LIBRARY_PATH"
            }
        };
        Err(KernelError::Backend(format!(
            "CUDA library {} not found: {hint}",
            self.file_name()
        )))
    }
}

/// Loads the shared library at `path` and keeps it loaded for the life of the process, so a later
/// lookup by bare name (cudarc's, or NVRTC's own for its builtins) finds it: the dynamic loader
/// matches an already-loaded library by its soname. This avoids depending on `LD_LIBRARY_PATH`.
pub fn preload(path: &Path) -> KernelResult<()> {
    // SAFETY: loading a CUDA library runs only its initialisers, which have no preconditions.
    let lib = unsafe { libloading::Library::new(path) }
        .map_err(|e| KernelError::Backend(format!("cannot load {}: {e}", path.display())))?;
    // Never unloaded: cudarc keeps function pointers into it for the life of the process.
    std::mem::forget(lib);
    Ok(())
}
