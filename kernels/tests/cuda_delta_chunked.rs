//! The chunked gated delta rule kernel (`kernels/cuda/delta_chunked.cu`, behind
//! `gated_delta_rule_chunked`) against the CPU token-by-token reference: the real Qwen3.5-4B shape
//! (16 key heads, 32 value heads, 128/128) on ragged batches and one long sequence, strong and
//! tiny decays, with and without an initial state; narrow and grouped heads (the zero padding);
//! corrupt `cu_seqlens`; and a timing against the token-by-token kernel.
//!
//! These need a GPU, so every test is ignored; run them on the GPU machine with
//! `cargo test --release -p instinct-kernels --test cuda_delta_chunked -- --ignored --nocapture --test-threads 1`.

mod common;
use common::{cu_of, gpu, indices, mean_seconds, padded, rand_vec};

use instinct_kernels::cuda::CudaBackend;
use instinct_kernels::DeltaInputs;
use instinct_kernels::{Backend, CpuBackend, DeltaDims, DeltaState, HeadLayout, Varlen};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Qwen3.5-4B's Gated DeltaNet heads.
const REAL: DeltaDims = DeltaDims {
    k_heads: 16,
    v_heads: 32,
    k_dim: 128,
    v_dim: 128,
};

/// Strong decays, as most heads have, and tiny ones, where the state keeps everything and rounding
/// errors would accumulate.
const STRONG: (f32, f32) = (-2.0, 0.0);
const TINY: (f32, f32) = (-1e-3, 0.0);

/// Error allowed against the f32 reference, relative to the data's scale: the state products run
/// on bf16 tensor cores (state, W, q, k, P and V' rounded to bf16, f32 accumulation; the state
/// itself stays f32), as flash-linear-attention's kernels do.
const TOL: f32 = 1.5e-2;

/// Written past the op's rows (and past the states): must survive the op.
const SENTINEL: f32 = 7.25;

/// The q and k blocks of a qkv row, as `2·k_heads` heads.
fn qk_layout(dims: DeltaDims) -> HeadLayout {
    HeadLayout {
        heads: 2 * dims.k_heads,
        head_dim: dims.k_dim,
        head_stride: dims.k_dim,
        row_stride: dims.qkv_width(),
        offset: 0,
    }
}

struct Inputs {
    dims: DeltaDims,
    cu: Vec<u32>,
    rows: usize,
    qkv: Vec<f32>,
    beta: Vec<f32>,
    g: Vec<f32>,
    initial: Vec<f32>,
}

impl Inputs {
    fn new(rng: &mut StdRng, dims: DeltaDims, lens: &[usize], decay: (f32, f32)) -> Self {
        let cu = cu_of(lens);
        let rows = *cu.last().unwrap() as usize;
        let mut qkv = rand_vec(rng, rows * dims.qkv_width(), 1.0);
        // q and k arrive L2-normalised, as the model's l2_norm leaves them.
        CpuBackend::new()
            .l2_norm(&mut qkv, qk_layout(dims), rows, 1e-6)
            .unwrap();
        let beta = (0..rows * dims.v_heads)
            .map(|_| rng.gen_range(0.0..1.0))
            .collect();
        let g = (0..rows * dims.v_heads)
            .map(|_| rng.gen_range(decay.0..decay.1))
            .collect();
        let initial = rand_vec(rng, lens.len() * dims.state_len(), 0.5);
        Self {
            dims,
            cu,
            rows,
            qkv,
            beta,
            g,
            initial,
        }
    }

    fn num_seqs(&self) -> usize {
        self.cu.len() - 1
    }

    fn out_len(&self) -> usize {
        self.rows * self.dims.v_heads * self.dims.v_dim
    }

    fn state_len(&self) -> usize {
        self.num_seqs() * self.dims.state_len()
    }

    /// The CPU token-by-token output and final states.
    fn reference(&self, with_initial: bool) -> (Vec<f32>, Vec<f32>) {
        let cpu = CpuBackend::new();
        let mut out = vec![0.0; self.out_len()];
        let mut fin = vec![0.0; self.state_len()];
        let batch = Varlen {
            cu_seqlens: &self.cu,
            num_seqs: self.num_seqs(),
            rows: self.rows,
        };
        let state = DeltaState {
            initial: with_initial.then_some(&self.initial),
            final_out: Some(&mut fin),
            final_at: None,
        };
        cpu.gated_delta_rule_recurrent(
            DeltaInputs {
                qkv: &self.qkv,
                beta: &self.beta,
                g: &self.g,
            },
            batch,
            self.dims,
            state,
            &mut out,
        )
        .unwrap();
        (out, fin)
    }

