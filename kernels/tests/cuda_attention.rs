//! The tensor-core flash attention kernel (`kernels/cuda/flash_attention.cu`) against the CPU
//! reference, plus a timing run at the serving shapes.
//!
//! Two kernel shapes exist (wide: 128 query rows per block, for long sequences; narrow: 64 rows,
//! for batches of short ones); the accuracy tests run every case on both, forced through
//! [`CudaBackend::force_flash_query_rows`], and the timing run prints both beside the automatic
//! choice.
//!
//! These need a GPU, so every test is ignored; on the GPU machine:
//! `cargo test -p instinct-kernels --test cuda_attention -- --ignored --nocapture --test-threads 1`
//! (`--nocapture` shows the error statistics and the timings; one thread keeps the timing run
//! alone on the GPU). The CPU reference is optimised even in test builds; the longest test is the
//! 2,500-token one, bound by the CPU reference.
//!
//! The kernel rounds q (pre-scaled), k, v and the probabilities to bf16 and accumulates in f32.
//! With inputs uniform in ±2 (v in ±1) an emulation of those roundings stays below 3e-3 of
//! `1 + |reference|` up to 2,500 keys, so 1e-2 leaves a margin; a wrong mask, tile boundary or
//! softmax rescale gives errors of order one.

mod common;
use common::{bf16_round, cu_of, gpu, indices, padded, rand_vec};

use std::time::Instant;

use instinct_kernels::cuda::{CudaBackend, CudaBuf};
use instinct_kernels::QkPrologue;
use instinct_kernels::{AttentionDims, Backend, CpuBackend, HeadLayout, Rope, Varlen};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Qwen3.5-4B full attention: 16 query heads over 4 kv heads of 256.
const REAL: AttentionDims = AttentionDims {
    q_heads: 16,
    kv_heads: 4,
    head_dim: 256,
    scale: 0.0625,
};

/// Tolerance of the flash kernel (bf16 operands) for inputs in ±2.
const FLASH_TOL: f32 = 1e-2;

/// The forced shapes (query rows per block) and their names.
const SHAPES: [(usize, &str); 2] = [(128, "wide"), (64, "narrow")];

/// Runs `f` once per kernel shape, forced, then restores the automatic choice (also on panic).
fn for_each_shape(mut f: impl FnMut(&str)) {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            CudaBackend::force_flash_query_rows(None);
        }
    }
    let _reset = Reset;
    for (rows, name) in SHAPES {
        CudaBackend::force_flash_query_rows(Some(rows));
        f(name);
    }
}

