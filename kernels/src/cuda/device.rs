//! Start-up of the CUDA backend: libraries, device, and the compiled kernel modules.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::sys::CUresult;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, DriverError};
use cudarc::nvrtc::Ptx;

use super::cache::{CacheKey, KernelCache};
use super::compile::{Compiler, GpuArch};
use super::libs::CudaLibrary;
use super::sources::{KernelSource, KERNEL_SOURCES};
use super::toolkit::CudaToolkit;
use crate::backend::KernelResult;
use crate::error::KernelError;

/// How to start the CUDA backend.
#[derive(Clone, Debug)]
pub struct CudaOptions {
    /// Which GPU (CUDA ordinal).
    pub ordinal: usize,
    /// Toolkit root (headers, and `libnvrtc` if present); `None` = [`CudaToolkit::locate`].
    pub toolkit_root: Option<PathBuf>,
    /// Where compiled kernels and the GEMM algorithms picked by timing are cached; `None` =
    /// [`KernelCache::default_dir`].
    pub cache_dir: Option<PathBuf>,
    /// Compile every kernel and time every GEMM shape at start-up even if cached (and write
    /// nothing to the cache).
    pub no_cache: bool,
    /// Batch invariance (default on): a sequence's results do not depend on the other sequences
    /// in its batch. GEMMs keep one reduction order per shape whatever the row count (one
    /// reference algorithm per shape; a row bucket's timed winner must give its bits), and the
    /// last-row attention splits a sequence's keys by its own length. Off: each row bucket runs
    /// its fastest algorithm and the last-row split follows the batch (faster where a split-K
    /// algorithm wins; a sequence's bits then depend on its batch by ~1e-4). See
    /// docs/validation/batch-invariance.md.
    pub batch_invariant: bool,
    /// Captured passes (CUDA graphs): each pass of up to
    /// [`CAPTURED_MAX_ROWS`](crate::backend::CAPTURED_MAX_ROWS) rows runs padded to a captured
    /// shape ([`crate::backend::PassShape`]), and is replayed from the second batch of that shape
    /// on. The backend then runs on a stream of its own (the legacy default stream cannot be
    /// captured).
    pub cuda_graphs: bool,
    /// How much freed memory the device's default memory pool keeps for reuse when the stream
    /// synchronizes (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`); `None`: the driver's default, which
    /// hands all of it back, so the next allocation maps memory again. Buffers are allocated
    /// stream-ordered from that pool, and a pass that stages its carried states outside the
    /// arena (more than it holds: e.g. 8 questions resumed from a 1,792-token snapshot each,
    /// ~1.3 GB) allocates and frees them every time.
    pub pool_keep_bytes: Option<u64>,
}

impl Default for CudaOptions {
    fn default() -> Self {
        Self {
            ordinal: 0,
            toolkit_root: None,
            cache_dir: None,
            no_cache: false,
            batch_invariant: true,
            cuda_graphs: false,
            pool_keep_bytes: None,
        }
    }
}

/// A started device: its context, the stream every op runs on, and every kernel, loaded.
pub(crate) struct Device {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub arch: GpuArch,
    /// Streaming multiprocessors, and the opt-in shared memory per block (read once: launch
    /// decisions need them on every call).
    pub sm_count: usize,
    pub max_smem_optin: usize,
    /// The cache directory in use (`None` with `no_cache` or no default).
    pub cache_dir: Option<PathBuf>,
    functions: HashMap<&'static str, CudaFunction>,
}

/// Sets what the device's default memory pool (the one stream-ordered allocations come from)
/// keeps of freed memory at a synchronization.
fn keep_freed_memory(ctx: &CudaContext, bytes: u64) -> KernelResult<()> {
    use cudarc::driver::sys::{
        cuDeviceGetDefaultMemPool, cuMemPoolSetAttribute, CUmemPool_attribute, CUmemoryPool,
    };
    const OP: &str = "setting the memory pool's release threshold";
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    let mut threshold = bytes;
    // SAFETY: the pool handle is written by the driver for a device of an open context; the
    // attribute's value is a u64 (cuuint64_t), read during the call.
    unsafe {
        cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device())
            .result()
            .map_err(|e| driver_err(OP, e))?;
        cuMemPoolSetAttribute(
            pool,
            CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
        .result()
        .map_err(|e| driver_err(OP, e))?;
    }
    Ok(())
}