    /// The GPU chunked output and final states, from buffers with sentinels past their ends
    /// (checked untouched here).
    fn on_gpu(&self, gpu: &CudaBackend, with_initial: bool) -> (Vec<f32>, Vec<f32>) {
        let extra_rows = 3;
        let dims = self.dims;
        let qkv = padded(gpu, &self.qkv, extra_rows * dims.qkv_width(), SENTINEL);
        let beta = padded(gpu, &self.beta, extra_rows * dims.v_heads, SENTINEL);
        let g = padded(gpu, &self.g, extra_rows * dims.v_heads, SENTINEL);
        let initial = padded(gpu, &self.initial, 0, SENTINEL);
        let cu = indices(gpu, &self.cu);
        let out_extra = extra_rows * dims.v_heads * dims.v_dim;
        let mut out = padded(gpu, &vec![SENTINEL; self.out_len()], out_extra, SENTINEL);
        let state_extra = 5;
        let mut fin = padded(
            gpu,
            &vec![SENTINEL; self.state_len()],
            state_extra,
            SENTINEL,
        );
        let batch = Varlen {
            cu_seqlens: &cu,
            num_seqs: self.num_seqs(),
            rows: self.rows,
        };
        let state = DeltaState {
            initial: with_initial.then_some(&initial),
            final_out: Some(&mut fin),
            final_at: None,
        };
        gpu.gated_delta_rule_chunked(
            DeltaInputs {
                qkv: &qkv,
                beta: &beta,
                g: &g,
            },
            batch,
            dims,
            state,
            &mut out,
        )
        .unwrap();
        let mut out = gpu.read(&out, self.out_len() + out_extra).unwrap();
        let mut fin = gpu.read(&fin, self.state_len() + state_extra).unwrap();
        assert!(
            out.split_off(self.out_len()).iter().all(|&x| x == SENTINEL),
            "wrote output rows past the batch"
        );
        assert!(
            fin.split_off(self.state_len())
                .iter()
                .all(|&x| x == SENTINEL),
            "wrote past the final states"
        );
        (out, fin)
    }
}

/// Max |got − want| within `tol` of max |want| (errors relative to the data's scale: outputs are
/// small, ~0.1, since q is normalised and scaled by k_dim^-0.5).
#[track_caller]
fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let (worst, err) = got
        .iter()
        .zip(want)
        // A NaN must fail: it counts as an infinite error.
        .map(|(g, w)| (g - w).abs())
        .map(|e| if e.is_nan() { f32::INFINITY } else { e })
        .enumerate()
        .fold(
            (0, 0.0f32),
            |(wi, we), (i, e)| if e > we { (i, e) } else { (wi, we) },
        );
    println!("{what}: max error {err:e} at {worst} (scale {scale:e})");
    assert!(
        err <= tol * scale && scale > 0.0,
        "{what}: index {worst}: cuda {} vs cpu {} (max error {err:e}, scale {scale:e}, tolerance {tol:e})",
        got[worst],
        want[worst]
    );
}