/// Random inputs of one attention call: `qg`, `k`, `v` for `rows` rows. q and k in ±`qk`, the
/// gates in ±2, v in ±1.
struct Inputs {
    qg: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl Inputs {
    fn new(rng: &mut StdRng, rows: usize, dims: AttentionDims, qk: f32) -> Self {
        let d = dims.head_dim;
        let mut qg = rand_vec(rng, rows * dims.q_heads * 2 * d, 2.0);
        // Queries (the first half of every head) in ±qk; the gates stay in ±2.
        for head in qg.chunks_mut(2 * d) {
            for x in &mut head[..d] {
                *x *= qk / 2.0;
            }
        }
        Self {
            qg,
            k: rand_vec(rng, rows * dims.kv_heads * d, qk),
            v: rand_vec(rng, rows * dims.kv_heads * d, 1.0),
        }
    }
}

fn cpu_attention(inputs: &Inputs, lens: &[usize], dims: AttentionDims) -> Vec<f32> {
    let cu = cu_of(lens);
    let rows = *cu.last().unwrap() as usize;
    let mut want = vec![0.0; rows * dims.q_heads * dims.head_dim];
    let batch = Varlen {
        cu_seqlens: &cu,
        num_seqs: lens.len(),
        rows,
    };
    CpuBackend::new()
        .attention(&inputs.qg, &inputs.k, &inputs.v, batch, dims, &mut want)
        .unwrap();
    want
}

/// Runs the CUDA attention on `inputs` (buffers exactly `rows` long) and reads the output.
fn gpu_attention(
    gpu: &CudaBackend,
    inputs: &Inputs,
    lens: &[usize],
    dims: AttentionDims,
) -> Vec<f32> {
    let cu = cu_of(lens);
    let rows = *cu.last().unwrap() as usize;
    let out_len = rows * dims.q_heads * dims.head_dim;
    let qg = padded(gpu, &inputs.qg, 0, 0.0);
    let k = padded(gpu, &inputs.k, 0, 0.0);
    let v = padded(gpu, &inputs.v, 0, 0.0);
    let cu_d = indices(gpu, &cu);
    let mut out = gpu.alloc(out_len).unwrap();
    let batch = Varlen {
        cu_seqlens: &cu_d,
        num_seqs: lens.len(),
        rows,
    };
    gpu.attention(&qg, &k, &v, batch, dims, &mut out).unwrap();
    gpu.read(&out, out_len).unwrap()
}

/// Asserts |got − want| ≤ tol·(1 + |want|) everywhere; prints the worst and mean error.
#[track_caller]
fn assert_close(got: &[f32], want: &[f32], tol: f32, dims: AttentionDims, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let width = dims.q_heads * dims.head_dim;
    let (mut worst, mut worst_at, mut sum) = (0.0f32, 0, 0.0f64);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs() / (1.0 + w.abs());
        // NaN must fail too.
        if err.is_nan() || err > worst {
            worst = if err.is_nan() { f32::INFINITY } else { err };
            worst_at = i;
        }
        sum += f64::from(err);
    }
    eprintln!(
        "{what}: worst relative error {worst:.2e} (row {}, head {}, dim {}), mean {:.2e}",
        worst_at / width,
        worst_at % width / dims.head_dim,
        worst_at % dims.head_dim,
        sum / got.len().max(1) as f64
    );
    assert!(
        worst <= tol,
        "{what}: index {worst_at} (row {}, head {}, dim {}): cuda {} vs cpu {} (error {worst:.3e} > \
         tolerance {tol:.1e})",
        worst_at / width,
        worst_at % width / dims.head_dim,
        worst_at % dims.head_dim,
        got[worst_at],
        want[worst_at]
    );
}

#[test]
#[ignore = "needs a GPU"]
fn flash_matches_cpu_on_ragged_batches_at_the_real_shape() {
    let gpu = gpu();
    let mut rng = StdRng::seed_from_u64(21);
    // Length 1, lengths around the 64-key and 64/128-query tiles, and sequences after long ones
    // (so tiles map to sequences with non-zero starts).
    let mut batches: Vec<Vec<usize>> = [1, 63, 64, 65, 300, 777].iter().map(|&l| vec![l]).collect();
    batches.extend([
        vec![1, 63, 64, 65, 300, 777],
        vec![777, 300, 65, 64, 63, 1],
        vec![128, 127, 129, 1, 256, 2],
        vec![300, 300, 300],
    ]);
    // More than 32 sequences: the narrow kernel's tile search scans 32 boundaries per step.
    batches.push((0..70).map(|i| [1, 63, 64, 65, 17, 130][i % 6]).collect());
    for lens in &batches {
        let rows = lens.iter().sum();
        let inputs = Inputs::new(&mut rng, rows, REAL, 2.0);
        let want = cpu_attention(&inputs, lens, REAL);
        for_each_shape(|shape| {
            let got = gpu_attention(&gpu, &inputs, lens, REAL);
            let what = if lens.len() > 8 {
                format!("{shape}, {} sequences", lens.len())
            } else {
                format!("{shape}, lens {lens:?}")
            };
            assert_close(&got, &want, FLASH_TOL, REAL, &what);
        });
    }
}

#[test]
#[ignore = "needs a GPU"]
fn flash_matches_cpu_on_a_long_sequence() {
    let gpu = gpu();
    let mut rng = StdRng::seed_from_u64(22);
    // 2,500 keys: 20 query tiles, up to 40 key tiles per row; a short sequence after it.
    let lens = [2_500, 37];
    let rows = lens.iter().sum();
    let inputs = Inputs::new(&mut rng, rows, REAL, 2.0);
    let t = Instant::now();
    let want = cpu_attention(&inputs, &lens, REAL);
    eprintln!("cpu reference: {:.1?}", t.elapsed());
    for_each_shape(|shape| {
        let got = gpu_attention(&gpu, &inputs, &lens, REAL);
        assert_close(
            &got,
            &want,
            FLASH_TOL,
            REAL,
            &format!("{shape}, lens {lens:?}"),
        );
    });
}

