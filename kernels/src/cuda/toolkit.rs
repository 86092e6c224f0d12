//! Finding the CUDA toolkit files NVRTC needs at run time: the headers the kernels include
//! (`cuda_bf16.h`, ...) and, optionally, the directory holding `libnvrtc`.
//!
//! A toolkit root is either an installed toolkit (`/usr/local/cuda`: `include/`, `lib64/`) or the
//! directory `tools/fetch-cuda-headers.sh` fills from NVIDIA's PyPI wheels (`include/`, `lib/`).

use std::path::{Path, PathBuf};

use super::libs::{preload, CudaLibrary};
use crate::backend::KernelResult;
use crate::error::KernelError;

/// Environment variables naming a toolkit root, most specific first.
pub const TOOLKIT_ENV_VARS: [&str; 3] = ["INSTINCT_CUDA_HOME", "CUDA_HOME", "CUDA_PATH"];
/// Where a toolkit is installed when no variable names one.
pub const DEFAULT_TOOLKIT_ROOT: &str = "/usr/local/cuda";

/// A CUDA toolkit (or header + NVRTC subset of one) on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaToolkit {
    root: PathBuf,
    include_dir: PathBuf,
    lib_dir: Option<PathBuf>,
}

impl CudaToolkit {
    /// The toolkit at `root`; fails unless it holds `cuda_bf16.h`.
    pub fn at(root: impl Into<PathBuf>) -> KernelResult<Self> {
        let root = root.into();
        let include_dir = ["include", "targets/x86_64-linux/include"]
            .iter()
            .map(|sub| root.join(sub))
            .find(|dir| dir.join("cuda_bf16.h").is_file())
            .ok_or_else(|| {
                KernelError::Backend(format!(
                    "no CUDA headers (include/cuda_bf16.h) under {}",
                    root.display()
                ))
            })?;
        let lib_dir = ["lib64", "lib", "targets/x86_64-linux/lib"]
            .iter()
            .map(|sub| root.join(sub))
            .find(|dir| dir.join(CudaLibrary::Nvrtc.file_name()).is_file());
        Ok(Self {
            root,
            include_dir,
            lib_dir,
        })
    }

    /// The first toolkit named by [`TOOLKIT_ENV_VARS`], else [`DEFAULT_TOOLKIT_ROOT`]. A variable
    /// that is set must name a usable toolkit: a typo is an error, not a silent fallback.
    pub fn locate() -> KernelResult<Self> {
        for var in TOOLKIT_ENV_VARS {
            if let Some(root) = std::env::var_os(var).filter(|v| !v.is_empty()) {
                return Self::at(PathBuf::from(root)).map_err(|e| {
                    KernelError::Backend(format!("{var} does not name a CUDA toolkit: {e}"))
                });
            }
        }
        Self::at(DEFAULT_TOOLKIT_ROOT).map_err(|e| {
            KernelError::Backend(format!(
                "{e}; set INSTINCT_CUDA_HOME or CUDA_HOME to the CUDA 13 toolkit"
            ))
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory passed to NVRTC as an include path.
    pub fn include_dir(&self) -> &Path {
        &self.include_dir
    }

    /// The directory holding `libnvrtc.so.13`, if this toolkit has one.
    pub fn lib_dir(&self) -> Option<&Path> {
        self.lib_dir.as_deref()
    }

    /// Loads this toolkit's `libnvrtc` and its builtins library (if it has them) so NVRTC calls
    /// use them, then checks that NVRTC can be opened at all (from here or the loader's paths).
    pub fn load_nvrtc(&self) -> KernelResult<()> {
        if let Some(dir) = &self.lib_dir {
            // libnvrtc opens `libnvrtc-builtins.so.<major>.<minor>` by bare name when it first
            // compiles: load it first (the `.alt` variant is a different build, left alone).
            let entries = std::fs::read_dir(dir)
                .map_err(|e| KernelError::Backend(format!("cannot list {}: {e}", dir.display())))?;
            for entry in entries.flatten() {
                let name = entry.file_name();
                let name = name.to_string_lossy();
                if name.starts_with("libnvrtc-builtins.so.") {
                    preload(&entry.path())?;
                }
            }
            preload(&dir.join(CudaLibrary::Nvrtc.file_name()))?;
        }
        CudaLibrary::Nvrtc.require()
    }

    /// Loads this toolkit's `libcublasLt` (and the `libcublas` it links against) if it has them,
    /// then checks that cuBLASLt can be opened at all (from here or the loader's paths).
    pub fn load_cublaslt(&self) -> KernelResult<()> {
        if let Some(dir) = &self.lib_dir {
            for name in ["libcublas.so.13", CudaLibrary::CublasLt.file_name()] {
                let path = dir.join(name);
                if path.exists() {
                    preload(&path)?;
                }
            }
        }
        CudaLibrary::CublasLt.require()
    }
}