/// How many GPUs the driver lists (for `--device cuda:all`). Fails with a clear error, never a
/// panic, where no driver library is installed.
pub fn gpu_count() -> KernelResult<usize> {
    CudaLibrary::Driver.require()?;
    let n = CudaContext::device_count().map_err(|e| driver_err("counting GPUs", e))?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// Maps a driver error of `op` into a backend error, or into `DeviceLost` for the errors that
/// poison the context for the rest of the process.
pub(crate) fn driver_err(op: &str, e: DriverError) -> KernelError {
    if is_sticky(e.0) {
        KernelError::DeviceLost(format!("{op}: {e}"))
    } else {
        KernelError::Backend(format!("{op}: {e}"))
    }
}

/// The driver errors after which every later call in the process fails the same way (CUDA
/// driver API documentation: "the process must be terminated and relaunched").
fn is_sticky(code: CUresult) -> bool {
    use CUresult::*;
    matches!(
        code,
        CUDA_ERROR_DEINITIALIZED
            | CUDA_ERROR_ECC_UNCORRECTABLE
            | CUDA_ERROR_ILLEGAL_ADDRESS
            | CUDA_ERROR_LAUNCH_TIMEOUT
            | CUDA_ERROR_CONTEXT_IS_DESTROYED
            | CUDA_ERROR_ASSERT
            | CUDA_ERROR_HARDWARE_STACK_ERROR
            | CUDA_ERROR_ILLEGAL_INSTRUCTION
            | CUDA_ERROR_MISALIGNED_ADDRESS
            | CUDA_ERROR_INVALID_ADDRESS_SPACE
            | CUDA_ERROR_INVALID_PC
            | CUDA_ERROR_LAUNCH_FAILED
    )
}

impl Device {
    pub fn start(options: &CudaOptions) -> KernelResult<Self> {
        let toolkit = match &options.toolkit_root {
            Some(root) => CudaToolkit::at(root)?,
            None => CudaToolkit::locate()?,
        };
        // Check every library before its first use: cudarc panics on a missing one.
        CudaLibrary::Driver.require()?;
        let compiler = Compiler::new(&toolkit)?;
        toolkit.load_cublaslt()?;

        let ctx = CudaContext::new(options.ordinal)
            .map_err(|e| driver_err(&format!("opening cuda:{}", options.ordinal), e))?;
        if let Some(bytes) = options.pool_keep_bytes {
            keep_freed_memory(&ctx, bytes)?;
        }
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| driver_err("reading the compute capability", e))?;
        let arch = GpuArch::new(major as u32, minor as u32);
        let stream = if options.cuda_graphs {
            // One stream carries all of this backend's work, so cudarc's per-buffer events (which
            // a capture cannot wait on) are not needed; off before the first allocation.
            // SAFETY: every buffer of this context is used on `stream` only.
            unsafe { ctx.disable_event_tracking() };
            ctx.new_stream()
                .map_err(|e| driver_err("creating the backend's stream", e))?
        } else {
            ctx.default_stream()
        };

        let cache = if options.no_cache {
            None
        } else {
            options
                .cache_dir
                .clone()
                .or_else(KernelCache::default_dir)
                .map(KernelCache::new)
        };
        // Each file is one NVRTC program: on a cold cache they compile side by side (one thread
        // per file), which divides the start-up compile time by about the number of files.
        let cubin_of = |source: &KernelSource| -> KernelResult<Vec<u8>> {
            let full = source.full_source();
            let key = CacheKey::new(&full, &compiler.options(arch), compiler.version());
            if let Some(cubin) = cache.as_ref().and_then(|c| c.load(&key)) {
                return Ok(cubin);
            }
            let cubin = compiler.compile(source, arch)?.cubin;
            if let Some(cache) = &cache {
                // A cache that cannot be written costs start-up time, nothing else.
                let _ = cache.store(&key, &cubin);
            }
            Ok(cubin)
        };
        let cubins: Vec<KernelResult<Vec<u8>>> = std::thread::scope(|scope| {
            let handles: Vec<_> = KERNEL_SOURCES
                .iter()
                .map(|source| scope.spawn(|| cubin_of(source)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(KernelError::Backend(
                            "a kernel compile thread panicked".into(),
                        ))
                    })
                })
                .collect()
        });
        let mut functions = HashMap::new();
        for (source, cubin) in KERNEL_SOURCES.iter().zip(cubins) {
            let cubin = cubin?;
            let module = ctx
                .load_module(Ptx::from_binary(cubin))
                .map_err(|e| driver_err(&format!("loading {}", source.file), e))?;
            for &name in source.functions {
                let function = module
                    .load_function(name)
                    .map_err(|e| driver_err(&format!("{}: kernel {name}", source.file), e))?;
                functions.insert(name, function);
            }
        }
        let attribute = |attr, what: &str| {
            ctx.attribute(attr)
                .map_err(|e| driver_err(&format!("reading {what}"), e))
                .map(|v| usize::try_from(v).unwrap_or(0))
        };
        use cudarc::driver::sys::CUdevice_attribute as A;
        let sm_count = attribute(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "the SM count")?;
        let max_smem_optin = attribute(
            A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            "the opt-in shared memory",
        )?;
        Ok(Self {
            ctx,
            stream,
            arch,
            sm_count,
            max_smem_optin,
            cache_dir: cache.map(|c| c.dir().to_path_buf()),
            functions,
        })
    }

    /// The loaded kernel `name`.
    pub fn function(&self, name: &str) -> KernelResult<&CudaFunction> {
        self.functions
            .get(name)
            .ok_or_else(|| KernelError::Backend(format!("kernel {name} is not loaded")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_poisoning_errors_are_told_from_recoverable_ones() {
        for sticky in [
            CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
            CUresult::CUDA_ERROR_LAUNCH_FAILED,
            CUresult::CUDA_ERROR_ECC_UNCORRECTABLE,
            CUresult::CUDA_ERROR_MISALIGNED_ADDRESS,
        ] {
            assert!(is_sticky(sticky), "{sticky:?}");
        }
        for recoverable in [
            CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            CUresult::CUDA_ERROR_INVALID_VALUE,
            CUresult::CUDA_ERROR_NOT_FOUND,
            CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
        ] {
            assert!(!is_sticky(recoverable), "{recoverable:?}");
        }
    }
}