#[test]
#[ignore = "needs a GPU"]
fn flash_tracks_a_moving_max_with_peaked_scores() {
    // q and k in ±4: scores spread over tens of units, so the running max changes often and the
    // rescaling of the accumulator matters. Rounding q and k to bf16 costs more here (an emulation
    // gives ~1.2e-2 worst case), hence the looser bound; a broken rescale is still of order one.
    let gpu = gpu();
    let mut rng = StdRng::seed_from_u64(23);
    let lens = [700, 1, 190];
    let rows = lens.iter().sum();
    let inputs = Inputs::new(&mut rng, rows, REAL, 4.0);
    let want = cpu_attention(&inputs, &lens, REAL);
    for_each_shape(|shape| {
        let got = gpu_attention(&gpu, &inputs, &lens, REAL);
        assert_close(&got, &want, 5e-2, REAL, &format!("{shape}, peaked scores"));
    });
}

#[test]
#[ignore = "needs a GPU"]
fn every_head_size_takes_the_right_kernel() {
    let gpu = gpu();
    let mut rng = StdRng::seed_from_u64(24);
    let lens = [1, 130, 70];
    let rows = lens.iter().sum();
    // Multiples of 16 up to 256 run on the flash kernel (padded up to 64, 128 or 256 inside);
    // the rest on the exact naive kernel, which must keep its f32 accuracy. Group sizes 1, 2, 8.
    for (head_dim, q_heads, kv_heads) in [
        (16, 4, 2),
        (48, 8, 1),
        (64, 8, 2),
        (80, 4, 4),
        (128, 4, 2),
        (144, 8, 1),
        (240, 4, 2),
        (8, 4, 2),
        (40, 4, 2),
        (264, 2, 1),
    ] {
        let dims = AttentionDims {
            q_heads,
            kv_heads,
            head_dim,
            scale: (head_dim as f32).powf(-0.5),
        };
        let flash = head_dim.is_multiple_of(16) && head_dim <= 256;
        let inputs = Inputs::new(&mut rng, rows, dims, 2.0);
        let want = cpu_attention(&inputs, &lens, dims);
        for_each_shape(|shape| {
            let got = gpu_attention(&gpu, &inputs, &lens, dims);
            let (tol, kernel) = if flash {
                (FLASH_TOL, format!("flash, {shape}"))
            } else {
                (1e-4, "naive".to_string())
            };
            let what = format!("head_dim {head_dim}, {q_heads}/{kv_heads} heads ({kernel})");
            assert_close(&got, &want, tol, dims, &what);
        });
    }
}