/// Chunked GPU vs CPU recurrent on `lens`, strong and tiny decays, with and without initial state.
fn compare(gpu: &CudaBackend, dims: DeltaDims, lens: &[usize], seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    for (decay, name) in [(STRONG, "strong"), (TINY, "tiny")] {
        let inputs = Inputs::new(&mut rng, dims, lens, decay);
        for with_initial in [false, true] {
            let (want, want_final) = inputs.reference(with_initial);
            let (got, got_final) = inputs.on_gpu(gpu, with_initial);
            let what = format!("{dims:?} lens {lens:?} {name} decay, initial {with_initial}");
            assert_close(&got, &want, TOL, &format!("{what}: out"));
            assert_close(
                &got_final,
                &want_final,
                TOL,
                &format!("{what}: final state"),
            );
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn chunked_matches_cpu_on_ragged_batches_at_the_real_shape() {
    // Lengths around the chunk edges; six sequences × 32 heads take the 64-column slices (384
    // narrow blocks would not fit in one wave).
    compare(&gpu(), REAL, &[1, 63, 64, 65, 130, 333], 1);
}

#[test]
#[ignore = "needs a GPU"]
fn chunked_matches_cpu_on_one_long_sequence() {
    // One sequence × 32 heads takes the 32-column slices (128 blocks, one wave); 47 chunks of state
    // carried.
    compare(&gpu(), REAL, &[3001], 2);
}

#[test]
#[ignore = "needs a GPU"]
fn chunked_matches_cpu_with_narrow_and_grouped_heads() {
    let gpu = gpu();
    // Narrow heads are zero-padded to 128 keys and 32 / 64 values; widths not multiples of 4.
    let shapes = [
        DeltaDims {
            k_heads: 1,
            v_heads: 1,
            k_dim: 16,
            v_dim: 8,
        },
        DeltaDims {
            k_heads: 2,
            v_heads: 6,
            k_dim: 24,
            v_dim: 100,
        },
        DeltaDims {
            k_heads: 2,
            v_heads: 4,
            k_dim: 125,
            v_dim: 37,
        },
    ];
    for (i, dims) in shapes.into_iter().enumerate() {
        compare(&gpu, dims, &[1, 70, 3, 129], 10 + i as u64);
    }
    // Enough (sequence, head) pairs for 64-column slices, the last one 36 columns wide.
    let many: Vec<usize> = (0..40).map(|i| 1 + (i * 37) % 90).collect();
    compare(&gpu, shapes[1], &many, 20);
}

#[test]
#[ignore = "needs a GPU"]
fn chunked_clamps_corrupt_cu_seqlens_to_the_batch_rows() {
    let gpu = gpu();
    let dims = REAL;
    let mut rng = StdRng::seed_from_u64(3);
    let inputs = Inputs::new(&mut rng, dims, &[5], STRONG);
    let (want, _) = inputs.reference(false);
    let qkv = padded(&gpu, &inputs.qkv, 0, SENTINEL);
    let beta = padded(&gpu, &inputs.beta, 0, SENTINEL);
    let g = padded(&gpu, &inputs.g, 0, SENTINEL);
    // Sequences 1 and 2 point far past the 5 rows the buffers hold.
    let cu = indices(&gpu, &[0, 5, 4_000_000_000, 7]);
    let mut out = gpu.alloc(inputs.out_len()).unwrap();
    let mut fin = padded(&gpu, &vec![SENTINEL; 3 * dims.state_len()], 0, SENTINEL);
    let batch = Varlen {
        cu_seqlens: &cu,
        num_seqs: 3,
        rows: 5,
    };
    let state = DeltaState {
        initial: None,
        final_out: Some(&mut fin),
        final_at: None,
    };
    gpu.gated_delta_rule_chunked(
        DeltaInputs {
            qkv: &qkv,
            beta: &beta,
            g: &g,
        },
        batch,
        dims,
        state,
        &mut out,
    )
    .unwrap();
    gpu.synchronize().unwrap();
    let got = gpu.read(&out, inputs.out_len()).unwrap();
    assert_close(&got, &want, TOL, "sequence 0");
    // The clamped sequences are empty: their final state is the (zero) initial one.
    let fin = gpu.read(&fin, 3 * dims.state_len()).unwrap();
    assert!(fin[dims.state_len()..].iter().all(|&x| x == 0.0));
}

/// Mean wall time of `f` over `iters` runs after one warm-up, in ms.
fn time_ms(gpu: &CudaBackend, iters: usize, f: impl FnMut()) -> f64 {
    mean_seconds(gpu, iters, f) * 1e3
}

#[test]
#[ignore = "needs a GPU; prints timings"]
fn timing_chunked_vs_recurrent() {
    let gpu = gpu();
    let dims = REAL;
    let mut rng = StdRng::seed_from_u64(4);
    let max_rows = 128 * 300;
    let mut qkv = padded(
        &gpu,
        &rand_vec(&mut rng, max_rows * dims.qkv_width(), 1.0),
        0,
        SENTINEL,
    );
    gpu.l2_norm(&mut qkv, qk_layout(dims), max_rows, 1e-6)
        .unwrap();
    let beta: Vec<f32> = (0..max_rows * dims.v_heads)
        .map(|_| rng.gen_range(0.0..1.0))
        .collect();
    let g: Vec<f32> = (0..max_rows * dims.v_heads)
        .map(|_| rng.gen_range(-2.0..0.0))
        .collect();
    let (beta, g) = (
        padded(&gpu, &beta, 0, SENTINEL),
        padded(&gpu, &g, 0, SENTINEL),
    );
    let mut out = gpu.alloc(max_rows * dims.v_heads * dims.v_dim).unwrap();
    let mut fin = gpu.alloc(128 * dims.state_len()).unwrap();
    for lens in [vec![15_446], vec![712], vec![139], vec![300; 128]] {
        let cu_host = cu_of(&lens);
        let cu = indices(&gpu, &cu_host);
        let rows = *cu_host.last().unwrap() as usize;
        let mut run = |chunked: bool, iters: usize| {
            time_ms(&gpu, iters, || {
                let batch = Varlen {
                    cu_seqlens: &cu,
                    num_seqs: lens.len(),
                    rows,
                };
                let state = DeltaState {
                    initial: None,
                    final_out: Some(&mut fin),
                    final_at: None,
                };
                if chunked {
                    gpu.gated_delta_rule_chunked(
                        DeltaInputs {
                            qkv: &qkv,
                            beta: &beta,
                            g: &g,
                        },
                        batch,
                        dims,
                        state,
                        &mut out,
                    )
                } else {
                    gpu.gated_delta_rule_recurrent(
                        DeltaInputs {
                            qkv: &qkv,
                            beta: &beta,
                            g: &g,
                        },
                        batch,
                        dims,
                        state,
                        &mut out,
                    )
                }
                .unwrap();
            })
        };
        let chunked = run(true, 10);
        let recurrent = run(false, 2);
        println!(
            "{} × {} tokens: chunked {chunked:.3} ms (× 24 layers {:.1} ms), recurrent {recurrent:.3} ms",
            lens.len(),
            lens[0],
            24.0 * chunked
        );
    }
}
