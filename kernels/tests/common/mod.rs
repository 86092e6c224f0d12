//! Helpers shared by the test files (each uses a subset): host data for every file, device
//! buffers for the CUDA ones.
#![allow(dead_code)]

use cudarc::driver::CudaSlice;
use instinct_kernels::cuda::{CudaBackend, CudaBuf, CudaOptions};
use instinct_kernels::{Backend, CpuBackend, DeltaGates, GateOutputs};
use rand::rngs::StdRng;
use rand::Rng;

/// The CUDA backend on GPU 0 (the tests that call this are `#[ignore]`d: CI has no GPU).
pub fn gpu() -> CudaBackend {
    CudaBackend::new(CudaOptions::default()).unwrap_or_else(|e| panic!("CUDA start-up: {e}"))
}

/// `n` values uniform in ±`scale`.
pub fn rand_vec(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-scale..scale)).collect()
}

/// `n` values uniform in ±1 (the CPU tests' inputs).
pub fn rand_unit(rng: &mut StdRng, n: usize) -> Vec<f32> {
    rand_vec(rng, n, 1.0)
}

/// The largest absolute difference between `a` and `b` (of one length).
pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Mean wall seconds of `f` over `runs` runs after one warm-up call (the queue drained before and
/// after).
pub fn mean_seconds(gpu: &CudaBackend, runs: usize, mut f: impl FnMut()) -> f64 {
    f();
    gpu.synchronize().unwrap();
    let t = std::time::Instant::now();
    for _ in 0..runs {
        f();
    }
    gpu.synchronize().unwrap();
    t.elapsed().as_secs_f64() / runs as f64
}

/// The CPU reference's beta and g of `gates` over `rows` rows (NaN where it writes nothing).
pub fn cpu_gates(gates: DeltaGates<'_, Vec<f32>>, rows: usize) -> (Vec<f32>, Vec<f32>) {
    let n = rows * gates.heads;
    let (mut beta, mut g) = (vec![f32::NAN; n], vec![f32::NAN; n]);
    let out = GateOutputs {
        beta: &mut beta,
        g: &mut g,
    };
    CpuBackend::new().delta_gates(gates, rows, out).unwrap();
    (beta, g)
}

/// An f32 buffer holding `data`, then `extra` copies of `fill` (so ops must respect the lengths
/// they are given rather than the buffer's, and must not write past them).
pub fn padded(gpu: &CudaBackend, data: &[f32], extra: usize, fill: f32) -> CudaBuf {
    let mut host = data.to_vec();
    host.resize(data.len() + extra, fill);
    let mut buf = gpu.alloc(host.len()).unwrap();
    gpu.write(&mut buf, &host).unwrap();
    buf
}

/// An f32 buffer holding `data` then `extra` zeros.
pub fn activation(gpu: &CudaBackend, data: &[f32], extra: usize) -> CudaBuf {
    padded(gpu, data, extra, 0.0)
}

/// A bf16 buffer (`alloc_gemm_input`, as a projection output held in bf16) holding `data`, rounded,
/// then `extra` zeros.
pub fn bf16_activation(gpu: &CudaBackend, data: &[f32], extra: usize) -> CudaBuf {
    let mut buf = gpu.alloc_gemm_input(data.len() + extra).unwrap();
    gpu.write(&mut buf, data).unwrap();
    buf
}

/// [`bf16_activation`] when `bf16`, else [`activation`].
pub fn activation_as(gpu: &CudaBackend, data: &[f32], extra: usize, bf16: bool) -> CudaBuf {
    if bf16 {
        bf16_activation(gpu, data, extra)
    } else {
        activation(gpu, data, extra)
    }
}

/// A u32 buffer holding `data` (at least one value long).
pub fn indices(gpu: &CudaBackend, data: &[u32]) -> CudaSlice<u32> {
    let mut buf = gpu.alloc_idx(data.len().max(1)).unwrap();
    gpu.write_idx(&mut buf, data).unwrap();
    buf
}

/// `cu_seqlens` of sequences of `lens` packed back to back.
pub fn cu_of(lens: &[usize]) -> Vec<u32> {
    let mut cu = vec![0u32];
    for &l in lens {
        cu.push(cu.last().unwrap() + l as u32);
    }
    cu
}

/// Each value rounded to bf16 (as an upload or a bf16 buffer rounds it), back in f32.
pub fn bf16_round(v: &[f32]) -> Vec<f32> {
    v.iter()
        .map(|&x| half::bf16::from_f32(x).to_f32())
        .collect()
}