#[test]
#[ignore = "needs a GPU"]
fn rows_beyond_the_batch_stay_untouched() {
    const SENTINEL: f32 = 7.25;
    let gpu = gpu();
    let mut rng = StdRng::seed_from_u64(25);
    let dims = REAL;
    let d = dims.head_dim;
    let (qg_w, kv_w, out_w) = (dims.q_heads * 2 * d, dims.kv_heads * d, dims.q_heads * d);
    let lens = [65, 1, 130];
    let rows: usize = lens.iter().sum();
    let extra_rows = 150;
    let inputs = Inputs::new(&mut rng, rows, dims, 2.0);
    let want = cpu_attention(&inputs, &lens, dims);
    for_each_shape(|shape| {
        // Buffers for rows + extra_rows, the extra rows holding large values the kernel must not
        // read (they would change the result) and an output the kernel must not write.
        let qg = padded(&gpu, &inputs.qg, extra_rows * qg_w, 50.0);
        let k = padded(&gpu, &inputs.k, extra_rows * kv_w, 50.0);
        let v = padded(&gpu, &inputs.v, extra_rows * kv_w, 50.0);
        let total = (rows + extra_rows) * out_w;
        let mut out = padded(&gpu, &[], total, SENTINEL);
        let cu = cu_of(&lens);
        let cu_d = indices(&gpu, &cu);
        let batch = Varlen {
            cu_seqlens: &cu_d,
            num_seqs: lens.len(),
            rows,
        };
        gpu.attention(&qg, &k, &v, batch, dims, &mut out).unwrap();
        let got = gpu.read(&out, total).unwrap();
        assert_close(
            &got[..rows * out_w],
            &want,
            FLASH_TOL,
            dims,
            &format!("{shape}, short batch"),
        );
        assert!(
            got[rows * out_w..].iter().all(|&x| x == SENTINEL),
            "{shape}: rows beyond the batch were written"
        );

        // cu_seqlens claiming more rows than `rows` (a stale or corrupt buffer): the kernel must
        // still stop at `rows`. What it computes for the rows it covers is unspecified.
        let bad_cu = [0u32, 40, 10_000, 5, 1_000_000];
        let bad_cu_d = indices(&gpu, &bad_cu);
        let short = 100;
        let mut out = padded(&gpu, &[], total, SENTINEL);
        let batch = Varlen {
            cu_seqlens: &bad_cu_d,
            num_seqs: bad_cu.len() - 1,
            rows: short,
        };
        gpu.attention(&qg, &k, &v, batch, dims, &mut out).unwrap();
        let got = gpu.read(&out, total).unwrap();
        assert!(
            got[short * out_w..].iter().all(|&x| x == SENTINEL),
            "{shape}: a corrupt cu_seqlens made the kernel write beyond `rows`"
        );
        assert!(
            got[..short * out_w].iter().all(|x| x.is_finite()),
            "{shape}: rows inside the batch must still get finite values"
        );
    });
}

/// Runs `attention_last` on both backends over `lens` and compares: one row per sequence.
fn check_attention_last(gpu: &CudaBackend, rng: &mut StdRng, lens: &[usize]) {
    let dims = REAL;
    let cu = cu_of(lens);
    let rows = *cu.last().unwrap() as usize;
    let inputs = Inputs::new(rng, rows, dims, 2.0);
    let out_len = lens.len() * dims.q_heads * dims.head_dim;
    let mut want = vec![0.0; out_len];
    let batch = Varlen {
        cu_seqlens: &cu,
        num_seqs: lens.len(),
        rows,
    };
    CpuBackend::new()
        .attention_last(&inputs.qg, &inputs.k, &inputs.v, batch, dims, &mut want)
        .unwrap();
    // The CPU's last rows are its full attention's last rows.
    let full = cpu_attention(&inputs, lens, dims);
    let width = dims.q_heads * dims.head_dim;
    for (s, &end) in cu[1..].iter().enumerate() {
        let last = end as usize - 1;
        assert_eq!(
            want[s * width..(s + 1) * width],
            full[last * width..(last + 1) * width]
        );
    }
    let qg = padded(gpu, &inputs.qg, 0, 0.0);
    let k = padded(gpu, &inputs.k, 0, 0.0);
    let v = padded(gpu, &inputs.v, 0, 0.0);
    let cu_d = indices(gpu, &cu);
    // One spare row past the sequences: it must stay untouched.
    let mut out = padded(gpu, &vec![7.0; out_len + width], 0, 0.0);
    let batch = Varlen {
        cu_seqlens: &cu_d,
        num_seqs: lens.len(),
        rows,
    };
    gpu.attention_last(&qg, &k, &v, batch, dims, &mut out)
        .unwrap();
    let got = gpu.read(&out, out_len + width).unwrap();
    assert!(
        got[out_len..].iter().all(|&x| x == 7.0),
        "wrote past the last sequence"
    );
    let what = if lens.len() > 8 {
        format!("last rows, {} sequences", lens.len())
    } else {
        format!("last rows, lens {lens:?}")
    };
    assert_close(&got[..out_len], &want, FLASH_TOL, dims, &what);
}

