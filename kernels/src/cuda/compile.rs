//! Compiling the embedded kernels with NVRTC into a CUBIN for one GPU architecture.

use std::ffi::{c_char, CString};

use cudarc::nvrtc::{result as nvrtc, sys};

use super::sources::KernelSource;
use super::toolkit::CudaToolkit;
use crate::backend::KernelResult;
use crate::error::KernelError;

/// A GPU architecture, by compute capability.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GpuArch {
    pub major: u32,
    pub minor: u32,
}

impl GpuArch {
    /// Hopper (H100, H200).
    pub const SM_90: Self = Self::new(9, 0);
    /// Ampere (A100).
    pub const SM_80: Self = Self::new(8, 0);

    pub const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }

    /// The NVRTC target: the real architecture (so NVRTC emits a CUBIN, not only PTX), with the
    /// `a` suffix from Hopper on, which unlocks the architecture-specific instructions (`wgmma`,
    /// `setmaxnreg`) at the price of running on that exact architecture only.
    pub fn nvrtc_target(&self) -> String {
        let suffix = if self.major >= 9 { "a" } else { "" };
        format!("sm_{}{}{suffix}", self.major, self.minor)
    }
}

/// A compiled kernel file.
#[derive(Clone, Debug)]
pub struct CompiledKernel {
    pub cubin: Vec<u8>,
    /// NVRTC's log (warnings); empty when it had nothing to say.
    pub log: String,
}

/// NVRTC with the include path of a CUDA toolkit.
#[derive(Clone, Debug)]
pub struct Compiler {
    include_dir: String,
    version: (i32, i32),
}

impl Compiler {
    /// Loads NVRTC (from the toolkit if it has one, else from the loader's paths) and reads its
    /// version.
    pub fn new(toolkit: &CudaToolkit) -> KernelResult<Self> {
        toolkit.load_nvrtc()?;
        let include_dir = toolkit
            .include_dir()
            .to_str()
            .ok_or_else(|| {
                KernelError::Backend(format!(
                    "CUDA include path is not UTF-8: {}",
                    toolkit.include_dir().display()
                ))
            })?
            .to_string();
        let (mut major, mut minor) = (0, 0);
        // SAFETY: NVRTC is loaded (checked above); the pointers are to live locals.
        unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
            .result()
            .map_err(|e| KernelError::Backend(format!("nvrtcVersion: {e}")))?;
        Ok(Self {
            include_dir,
            version: (major, minor),
        })
    }

    /// NVRTC's (major, minor) version.
    pub fn version(&self) -> (i32, i32) {
        self.version
    }

    /// The NVRTC options for `arch` (part of the cache key).
    pub fn options(&self, arch: GpuArch) -> Vec<String> {
        vec![
            format!("--gpu-architecture={}", arch.nvrtc_target()),
            "--std=c++17".to_string(),
            format!("--include-path={}", self.include_dir),
            // Line info costs nothing at run time and lets profilers map SASS back to source.
            "--generate-line-info".to_string(),
        ]
    }

    /// Compiles `source` for `arch`. A compile error carries NVRTC's log.
    pub fn compile(&self, source: &KernelSource, arch: GpuArch) -> KernelResult<CompiledKernel> {
        let fail = |what: &str, detail: String| {
            KernelError::Backend(format!("NVRTC {what} of {}: {detail}", source.file))
        };
        let code = CString::new(source.full_source())
            .map_err(|_| fail("setup", "source contains a NUL byte".into()))?;
        let name = CString::new(source.file).map_err(|_| fail("setup", "bad file name".into()))?;
        let program =
            nvrtc::create_program(&code, Some(&name)).map_err(|e| fail("setup", e.to_string()))?;
        // SAFETY: `program` was created above and is destroyed exactly once, below.
        let result = unsafe { self.compile_program(program, arch) };
        // SAFETY: as above; `code` and `name` outlive the program.
        let destroyed = unsafe { nvrtc::destroy_program(program) };
        let compiled = result.map_err(|detail| fail("compilation", detail))?;
        destroyed.map_err(|e| fail("cleanup", e.to_string()))?;
        Ok(compiled)
    }

    /// # Safety
    /// `program` must be a live NVRTC program.
    unsafe fn compile_program(
        &self,
        program: sys::nvrtcProgram,
        arch: GpuArch,
    ) -> Result<CompiledKernel, String> {
        let status = nvrtc::compile_program(program, &self.options(arch));
        let log = nvrtc::get_program_log(program)
            .map(|raw| c_chars_to_string(&raw))
            .unwrap_or_default();
        if let Err(e) = status {
            return Err(format!("{e}\n{log}"));
        }
        let mut size = 0usize;
        sys::nvrtcGetCUBINSize(program, &mut size)
            .result()
            .map_err(|e| format!("nvrtcGetCUBINSize: {e}"))?;
        let mut cubin = vec![0u8; size];
        sys::nvrtcGetCUBIN(program, cubin.as_mut_ptr().cast::<c_char>())
            .result()
            .map_err(|e| format!("nvrtcGetCUBIN: {e}"))?;
        Ok(CompiledKernel { cubin, log })
    }
}

/// NVRTC's NUL-terminated log as a trimmed string.
fn c_chars_to_string(raw: &[c_char]) -> String {
    let bytes: Vec<u8> = raw
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).trim().to_string()
}
