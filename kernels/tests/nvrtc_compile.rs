//! Compiles every embedded CUDA kernel with NVRTC for Hopper (sm_90a) and Ampere (sm_80), with no
//! GPU and no driver: NVRTC and the CUDA headers come from NVIDIA's PyPI wheels, which
//! `tools/fetch-cuda-headers.sh` (run by `tools/test.sh`) unpacks into `<repo>/.cache/cuda`.
//! `INSTINCT_CUDA_HOME` points the test at another toolkit instead.

use std::path::PathBuf;

use instinct_kernels::cuda::{
    Compiler, CudaBackend, CudaLibrary, CudaOptions, CudaToolkit, GpuArch, KernelSource,
    KERNEL_SOURCES,
};

fn toolkit_root() -> PathBuf {
    match std::env::var_os("INSTINCT_CUDA_HOME").filter(|v| !v.is_empty()) {
        Some(root) => PathBuf::from(root),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.cache/cuda"),
    }
}

fn compiler() -> Compiler {
    let root = toolkit_root();
    let toolkit = CudaToolkit::at(&root).unwrap_or_else(|e| {
        panic!("{e}\nrun tools/fetch-cuda-headers.sh (tools/test.sh does) to install NVRTC and the CUDA headers")
    });
    Compiler::new(&toolkit).unwrap_or_else(|e| panic!("{e}"))
}

/// Whether `name` is a symbol of the CUBIN (an exact, NUL-delimited entry of its string table).
fn defines_symbol(cubin: &[u8], name: &str) -> bool {
    let needle = [b"\0", name.as_bytes(), b"\0"].concat();
    cubin.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn nvrtc_is_cuda_13() {
    let (major, _) = compiler().version();
    assert_eq!(major, 13, "the GPU machines run CUDA 13; NVRTC must match");
}

#[test]
fn every_kernel_compiles_for_sm90a_and_sm80_without_warnings() {
    let compiler = compiler();
    assert!(!KERNEL_SOURCES.is_empty());
    for arch in [GpuArch::SM_90, GpuArch::SM_80] {
        for source in KERNEL_SOURCES {
            let compiled = compiler
                .compile(source, arch)
                .unwrap_or_else(|e| panic!("{} for {}: {e}", source.file, arch.nvrtc_target()));
            assert!(
                !compiled.log.to_lowercase().contains("warning"),
                "{} for {} compiled with warnings:\n{}",
                source.file,
                arch.nvrtc_target(),
                compiled.log
            );
            assert!(
                compiled.cubin.starts_with(b"\x7fELF"),
                "{} for {}: NVRTC returned no CUBIN",
                source.file,
                arch.nvrtc_target()
            );
            for function in source.functions {
                assert!(
                    defines_symbol(&compiled.cubin, function),
                    "{} for {} does not define kernel {function}",
                    source.file,
                    arch.nvrtc_target()
                );
            }
        }
    }
}

#[test]
fn kernel_names_are_unique() {
    let mut names: Vec<&str> = KERNEL_SOURCES
        .iter()
        .flat_map(|s| s.functions.iter().copied())
        .collect();
    let total = names.len();
    names.sort_unstable();
    names.dedup();
    assert_eq!(
        names.len(),
        total,
        "two kernel files define the same kernel name"
    );
}

#[test]
fn a_compile_error_names_the_file_and_carries_the_log() {
    let broken = KernelSource::new(
        "broken.cu",
        "extern \"C\" __global__ void broken(float* x) { x[0] = undeclared_name; }\n",
        &["broken"],
    );
    let err = compiler()
        .compile(&broken, GpuArch::SM_90)
        .unwrap_err()
        .to_string();
    assert!(err.contains("broken.cu"), "{err}");
    assert!(err.contains("undeclared_name"), "{err}");
}

#[test]
fn the_architecture_names_nvrtc_gets() {
    assert_eq!(GpuArch::SM_90.nvrtc_target(), "sm_90a");
    assert_eq!(GpuArch::SM_80.nvrtc_target(), "sm_80");
    assert_eq!(GpuArch::new(8, 6).nvrtc_target(), "sm_86");
    assert_eq!(GpuArch::new(10, 0).nvrtc_target(), "sm_100a");
}

#[test]
fn a_directory_without_headers_is_not_a_toolkit() {
    let err = CudaToolkit::at("/nonexistent/cuda")
        .unwrap_err()
        .to_string();
    assert!(err.contains("cuda_bf16.h"), "{err}");
}

#[test]
fn starting_without_a_driver_is_an_error_naming_libcuda() {
    // On a machine with the driver (the GPU machine) start-up goes further; the ignored GPU tests
    // cover that. Here (CI, no driver) it must stop with an error, not a panic.
    if CudaLibrary::Driver.is_present() {
        return;
    }
    let options = CudaOptions {
        toolkit_root: Some(toolkit_root()),
        no_cache: true,
        ..CudaOptions::default()
    };
    let err = CudaBackend::new(options)
        .err()
        .expect("start-up must fail without libcuda");
    assert!(err.to_string().contains("libcuda.so.1"), "{err}");
}

#[test]
fn warnings_reach_the_log_so_the_warning_check_can_fail() {
    let noisy = KernelSource::new(
        "noisy.cu",
        "extern \"C\" __global__ void noisy(float* x) { int never_used = 3; x[0] = 1.0f; }\n",
        &["noisy"],
    );
    let compiled = compiler().compile(&noisy, GpuArch::SM_90).unwrap();
    assert!(compiled.log.contains("warning"), "log: {:?}", compiled.log);
}

#[test]
fn tensor_core_headers_compile_for_hopper() {
    // The WMMA/bf16 headers (mma.h from the crt wheel, cuda_bf16.h from the runtime wheel) the
    // next kernels (GEMM, attention) will include.
    let wmma = KernelSource::new(
        "wmma.cu",
        r#"#include <mma.h>
using namespace nvcuda;
extern "C" __global__ void wmma_tile(const __nv_bfloat16* a, const __nv_bfloat16* b, float* c) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::fill_fragment(fc, 0.0f);
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}
"#,
        &["wmma_tile"],
    );
    let compiled = compiler()
        .compile(&wmma, GpuArch::SM_90)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(defines_symbol(&compiled.cubin, "wmma_tile"));
    assert!(!compiled.log.contains("warning"), "{}", compiled.log);
}