#[test]
#[ignore = "needs a GPU"]
fn attention_last_matches_the_last_rows_of_the_cpu_reference() {
    let gpu = gpu();
    let mut rng = StdRng::seed_from_u64(27);
    for lens in [
        vec![1],
        vec![63],
        vec![64],
        vec![65],
        vec![777],
        vec![2_500, 37],
        vec![1, 63, 64, 65, 300, 777],
        (0..70).map(|i| [1, 63, 64, 65, 17, 130][i % 6]).collect(),
    ] {
        check_attention_last(&gpu, &mut rng, &lens);
    }
}

/// One gated attention layer's inputs as the model has them: a stacked q|gate|k|v projection,
/// the two head-norm weights (bf16-exact), positions and rope.
struct Stacked {
    qkv: Vec<f32>,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    positions: Vec<u32>,
    rope: Rope,
}

impl Stacked {
    fn new(rng: &mut StdRng, rows: usize, dims: AttentionDims, rotary_dim: usize) -> Self {
        let half = rotary_dim / 2;
        let third = half / 3;
        Self {
            qkv: rand_vec(rng, rows * dims.stacked_width(), 2.0),
            q_norm: bf16_round(&rand_vec(rng, dims.head_dim, 0.5)),
            k_norm: bf16_round(&rand_vec(rng, dims.head_dim, 0.5)),
            positions: (0..rows as u32)
                .flat_map(|t| [3000 + t, rng.gen_range(0..40), rng.gen_range(0..40)])
                .collect(),
            rope: Rope {
                rotary_dim,
                theta: 10_000_000.0,
                section: [half - 2 * third, third, third],
                interleaved: true,
            },
        }
    }

    /// Its q|gate, k and v blocks as separate dense rows.
    fn split(&self, rows: usize, dims: AttentionDims) -> [Vec<f32>; 3] {
        let blocks = dims.stacked_blocks();
        let widths = [
            2 * dims.q_heads * dims.head_dim,
            dims.kv_heads * dims.head_dim,
            dims.kv_heads * dims.head_dim,
        ];
        std::array::from_fn(|b| {
            (0..rows)
                .flat_map(|t| {
                    let at = blocks[b].at(t, 0);
                    self.qkv[at..at + widths[b]].iter().copied()
                })
                .collect()
        })
    }
}

/// `gated_attention` (stacked input, norms and rope fused into the flash kernel's input pass)
/// against the separate ops on the GPU (`qk_norm_rope`, then `attention` or `attention_last` on
/// split buffers): the same bits in f32, and the same values rounded once to bf16 when the output
/// is a GEMM input; and against the CPU's `gated_attention` within the flash tolerance. The
/// model's heads (rotary pairs 32 apart: one lane holds both) and heads of 128 with 24 pairs and
/// two query heads per kv head; ragged batches with lengths 1, 63-65 and 300; both kernel shapes.
#[test]
#[ignore = "needs a GPU"]
fn gated_attention_is_norm_rope_then_attention_bit_for_bit() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = StdRng::seed_from_u64(41);
    let small = AttentionDims {
        q_heads: 4,
        kv_heads: 2,
        head_dim: 128,
        scale: 128f32.powf(-0.5),
    };
    let eps = 1e-6;
    for (dims, rotary_dim) in [(REAL, 64), (small, 48)] {
        for lens in [vec![1], vec![65], vec![1, 63, 64, 65, 300, 130]] {
            let cu = cu_of(&lens);
            let rows = *cu.last().unwrap() as usize;
            let input = Stacked::new(&mut rng, rows, dims, rotary_dim);
            let width = dims.q_heads * dims.head_dim;
            let cu_d = indices(&gpu, &cu);
            let pos_d = indices(&gpu, &input.positions);
            let (qn_d, kn_d) = (
                gpu.upload(&input.q_norm).unwrap(),
                gpu.upload(&input.k_norm).unwrap(),
            );
            let batch = Varlen {
                cu_seqlens: &cu_d,
                num_seqs: lens.len(),
                rows,
            };
            for last in [false, true] {
                let out_rows = if last { lens.len() } else { rows };
                let out_len = out_rows * width;
                let what = format!(
                    "heads {}x{}, rotary {rotary_dim}, lens {lens:?}, last {last}",
                    dims.q_heads, dims.head_dim
                );
                // The CPU reference.
                let mut want_cpu = vec![0.0; out_len];
                let cpu_batch = Varlen {
                    cu_seqlens: &cu,
                    num_seqs: lens.len(),
                    rows,
                };
                cpu.gated_attention(
                    &mut input.qkv.clone(),
                    QkPrologue {
                        q_norm: &input.q_norm,
                        k_norm: &input.k_norm,
                        positions: &input.positions,
                        rope: &input.rope,
                        eps,
                    },
                    cpu_batch,
                    dims,
                    last,
                    &mut want_cpu,
                )
                .unwrap();
                let shapes: &[(usize, &str)] = if last { &[(0, "last row")] } else { &SHAPES };
                for &(force, shape) in shapes {
                    CudaBackend::force_flash_query_rows((force > 0).then_some(force));
                    let what = format!("{what}, {shape}");
                    // The separate ops on split buffers.
                    let [qg, k, v] = input.split(rows, dims);
                    let (mut qg_d, mut k_d, v_d) = (
                        padded(&gpu, &qg, 0, 0.0),
                        padded(&gpu, &k, 0, 0.0),
                        padded(&gpu, &v, 0, 0.0),
                    );
                    let q_layout = HeadLayout {
                        head_stride: 2 * dims.head_dim,
                        row_stride: 2 * width,
                        ..HeadLayout::dense(dims.q_heads, dims.head_dim)
                    };
                    gpu.qk_norm_rope(
                        (&mut qg_d, &qn_d, q_layout),
                        (
                            &mut k_d,
                            &kn_d,
                            HeadLayout::dense(dims.kv_heads, dims.head_dim),
                        ),
                        &pos_d,
                        rows,
                        &input.rope,
                        eps,
                    )
                    .unwrap();
                    let mut sep = gpu.alloc(out_len).unwrap();
                    if last {
                        gpu.attention_last(&qg_d, &k_d, &v_d, batch, dims, &mut sep)
                    } else {
                        gpu.attention(&qg_d, &k_d, &v_d, batch, dims, &mut sep)
                    }
                    .unwrap();
                    let want = gpu.read(&sep, out_len).unwrap();
                    // Fused, into f32 and into a bf16 GEMM input, each with a spare row that must
                    // stay untouched.
                    for bf16_out in [false, true] {
                        let mut qkv_d = padded(&gpu, &input.qkv, 0, 0.0);
                        let mut out = if bf16_out {
                            gpu.alloc_gemm_input(out_len + width).unwrap()
                        } else {
                            gpu.alloc(out_len + width).unwrap()
                        };
                        gpu.write(&mut out, &vec![7.0; out_len + width]).unwrap();
                        gpu.gated_attention(
                            &mut qkv_d,
                            QkPrologue {
                                q_norm: &qn_d,
                                k_norm: &kn_d,
                                positions: &pos_d,
                                rope: &input.rope,
                                eps,
                            },
                            batch,
                            dims,
                            last,
                            &mut out,
                        )
                        .unwrap();
                        let got = gpu.read(&out, out_len + width).unwrap();
                        assert!(
                            got[out_len..].iter().all(|&x| x == 7.0),
                            "{what}: wrote past the output rows"
                        );
                        let got = &got[..out_len];
                        let expect = if bf16_out {
                            bf16_round(&want)
                        } else {
                            want.clone()
                        };
                        let mismatch = got
                            .iter()
                            .zip(&expect)
                            .position(|(g, w)| g.to_bits() != w.to_bits());
                        assert!(
                            mismatch.is_none(),
                            "{what}, bf16 out {bf16_out}: value {mismatch:?} differs from the \
                             separate ops"
                        );
                    }
                    assert_close(&want, &want_cpu, FLASH_TOL, dims, &what);
                }
                CudaBackend::force_flash_query_rows(None);
            }
        }
    }
    // Shapes the fused path does not take are refused, not run wrong.
    let odd = AttentionDims {
        head_dim: 100,
        ..small
    };
    let mut qkv = gpu.alloc(odd.stacked_width()).unwrap();
    let mut out = gpu.alloc(odd.q_heads * odd.head_dim).unwrap();
    let (n, cu_d, pos_d) = (
        gpu.upload(&vec![0.0; 100]).unwrap(),
        indices(&gpu, &[0, 1]),
        indices(&gpu, &[0, 0, 0]),
    );
    let batch = Varlen {
        cu_seqlens: &cu_d,
        num_seqs: 1,
        rows: 1,
    };
    let rope = Stacked::new(&mut rng, 1, small, 48).rope;
    let err = gpu
        .gated_attention(
            &mut qkv,
            QkPrologue {
                q_norm: &n,
                k_norm: &n,
                positions: &pos_d,
                rope: &rope,
                eps,
            },
            batch,
            odd,
            false,
            &mut out,
        )
        .unwrap_err();
    assert!(err.to_string().contains("head_dim"), "{err}");
}

/// Causal attention FLOPs: QKᵀ and PV, 2 FLOPs per multiply-add, over the lower triangle.
fn causal_flops(lens: &[usize], dims: AttentionDims) -> f64 {
    let pairs: f64 = lens.iter().map(|&l| (l as f64) * (l as f64) / 2.0).sum();
    4.0 * pairs * dims.head_dim as f64 * dims.q_heads as f64
}

/// Mean seconds of one `attention` call (or `attention_last` with `last`) over 20 back-to-back
/// calls, after 3 untimed ones.
fn time_attention(
    gpu: &CudaBackend,
    rng: &mut StdRng,
    lens: &[usize],
    dims: AttentionDims,
    last: bool,
) -> f64 {
    let rows: usize = lens.iter().sum();
    let inputs = Inputs::new(rng, rows, dims, 2.0);
    let qg = padded(gpu, &inputs.qg, 0, 0.0);
    let k = padded(gpu, &inputs.k, 0, 0.0);
    let v = padded(gpu, &inputs.v, 0, 0.0);
    let cu_d = indices(gpu, &cu_of(lens));
    let out_rows = if last { lens.len() } else { rows };
    let mut out = gpu.alloc(out_rows * dims.q_heads * dims.head_dim).unwrap();
    let batch = Varlen {
        cu_seqlens: &cu_d,
        num_seqs: lens.len(),
        rows,
    };
    let call = |out: &mut CudaBuf| {
        if last {
            gpu.attention_last(&qg, &k, &v, batch, dims, out).unwrap();
        } else {
            gpu.attention(&qg, &k, &v, batch, dims, out).unwrap();
        }
    };
    for _ in 0..3 {
        call(&mut out);
    }
    gpu.synchronize().unwrap();
    let iters = 20;
    let t = Instant::now();
    for _ in 0..iters {
        call(&mut out);
    }
    gpu.synchronize().unwrap();
    let sample = gpu.read(&out, 16).unwrap();
    assert!(sample.iter().all(|x| x.is_finite()));
    t.elapsed().as_secs_f64() / f64::from(iters)
}

#[test]
#[ignore = "needs a GPU; prints timings"]
fn flash_attention_throughput() {
    let gpu = gpu();
    let mut rng = StdRng::seed_from_u64(26);
    let cases: [(&str, Vec<usize>); 4] = [
        ("1 x 15,446", vec![15_446]),
        ("1 x 139", vec![139]),
        ("1 x 712", vec![712]),
        ("128 x 300", vec![300; 128]),
    ];
    for (name, lens) in &cases {
        let dims = REAL;
        let flops = causal_flops(lens, dims);
        // The automatic choice, then each shape forced.
        let secs = time_attention(&gpu, &mut rng, lens, dims, false);
        eprintln!(
            "flash attention {name}: {:.3} ms, {:.1} TFLOP/s",
            secs * 1e3,
            flops / secs / 1e12
        );
        for_each_shape(|shape| {
            let secs = time_attention(&gpu, &mut rng, lens, dims, false);
            eprintln!(
                "    {shape:>6} {name}: {:.3} ms, {:.1} TFLOP/s",
                secs * 1e3,
                flops / secs / 1e12
            );
        });
        let secs = time_attention(&gpu, &mut rng, lens, dims, true);
        eprintln!("    last rows only {name}: {:.3} ms", secs * 1e3);
    }
}
