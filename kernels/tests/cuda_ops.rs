//! Every CUDA op against the CPU reference backend on random inputs: ragged packed batches,
//! sequences of length 1 and lengths that are not multiples of 64.
//!
//! These need a GPU, the driver and the CUDA 13 toolkit (headers + NVRTC, found through
//! `INSTINCT_CUDA_HOME` / `CUDA_HOME` / `/usr/local/cuda`), so every test is ignored; run them on
//! the GPU machine with `cargo test -p instinct-kernels --test cuda_ops -- --ignored`.
//!
//! Weights are rounded to bf16 before the CPU sees them, since the CUDA backend stores uploaded
//! weights in bf16: both backends then compute with the same numbers and differ only by f32
//! summation order and the device's math functions.

mod common;
use common::{
    activation, activation_as, bf16_activation, bf16_round, cpu_gates, cu_of, gpu, indices,
    rand_vec,
};

use instinct_kernels::cuda::{CudaBackend, CudaBuf, CudaOptions, DType};
use instinct_kernels::{
    AttentionDims, Backend, CpuBackend, DeltaDims, DeltaGates, DeltaState, HeadLayout, KernelError,
    Rope, Store, Strided, Varlen,
};
use instinct_kernels::{
    Conv1d, ConvWindow, DeltaInputs, DeltaNetInput, DeltaNetScratch, GateOutputs, GatedNorm,
    GemmShape, L2Heads, Projection, RowNorm,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Packed batches every varlen op runs on.
const BATCHES: &[&[usize]] = &[&[1], &[70], &[1, 64, 3, 129], &[200, 1, 65, 2]];

/// A random weight: the bf16-exact host copy (for the CPU) and its upload.
fn weight(gpu: &CudaBackend, rng: &mut StdRng, n: usize, scale: f32) -> (Vec<f32>, CudaBuf) {
    let host = bf16_round(&rand_vec(rng, n, scale));
    let dev = gpu.upload(&host).unwrap();
    (host, dev)
}

/// `data` (`rows` rows of `width`) placed at `at` in a buffer of `at.required_len(rows, width)`
/// values whose other slots hold NaN, so a read outside the rows shows up in the result.
fn strided(data: &[f32], rows: usize, width: usize, at: Strided) -> Vec<f32> {
    let mut buf = vec![f32::NAN; at.required_len(rows, width)];
    for t in 0..rows {
        buf[at.at(t, 0)..][..width].copy_from_slice(&data[t * width..(t + 1) * width]);
    }
    buf
}

/// The operand layouts strided reads are tested with: dense, and a block of a wider row (as in
/// the stacked DeltaNet in-projection output) at an odd offset.
fn layouts(width: usize) -> [Strided; 2] {
    [Strided::dense(width), Strided::cols(width + 13, 5)]
}

/// The bit patterns of `v`, for results that must match exactly (NaNs included).
fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[track_caller]
fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let bound = tol * (1.0 + w.abs());
        assert!(
            (g - w).abs() <= bound,
            "{what}: index {i}: cuda {g} vs cpu {w} (tolerance {bound})"
        );
    }
}

#[test]
#[ignore = "needs a GPU"]
fn start_up_compiles_then_reuses_the_disk_cache() {
    let dir = std::env::temp_dir().join(format!("instinct-cuda-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let options = CudaOptions {
        cache_dir: Some(dir.clone()),
        ..CudaOptions::default()
    };
    let first = CudaBackend::new(options.clone()).unwrap();
    let entries = || {
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        names
    };
    let after_first = entries();
    assert_eq!(
        after_first.len(),
        instinct_kernels::cuda::KERNEL_SOURCES.len(),
        "one cached CUBIN per kernel file: {after_first:?}"
    );
    drop(first);
    let second = CudaBackend::new(options).unwrap();
    assert_eq!(
        entries(),
        after_first,
        "a warm start must not write new entries"
    );
    assert_eq!(
        second.arch(),
        instinct_kernels::cuda::GpuArch::SM_90,
        "H200 is sm_90"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[ignore = "needs a GPU"]
fn memory_round_trips_and_weights_are_bf16() {
    let gpu = gpu();
    let data = [1.0f32, -2.5, 3.25, 1.0 + 1.0 / 1024.0];
    let act = activation(&gpu, &data, 3);
    assert_eq!(gpu.read(&act, 4).unwrap(), data);
    assert_eq!(gpu.read(&act, 7).unwrap()[4..], [0.0; 3]);
    let w = gpu.upload(&data).unwrap();
    // 1 + 2^-10 is not a bf16 value (8 significant bits): the upload rounds it.
    assert_eq!(gpu.read(&w, 4).unwrap(), bf16_round(&data));
    assert!(gpu.read(&act, 8).is_err());
}

#[test]
#[ignore = "needs a GPU"]
fn ops_reject_an_activation_where_a_weight_belongs() {
    let gpu = gpu();
    let x = activation(&gpu, &[1.0; 8], 0);
    let not_a_weight = activation(&gpu, &[0.0; 4], 0);
    let mut out = gpu.alloc(8).unwrap();
    let err = gpu
        .rms_norm(
            &x,
            RowNorm {
                weight: &not_a_weight,
                rows: 2,
                dim: 4,
                eps: 1e-6,
            },
            &mut out,
        )
        .unwrap_err();
    assert!(
        matches!(err, KernelError::Invalid { op: "rms_norm", .. }),
        "{err}"
    );
}

#[test]
#[ignore = "needs a GPU"]
fn embedding_matches_cpu() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = StdRng::seed_from_u64(1);
    let (vocab, dim) = (1000, 160);
    let (table_h, table_d) = weight(&gpu, &mut rng, vocab * dim, 1.0);
    for rows in [1, 63, 257] {
        let ids: Vec<u32> = (0..rows).map(|_| rng.gen_range(0..vocab as u32)).collect();
        let mut want = vec![0.0; rows * dim];
        cpu.embedding(&table_h, vocab, &ids, rows, dim, &mut want)
            .unwrap();
        let ids_d = indices(&gpu, &ids);
        let mut out = gpu.alloc(rows * dim + 5).unwrap();
        gpu.embedding(&table_d, vocab, &ids_d, rows, dim, &mut out)
            .unwrap();
        // A gather: exact.
        assert_eq!(gpu.read(&out, rows * dim).unwrap(), want, "rows {rows}");
    }
}

#[test]
#[ignore = "needs a GPU"]
fn rms_norm_and_fused_add_match_cpu() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = StdRng::seed_from_u64(2);
    // Up to 4,096 values the kernels hold the row in registers (4, 8, 12 or 16 per thread: 101,
    // 1,500, 2,560, 3,500); 5,000 takes the plain loops.
    for (rows, dim) in [
        (1, 2560),
        (65, 2560),
        (7, 100),
        (5, 101),
        (3, 1500),
        (2, 3500),
        (2, 5000),
    ] {
        let x = rand_vec(&mut rng, rows * dim, 2.0);
        let delta = rand_vec(&mut rng, rows * dim, 1.0);
        let (w_h, w_d) = weight(&gpu, &mut rng, dim, 0.5);

        let mut want = vec![0.0; rows * dim];
        cpu.rms_norm(
            &x,
            RowNorm {
                weight: &w_h,
                rows,
                dim,
                eps: 1e-6,
            },
            &mut want,
        )
        .unwrap();
        let x_d = activation(&gpu, &x, 0);
        let mut out = gpu.alloc(rows * dim).unwrap();
        gpu.rms_norm(
            &x_d,
            RowNorm {
                weight: &w_d,
                rows,
                dim,
                eps: 1e-6,
            },
            &mut out,
        )
        .unwrap();
        assert_close(
            &gpu.read(&out, rows * dim).unwrap(),
            &want,
            1e-5,
            "rms_norm",
        );

        let mut residual_h = x.clone();
        cpu.add_rms_norm(
            &mut residual_h,
            &delta,
            RowNorm {
                weight: &w_h,
                rows,
                dim,
                eps: 1e-6,
            },
            &mut want,
        )
        .unwrap();
        let mut residual_d = activation(&gpu, &x, 0);
        let delta_d = activation(&gpu, &delta, 0);
        gpu.add_rms_norm(
            &mut residual_d,
            &delta_d,
            RowNorm {
                weight: &w_d,
                rows,
                dim,
                eps: 1e-6,
            },
            &mut out,
        )
        .unwrap();
        assert_close(
            &gpu.read(&residual_d, rows * dim).unwrap(),
            &residual_h,
            1e-6,
            "add_rms_norm residual",
        );
        assert_close(
            &gpu.read(&out, rows * dim).unwrap(),
            &want,
            1e-5,
            "add_rms_norm out",
        );

        // Into a GEMM-input buffer (bf16 on the GPU): the same values, rounded once.
        let mut out_bf16 = gpu.alloc_gemm_input(rows * dim).unwrap();
        assert_eq!(out_bf16.dtype(), DType::Bf16);
        let mut residual_d = activation(&gpu, &x, 0);
        gpu.add_rms_norm(
            &mut residual_d,
            &delta_d,
            RowNorm {
                weight: &w_d,
                rows,
                dim,
                eps: 1e-6,
            },
            &mut out_bf16,
        )
        .unwrap();
        let got = gpu.read(&out_bf16, rows * dim).unwrap();
        assert_close(&got, &bf16_round(&want), 8e-3, "add_rms_norm bf16 out");
        gpu.rms_norm(
            &x_d,
            RowNorm {
                weight: &w_d,
                rows,
                dim,
                eps: 1e-6,
            },
            &mut out_bf16,
        )
        .unwrap();
        cpu.rms_norm(
            &x,
            RowNorm {
                weight: &w_h,
                rows,
                dim,
                eps: 1e-6,
            },
            &mut want,
        )
        .unwrap();
        let got = gpu.read(&out_bf16, rows * dim).unwrap();
        assert_close(&got, &bf16_round(&want), 8e-3, "rms_norm bf16 out");
        // A GEMM reads it as is.
        let (w2_h, w2_d) = weight(&gpu, &mut rng, 8 * dim, 0.1);
        let mut y = gpu.alloc(rows * 8).unwrap();
        gpu.gemm(&out_bf16, &w2_d, GemmShape::new(rows, dim, 8), &mut y)
            .unwrap();
        let mut y_want = vec![0.0; rows * 8];
        cpu.gemm(&got, &w2_h, GemmShape::new(rows, dim, 8), &mut y_want)
            .unwrap();
        assert_close(
            &gpu.read(&y, rows * 8).unwrap(),
            &y_want,
            1e-4,
            "gemm of bf16 x",
        );
    }
}

#[test]
#[ignore = "needs a GPU"]
fn gated_rms_norm_matches_cpu() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = StdRng::seed_from_u64(3);
    let (rows, heads, dim) = (3, 32, 128);
    let n = rows * heads * dim;
    let x = rand_vec(&mut rng, n, 2.0);
    let z = rand_vec(&mut rng, n, 3.0);
    let (w_h, w_d) = weight(&gpu, &mut rng, dim, 1.0);
    // z in f32, and in bf16 (the stacked in-projection held in bf16) against the CPU on the
    // rounded z.
    for bf16_z in [false, true] {
        let z = if bf16_z { bf16_round(&z) } else { z.clone() };
        let mut want = x.clone();
        cpu.gated_rms_norm(
            &mut want,
            GatedNorm {
                z: &z,
                z_at: Strided::dense(heads * dim),
                weight: &w_h,
                rows,
                heads,
                dim,
                eps: 1e-6,
            },
        )
        .unwrap();
        for z_at in layouts(heads * dim) {
            let mut x_d = activation(&gpu, &x, 0);
            let z_d = activation_as(&gpu, &strided(&z, rows, heads * dim, z_at), 0, bf16_z);
            gpu.gated_rms_norm(
                &mut x_d,
                GatedNorm {
                    z: &z_d,
                    z_at,
                    weight: &w_d,
                    rows,
                    heads,
                    dim,
                    eps: 1e-6,
                },
            )
            .unwrap();
            assert_close(
                &gpu.read(&x_d, n).unwrap(),
                &want,
                1e-5,
                &format!("gated_rms_norm z at {z_at:?} bf16 {bf16_z}"),
            );
        }
    }
}

/// The query slots of a Qwen3.5 `qg` row (query and gate interleaved per head) and a dense k row.
/// The gated norm fed straight into the out projection (bf16 on the way) against the CPU's gated
/// norm, rounded to bf16, then its GEMM.
#[test]
#[ignore = "needs a GPU"]
fn gated_rms_norm_gemm_matches_cpu() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = StdRng::seed_from_u64(12);
    for (rows, heads, dim, out_dim) in [(1, 32, 128, 2560), (139, 32, 128, 256), (5, 3, 7, 4)] {
        let n = rows * heads * dim;
        let x = rand_vec(&mut rng, n, 2.0);
        let z = rand_vec(&mut rng, n, 3.0);
        let (nw_h, nw_d) = weight(&gpu, &mut rng, dim, 1.0);
        let (w_h, w_d) = weight(&gpu, &mut rng, out_dim * heads * dim, 0.05);
        let in_dim = heads * dim;
        let mut normed = x.clone();
        cpu.gated_rms_norm(
            &mut normed,
            GatedNorm {
                z: &z,
                z_at: Strided::dense(in_dim),
                weight: &nw_h,
                rows,
                heads,
                dim,
                eps: 1e-6,
            },
        )
        .unwrap();
        let bf16_path = in_dim % 8 == 0;
        let g = if bf16_path {
            bf16_round(&normed)
        } else {
            normed
        };
        let mut want = vec![0.0; rows * out_dim];
        cpu.gemm(&g, &w_h, GemmShape::new(rows, in_dim, out_dim), &mut want)
            .unwrap();
        // Added to, the output starts from values of the size of a residual stream.
        let y0 = rand_vec(&mut rng, rows * out_dim, 1.0);
        let want_added: Vec<f32> = y0.iter().zip(&want).map(|(a, b)| a + b).collect();
        for (z_at, store) in layouts(in_dim)
            .into_iter()
            .zip([Store::Replace, Store::Add])
        {
            let mut x_d = activation(&gpu, &x, 0);
            let z_d = activation(&gpu, &strided(&z, rows, in_dim, z_at), 0);
            let mut y = activation(&gpu, &y0, 0);
            gpu.gated_rms_norm_gemm(
                &mut x_d,
                GatedNorm {
                    z: &z_d,
                    z_at,
                    weight: &nw_d,
                    rows,
                    heads,
                    dim,
                    eps: 1e-6,
                },
                Projection {
                    w: &w_d,
                    out_dim,
                    store,
                },
                &mut y,
            )
            .unwrap();
            let what = format!(
                "gated_rms_norm_gemm {rows}x{heads}x{dim}x{out_dim} z at {z_at:?} {store:?}"
            );
            let want = if store == Store::Add {
                &want_added
            } else {
                &want
            };
            // An f32 ulp can flip one bf16 rounding: allow a few such flips.
            assert_close(&gpu.read(&y, rows * out_dim).unwrap(), want, 1e-3, &what);
        }
        // A z one value short of its last row is refused.
        let z_at = layouts(in_dim)[1];
        let short = strided(&z, rows, in_dim, z_at);
        let z_d = activation(&gpu, &short[..short.len() - 1], 0);
        let mut x_d = activation(&gpu, &x, 0);
        let mut y = gpu.alloc(rows * out_dim).unwrap();
        let err = gpu
            .gated_rms_norm_gemm(
                &mut x_d,
                GatedNorm {
                    z: &z_d,
                    z_at,
                    weight: &nw_d,
                    rows,
                    heads,
                    dim,
                    eps: 1e-6,
                },
                Projection {
                    w: &w_d,
                    out_dim,
                    store: Store::Replace,
                },
                &mut y,
            )
            .unwrap_err();
        assert!(matches!(err, KernelError::Invalid { .. }), "{err}");
    }
}

fn head_layouts() -> [HeadLayout; 4] {
    let (heads, head_dim) = (4, 256);
    [
        HeadLayout {
            heads,
            head_dim,
            head_stride: 2 * head_dim,
            row_stride: 2 * heads * head_dim,
            offset: 0,
        },
        HeadLayout::dense(2, head_dim),
        // Unaligned heads.
        HeadLayout {
            heads: 3,
            head_dim: 100,
            head_stride: 101,
            row_stride: 310,
            offset: 1,
        },
        // Longer than the 512 values a warp holds in registers: the plain loops.
        HeadLayout::dense(1, 600),
    ]
}

#[test]
#[ignore = "needs a GPU"]
fn head_rms_norm_and_l2_norm_match_cpu_and_leave_other_slots_alone() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = StdRng::seed_from_u64(4);
    for layout in head_layouts() {
        for rows in [1, 70] {
            let len = layout.required_len(rows);
            let x = rand_vec(&mut rng, len, 2.0);
            let (w_h, w_d) = weight(&gpu, &mut rng, layout.head_dim, 0.5);

            let mut want = x.clone();
            cpu.head_rms_norm(&mut want, &w_h, layout, rows, 1e-6)
                .unwrap();
            let mut x_d = activation(&gpu, &x, 0);
            gpu.head_rms_norm(&mut x_d, &w_d, layout, rows, 1e-6)
                .unwrap();
            // Whole buffer: the gate slots must come back untouched.
            assert_close(&gpu.read(&x_d, len).unwrap(), &want, 1e-5, "head_rms_norm");

            let mut want = x.clone();
            cpu.l2_norm(&mut want, layout, rows, 1e-6).unwrap();
            let mut x_d = activation(&gpu, &x, 0);
            gpu.l2_norm(&mut x_d, layout, rows, 1e-6).unwrap();
            assert_close(&gpu.read(&x_d, len).unwrap(), &want, 1e-5, "l2_norm");
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn rope_matches_cpu_for_text_and_multi_axis_positions() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = StdRng::seed_from_u64(5);
    let rope = Rope {
        rotary_dim: 64,
        theta: 10_000_000.0,
        section: [11, 11, 10],
        interleaved: true,
    };
    for layout in head_layouts() {
        for rows in [1, 130] {
            let len = layout.required_len(rows);
            let x = rand_vec(&mut rng, len, 1.0);
            for text in [true, false] {
                let positions: Vec<u32> = (0..rows)
                    .flat_map(|t| {
                        let p = 3000 + t as u32;
                        if text {
                            [p, p, p]
                        } else {
                            [p, rng.gen_range(0..40), rng.gen_range(0..40)]
                        }
                    })
                    .collect();
                let mut want = x.clone();
                cpu.rope(&mut want, layout, &positions, rows, &rope)
                    .unwrap();
                let mut x_d = activation(&gpu, &x, 0);
                let pos_d = indices(&gpu, &positions);
                gpu.rope(&mut x_d, layout, &pos_d, rows, &rope).unwrap();
                assert_close(&gpu.read(&x_d, len).unwrap(), &want, 1e-5, "rope");
            }
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn qk_norm_rope_is_the_four_kernels_bit_for_bit() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = StdRng::seed_from_u64(17);
    // The model's shapes (q heads interleaved with their gates, dense k), and heads of 100 with 32
    // or 48 rotary pairs (a lane rotating two pairs).
    let cases = [(16, 4, 256, 64), (3, 2, 100, 64), (3, 2, 100, 96)];
    for (q_heads, k_heads, head_dim, rotary_dim) in cases {
        let rope = Rope {
            rotary_dim,
            theta: 10_000_000.0,
            section: [11, 11, 10],
            interleaved: true,
        };
        let q_layout = HeadLayout {
            heads: q_heads,
            head_dim,
            head_stride: 2 * head_dim,
            row_stride: 2 * q_heads * head_dim,
            offset: 0,
        };
        let k_layout = HeadLayout::dense(k_heads, head_dim);
        let (qw_h, qw_d) = weight(&gpu, &mut rng, head_dim, 0.5);
        let (kw_h, kw_d) = weight(&gpu, &mut rng, head_dim, 0.5);
        for rows in [1, 130] {
            let what = format!(
                "{q_heads}+{k_heads} heads of {head_dim}, rotary {rotary_dim}, {rows} rows"
            );
            let q_len = q_layout.required_len(rows);
            let k_len = k_layout.required_len(rows);
            let q = rand_vec(&mut rng, q_len, 2.0);
            let k = rand_vec(&mut rng, k_len, 2.0);
            let positions: Vec<u32> = (0..rows as u32)
                .flat_map(|t| [3000 + t, rng.gen_range(0..40), rng.gen_range(0..40)])
                .collect();
            let pos_d = indices(&gpu, &positions);
            let (mut q_f, mut k_f) = (activation(&gpu, &q, 0), activation(&gpu, &k, 0));
            gpu.qk_norm_rope(
                (&mut q_f, &qw_d, q_layout),
                (&mut k_f, &kw_d, k_layout),
                &pos_d,
                rows,
                &rope,
                1e-6,
            )
            .unwrap();
            let (mut q_s, mut k_s) = (activation(&gpu, &q, 0), activation(&gpu, &k, 0));
            gpu.head_rms_norm(&mut q_s, &qw_d, q_layout, rows, 1e-6)
                .unwrap();
            gpu.head_rms_norm(&mut k_s, &kw_d, k_layout, rows, 1e-6)
                .unwrap();
            gpu.rope(&mut q_s, q_layout, &pos_d, rows, &rope).unwrap();
            gpu.rope(&mut k_s, k_layout, &pos_d, rows, &rope).unwrap();
            let (q_got, k_got) = (
                gpu.read(&q_f, q_len).unwrap(),
                gpu.read(&k_f, k_len).unwrap(),
            );
            assert_eq!(
                bits(&q_got),
                bits(&gpu.read(&q_s, q_len).unwrap()),
                "{what}: q"
            );
            assert_eq!(
                bits(&k_got),
                bits(&gpu.read(&k_s, k_len).unwrap()),
                "{what}: k"
            );

            let (mut q_want, mut k_want) = (q.clone(), k.clone());
            cpu.qk_norm_rope(
                (&mut q_want, &qw_h, q_layout),
                (&mut k_want, &kw_h, k_layout),
                &positions,
                rows,
                &rope,
                1e-6,
            )
            .unwrap();
            assert_close(&q_got, &q_want, 1e-4, &what);
            assert_close(&k_got, &k_want, 1e-4, &what);
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn conv1d_silu_matches_cpu_with_and_without_carried_window() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = StdRng::seed_from_u64(6);
    // Kernel 4 is the model's; 1 (no history) and 2 check the window bookkeeping's edges. 300
    // channels leave a partial block of channels.
    // x is read dense and as a column block of wider rows (the stacked in-projection output).
    // x also comes in bf16 (the stacked in-projection held in bf16), against the CPU on the
    // rounded values.
    for (channels, kernel) in [(96, 4), (300, 1), (40, 2)] {
        for x_at in layouts(channels) {
            for bf16_x in [false, true] {
                conv1d_case(&gpu, &cpu, &mut rng, channels, kernel, x_at, bf16_x);
            }
        }
    }
}

fn conv1d_case(
    gpu: &CudaBackend,
    cpu: &CpuBackend,
    rng: &mut StdRng,
    channels: usize,
    kernel: usize,
    x_at: Strided,
    bf16_x: bool,
) {
    let (w_h, w_d) = weight(gpu, rng, channels * kernel, 0.7);
    for lens in BATCHES {
        let cu = cu_of(lens);
        let rows = *cu.last().unwrap() as usize;
        let win_len = lens.len() * (kernel - 1) * channels;
        let x = rand_vec(rng, rows * channels, 2.0);
        let window = rand_vec(rng, win_len, 2.0);
        // One spare row of zeros past the last: the kernel must stop at `rows` anyway.
        let x = if bf16_x { bf16_round(&x) } else { x };
        let x_d = activation_as(
            gpu,
            &strided(&x, rows, channels, x_at),
            x_at.row_stride,
            bf16_x,
        );
        let cu_d = indices(gpu, &cu);
        let window_d = activation(gpu, &window, 0);
        for with_window in [false, true] {
            let cpu_batch = Varlen {
                cu_seqlens: &cu,
                num_seqs: lens.len(),
                rows,
            };
            let mut want = vec![0.0; rows * channels];
            let mut want_window = vec![0.0; win_len];
            cpu.conv1d_silu(
                Conv1d {
                    x: &x,
                    x_at: Strided::dense(channels),
                    weight: &w_h,
                    channels,
                    kernel,
                },
                cpu_batch,
                ConvWindow {
                    input: with_window.then_some(&window),
                    output: Some(&mut want_window),
                    output_at: None,
                },
                &mut want,
            )
            .unwrap();

            let gpu_batch = Varlen {
                cu_seqlens: &cu_d,
                num_seqs: lens.len(),
                rows,
            };
            let mut out = gpu.alloc(rows * channels).unwrap();
            let mut window_out = gpu.alloc(win_len).unwrap();
            gpu.conv1d_silu(
                Conv1d {
                    x: &x_d,
                    x_at,
                    weight: &w_d,
                    channels,
                    kernel,
                },
                gpu_batch,
                ConvWindow {
                    input: with_window.then_some(&window_d),
                    output: Some(&mut window_out),
                    output_at: None,
                },
                &mut out,
            )
            .unwrap();
            let what =
                format!("conv lens {lens:?} window {with_window} x at {x_at:?} bf16 {bf16_x}");
            assert_close(
                &gpu.read(&out, rows * channels).unwrap(),
                &want,
                1e-5,
                &what,
            );
            assert_eq!(
                gpu.read(&window_out, win_len).unwrap(),
                want_window,
                "{what}: window"
            );
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn conv1d_silu_l2_is_conv_then_l2_bit_for_bit() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = StdRng::seed_from_u64(16);
    // DeltaNet's layout (q and k heads of 128 first, then v) is fused into the conv kernel; heads
    // of 64 take the two-kernel path. Both must give exactly conv1d_silu then l2_norm.
    for (k_heads, k_dim, v_width) in [(2, 128, 256), (3, 64, 100)] {
        let channels = 2 * k_heads * k_dim + v_width;
        let l2 = HeadLayout {
            heads: 2 * k_heads,
            head_dim: k_dim,
            head_stride: k_dim,
            row_stride: channels,
            offset: 0,
        };
        let (w_h, w_d) = weight(&gpu, &mut rng, channels * 4, 0.7);
        for lens in BATCHES {
            let cu = cu_of(lens);
            let rows = *cu.last().unwrap() as usize;
            let x = rand_vec(&mut rng, rows * channels, 2.0);
            let cu_d = indices(&gpu, &cu);
            for (x_at, bf16_x) in layouts(channels)
                .into_iter()
                .flat_map(|at| [(at, false), (at, true)])
            {
                let what =
                    format!("heads {k_heads}x{k_dim} lens {lens:?} x at {x_at:?} bf16 {bf16_x}");
                let x = if bf16_x { bf16_round(&x) } else { x.clone() };
                let x_d = activation_as(
                    &gpu,
                    &strided(&x, rows, channels, x_at),
                    x_at.row_stride,
                    bf16_x,
                );
                let batch = Varlen {
                    cu_seqlens: &cu_d,
                    num_seqs: lens.len(),
                    rows,
                };
                let mut fused = gpu.alloc(rows * channels).unwrap();
                let conv = Conv1d {
                    x: &x_d,
                    x_at,
                    weight: &w_d,
                    channels,
                    kernel: 4,
                };
                gpu.conv1d_silu_l2(
                    conv,
                    batch,
                    L2Heads {
                        layout: l2,
                        eps: 1e-6,
                    },
                    &mut fused,
                )
                .unwrap();
                let mut apart = gpu.alloc(rows * channels).unwrap();
                gpu.conv1d_silu(conv, batch, ConvWindow::none(), &mut apart)
                    .unwrap();
                gpu.l2_norm(&mut apart, l2, rows, 1e-6).unwrap();
                let got = gpu.read(&fused, rows * channels).unwrap();
                assert_eq!(
                    bits(&got),
                    bits(&gpu.read(&apart, rows * channels).unwrap()),
                    "{what}: fused vs two kernels"
                );

                let cpu_batch = Varlen {
                    cu_seqlens: &cu,
                    num_seqs: lens.len(),
                    rows,
                };
                let mut want = vec![0.0; rows * channels];
                cpu.conv1d_silu_l2(
                    Conv1d {
                        x: &x,
                        x_at: Strided::dense(channels),
                        weight: &w_h,
                        channels,
                        kernel: 4,
                    },
                    cpu_batch,
                    L2Heads {
                        layout: l2,
                        eps: 1e-6,
                    },
                    &mut want,
                )
                .unwrap();
                assert_close(&got, &want, 1e-5, &what);
            }
        }
    }
}

/// `conv1d_silu_l2_gates` against `conv1d_silu_l2` then `delta_gates`, bit for bit: one stacked
/// in-projection row `[qkv | b | a]` as the model has it (bf16 and f32), DeltaNet's layout (the
/// conv kernel computes the gates) and heads of 64 (the separate kernels), the model's 32 gate
/// heads and 5; and b, a in a separate buffer of the other type (the separate kernels too).
#[test]
#[ignore = "needs a GPU"]
fn conv1d_silu_l2_gates_is_the_conv_and_the_gates_bit_for_bit() {
    let gpu = gpu();
    let mut rng = StdRng::seed_from_u64(23);
    for (k_heads, k_dim, v_width, heads) in [(2, 128, 256, 32), (3, 64, 100, 5)] {
        let channels = 2 * k_heads * k_dim + v_width;
        let l2 = HeadLayout {
            heads: 2 * k_heads,
            head_dim: k_dim,
            head_stride: k_dim,
            row_stride: channels,
            offset: 0,
        };
        let width = channels + 2 * heads;
        let [x_at, b_at, a_at] = [0, channels, channels + heads].map(|o| Strided::cols(width, o));
        let (_, w_d) = weight(&gpu, &mut rng, channels * 4, 0.7);
        let (_, a_log) = weight(&gpu, &mut rng, heads, 2.0);
        let (_, dt_bias) = weight(&gpu, &mut rng, heads, 5.0);
        for lens in BATCHES {
            let cu = cu_of(lens);
            let rows = *cu.last().unwrap() as usize;
            let cu_d = indices(&gpu, &cu);
            let batch = Varlen {
                cu_seqlens: &cu_d,
                num_seqs: lens.len(),
                rows,
            };
            // a + dt_bias on both sides of softplus's threshold.
            let mut stacked = rand_vec(&mut rng, rows * width, 2.0);
            for t in 0..rows {
                for x in &mut stacked[a_at.at(t, 0)..a_at.at(t, heads)] {
                    *x *= 12.0;
                }
            }
            for (bf16_x, separate_gates) in [(false, false), (true, false), (true, true)] {
                let what = format!(
                    "heads {k_heads}x{k_dim}, {heads} gate heads, lens {lens:?}, bf16 {bf16_x}, \
                     gates apart {separate_gates}"
                );
                let x_d = activation_as(&gpu, &stacked, 0, bf16_x);
                let other = activation_as(&gpu, &stacked, 0, !bf16_x);
                let gates_in = if separate_gates { &other } else { &x_d };
                let gates = DeltaGates {
                    b: gates_in,
                    b_at,
                    a: gates_in,
                    a_at,
                    a_log: &a_log,
                    dt_bias: &dt_bias,
                    heads,
                };
                let conv = Conv1d {
                    x: &x_d,
                    x_at,
                    weight: &w_d,
                    channels,
                    kernel: 4,
                };
                let l2_heads = L2Heads {
                    layout: l2,
                    eps: 1e-6,
                };
                let n = rows * heads;
                let (mut out, mut beta, mut g) = (
                    gpu.alloc(rows * channels).unwrap(),
                    gpu.alloc(n).unwrap(),
                    gpu.alloc(n).unwrap(),
                );
                gpu.conv1d_silu_l2_gates(
                    conv,
                    batch,
                    l2_heads,
                    &mut out,
                    gates,
                    GateOutputs {
                        beta: &mut beta,
                        g: &mut g,
                    },
                )
                .unwrap();
                let (mut out2, mut beta2, mut g2) = (
                    gpu.alloc(rows * channels).unwrap(),
                    gpu.alloc(n).unwrap(),
                    gpu.alloc(n).unwrap(),
                );
                gpu.conv1d_silu_l2(conv, batch, l2_heads, &mut out2)
                    .unwrap();
                gpu.delta_gates(
                    gates,
                    rows,
                    GateOutputs {
                        beta: &mut beta2,
                        g: &mut g2,
                    },
                )
                .unwrap();
                for (name, got, want, len) in [
                    ("conv", &out, &out2, rows * channels),
                    ("beta", &beta, &beta2, n),
                    ("g", &g, &g2, n),
                ] {
                    assert_eq!(
                        bits(&gpu.read(got, len).unwrap()),
                        bits(&gpu.read(want, len).unwrap()),
                        "{what}: {name}"
                    );
                }
            }
        }
    }
}

/// `delta_net_core` on a stacked bf16 projection (q|k|v, then z, b, a, as the model lays it out)
/// against its two ops one after the other: the fused first kernel (`gdr_prepare_conv`) must give
/// the same output bits, and every shape it does not take must fall back to the same answer.
#[test]
#[ignore = "needs a GPU"]
fn delta_net_core_on_the_projection_is_the_conv_then_the_rule_bit_for_bit() {
    let gpu = gpu();
    let cpu = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(29);
    let real = DeltaDims {
        k_heads: 16,
        v_heads: 32,
        k_dim: 128,
        v_dim: 128,
    };
    let narrow = DeltaDims {
        k_heads: 2,
        v_heads: 4,
        k_dim: 64,
        v_dim: 96,
    };
    // (dims, conv taps, extra offset of the q|k|v block): real shape; narrow heads; an odd offset
    // and a 3-tap conv (both the ops apart).
    for (dims, taps, pad) in [(real, 4, 0), (narrow, 4, 0), (narrow, 4, 1), (narrow, 3, 0)] {
        let channels = dims.qkv_width();
        let heads = dims.v_heads;
        let width = pad + channels + dims.v_heads * dims.v_dim + 2 * heads;
        let x_at = Strided::cols(width, pad);
        let [b_at, a_at] = [width - 2 * heads, width - heads].map(|o| Strided::cols(width, o));
        let (w_host, w_d) = weight(&gpu, &mut rng, channels * taps, 0.7);
        let (a_log_host, a_log) = weight(&gpu, &mut rng, heads, 1.0);
        let (dt_host, dt_bias) = weight(&gpu, &mut rng, heads, 2.0);
        let batches: &[&[usize]] = &[&[1], &[712], &[1, 64, 3, 129], &[200, 1, 65, 2]];
        for lens in batches {
            let what = format!("{dims:?}, {taps} taps, offset {pad}, lens {lens:?}");
            let cu = cu_of(lens);
            let rows = *cu.last().unwrap() as usize;
            let cu_d = indices(&gpu, &cu);
            let batch = Varlen {
                cu_seqlens: &cu_d,
                num_seqs: lens.len(),
                rows,
            };
            let stacked = bf16_round(&rand_vec(&mut rng, rows * width, 1.5));
            let x_d = activation_as(&gpu, &stacked, 0, true);
            let gates = DeltaGates {
                b: &x_d,
                b_at,
                a: &x_d,
                a_at,
                a_log: &a_log,
                dt_bias: &dt_bias,
                heads,
            };
            let scratch = |gpu: &CudaBackend| {
                (
                    gpu.alloc(rows * channels).unwrap(),
                    gpu.alloc(rows * heads).unwrap(),
                    gpu.alloc(rows * heads).unwrap(),
                )
            };
            let no_state = || DeltaState {
                initial: None,
                final_out: None,
                final_at: None,
            };
            let out_len = rows * heads * dims.v_dim;
            let (mut conv, mut beta, mut g) = scratch(&gpu);
            let mut fused = gpu.alloc(out_len).unwrap();
            gpu.delta_net_core(
                DeltaNetInput {
                    x: &x_d,
                    x_at,
                    conv_weight: &w_d,
                    kernel: taps,
                    l2_eps: 1e-6,
                    gates,
                },
                batch,
                dims,
                no_state(),
                DeltaNetScratch {
                    conv: &mut conv,
                    beta: &mut beta,
                    g: &mut g,
                },
                &mut fused,
            )
            .unwrap();
            let (mut conv2, mut beta2, mut g2) = scratch(&gpu);
            let mut apart = gpu.alloc(out_len).unwrap();
            gpu.conv1d_silu_l2_gates(
                Conv1d {
                    x: &x_d,
                    x_at,
                    weight: &w_d,
                    channels,
                    kernel: taps,
                },
                batch,
                L2Heads {
                    layout: dims.qk_layout(),
                    eps: 1e-6,
                },
                &mut conv2,
                gates,
                GateOutputs {
                    beta: &mut beta2,
                    g: &mut g2,
                },
            )
            .unwrap();
            gpu.gated_delta_rule_chunked(
                DeltaInputs {
                    qkv: &conv2,
                    beta: &beta2,
                    g: &g2,
                },
                batch,
                dims,
                no_state(),
                &mut apart,
            )
            .unwrap();
            let got = gpu.read(&fused, out_len).unwrap();
            assert_eq!(
                bits(&got),
                bits(&gpu.read(&apart, out_len).unwrap()),
                "{what}"
            );

            // And near the CPU reference of the same ops (bf16 products on the GPU).
            if rows <= 400 {
                let (cb, cw, ca, cd) = (
                    cpu.upload(&stacked).unwrap(),
                    cpu.upload(&w_host).unwrap(),
                    cpu.upload(&a_log_host).unwrap(),
                    cpu.upload(&dt_host).unwrap(),
                );
                let cbatch = Varlen {
                    cu_seqlens: &cu,
                    num_seqs: lens.len(),
                    rows,
                };
                let cgates = DeltaGates {
                    b: &cb,
                    b_at,
                    a: &cb,
                    a_at,
                    a_log: &ca,
                    dt_bias: &cd,
                    heads,
                };
                let (mut c1, mut c2, mut c3, mut cout) = (
                    cpu.alloc(rows * channels).unwrap(),
                    cpu.alloc(rows * heads).unwrap(),
                    cpu.alloc(rows * heads).unwrap(),
                    cpu.alloc(out_len).unwrap(),
                );
                cpu.delta_net_core(
                    DeltaNetInput {
                        x: &cb,
                        x_at,
                        conv_weight: &cw,
                        kernel: taps,
                        l2_eps: 1e-6,
                        gates: cgates,
                    },
                    cbatch,
                    dims,
                    DeltaState {
                        initial: None,
                        final_out: None,
                        final_at: None,
                    },
                    DeltaNetScratch {
                        conv: &mut c1,
                        beta: &mut c2,
                        g: &mut c3,
                    },
                    &mut cout,
                )
                .unwrap();
                let want = cpu.read(&cout, out_len).unwrap();
                let worst = got
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| (a - b).abs() / (1.0 + b.abs()))
                    .fold(0.0f32, f32::max);
                assert!(worst < 2e-2, "{what}: {worst} from the CPU");
            }
        }
    }
    // A projection too short for the batch is an error naming it, not a read past its end.
    let dims = narrow;
    let width = dims.qkv_width() + dims.v_heads * dims.v_dim + 2 * dims.v_heads;
    let cu_d = indices(&gpu, &[0, 10]);
    let short = activation_as(&gpu, &vec![0.0; 9 * width], 0, true);
    let (_, w_d) = weight(&gpu, &mut rng, dims.qkv_width() * 4, 0.7);
    let (_, ab) = weight(&gpu, &mut rng, dims.v_heads, 1.0);
    let h = dims.v_heads;
    let err = gpu
        .delta_net_core(
            DeltaNetInput {
                x: &short,
                x_at: Strided::cols(width, 0),
                conv_weight: &w_d,
                kernel: 4,
                l2_eps: 1e-6,
                gates: DeltaGates {
                    b: &short,
                    b_at: Strided::cols(width, width - 2 * h),
                    a: &short,
                    a_at: Strided::cols(width, width - h),
                    a_log: &ab,
                    dt_bias: &ab,
                    heads: h,
                },
            },
            Varlen {
                cu_seqlens: &cu_d,
                num_seqs: 1,
                rows: 10,
            },
            dims,
            DeltaState {
                initial: None,
                final_out: None,
                final_at: None,
            },
            DeltaNetScratch {
                conv: &mut gpu.alloc(10 * dims.qkv_width()).unwrap(),
                beta: &mut gpu.alloc(10 * h).unwrap(),
                g: &mut gpu.alloc(10 * h).unwrap(),
            },
            &mut gpu.alloc(10 * h * dims.v_dim).unwrap(),
        )
        .unwrap_err();
    assert!(err.to_string().contains("rows"), "{err}");
}

#[test]
#[ignore = "needs a GPU"]
fn delta_gates_match_cpu_across_the_softplus_threshold() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = StdRng::seed_from_u64(7);
    let (rows, heads) = (67, 32);
    let b = rand_vec(&mut rng, rows * heads, 6.0);
    // dt_bias + a spans both sides of softplus's threshold at 20.
    let a = rand_vec(&mut rng, rows * heads, 25.0);
    let (a_log_h, a_log_d) = weight(&gpu, &mut rng, heads, 2.0);
    let (dt_h, dt_d) = weight(&gpu, &mut rng, heads, 5.0);
    let dense = Strided::dense(heads);
    let gates_want = DeltaGates {
        b: &b,
        b_at: dense,
        a: &a,
        a_at: dense,
        a_log: &a_log_h,
        dt_bias: &dt_h,
        heads,
    };
    let (beta_want, g_want) = cpu_gates(gates_want, rows);
    let check = |b_d: &CudaBuf, b_at, a_d: &CudaBuf, a_at, want: (&[f32], &[f32]), what: &str| {
        let mut beta = gpu.alloc(rows * heads).unwrap();
        let mut g = gpu.alloc(rows * heads).unwrap();
        gpu.delta_gates(
            DeltaGates {
                b: b_d,
                b_at,
                a: a_d,
                a_at,
                a_log: &a_log_d,
                dt_bias: &dt_d,
                heads,
            },
            rows,
            GateOutputs {
                beta: &mut beta,
                g: &mut g,
            },
        )
        .unwrap();
        let n = rows * heads;
        assert_close(
            &gpu.read(&beta, n).unwrap(),
            want.0,
            1e-5,
            &format!("{what}: beta"),
        );
        assert_close(
            &gpu.read(&g, n).unwrap(),
            want.1,
            1e-5,
            &format!("{what}: g"),
        );
    };
    // Separate dense buffers.
    check(
        &activation(&gpu, &b, 0),
        dense,
        &activation(&gpu, &a, 0),
        dense,
        (&beta_want, &g_want),
        "dense",
    );
    // b then a as two column blocks of one wider row, as in the stacked in-projection output.
    let row = 2 * heads + 7;
    let (b_at, a_at) = (Strided::cols(row, 3), Strided::cols(row, 3 + heads));
    // a's block ends last, so its buffer is the longer one: b's values go into it.
    let mut host = strided(&a, rows, heads, a_at);
    for (i, v) in strided(&b, rows, heads, b_at).into_iter().enumerate() {
        if !v.is_nan() {
            host[i] = v;
        }
    }
    let stacked = activation(&gpu, &host, 0);
    check(
        &stacked,
        b_at,
        &stacked,
        a_at,
        (&beta_want, &g_want),
        "stacked",
    );
    // Both in one bf16 buffer (the stacked in-projection held in bf16): against the CPU on the
    // rounded values. One in bf16 and the other in f32 is refused.
    let (b16, a16) = (bf16_round(&b), bf16_round(&a));
    let (mut beta16_want, mut g16_want) = (vec![0.0; rows * heads], vec![0.0; rows * heads]);
    cpu.delta_gates(
        DeltaGates {
            b: &b16,
            b_at: dense,
            a: &a16,
            a_at: dense,
            a_log: &a_log_h,
            dt_bias: &dt_h,
            heads,
        },
        rows,
        GateOutputs {
            beta: &mut beta16_want,
            g: &mut g16_want,
        },
    )
    .unwrap();
    let stacked16 = bf16_activation(&gpu, &host, 0);
    check(
        &stacked16,
        b_at,
        &stacked16,
        a_at,
        (&beta16_want, &g16_want),
        "stacked bf16",
    );
    let (mut beta, mut g) = (
        gpu.alloc(rows * heads).unwrap(),
        gpu.alloc(rows * heads).unwrap(),
    );
    let err = gpu
        .delta_gates(
            DeltaGates {
                b: &stacked16,
                b_at,
                a: &stacked,
                a_at,
                a_log: &a_log_d,
                dt_bias: &dt_d,
                heads,
            },
            rows,
            GateOutputs {
                beta: &mut beta,
                g: &mut g,
            },
        )
        .unwrap_err();
    assert!(matches!(err, KernelError::Invalid { .. }), "{err}");
    // The last row of a must fit: one value short is refused.
    let short = activation(&gpu, &host[..a_at.required_len(rows, heads) - 1], 0);
    let (mut beta, mut g) = (
        gpu.alloc(rows * heads).unwrap(),
        gpu.alloc(rows * heads).unwrap(),
    );
    let err = gpu
        .delta_gates(
            DeltaGates {
                b: &short,
                b_at,
                a: &short,
                a_at,
                a_log: &a_log_d,
                dt_bias: &dt_d,
                heads,
            },
            rows,
            GateOutputs {
                beta: &mut beta,
                g: &mut g,
            },
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::Invalid {
                op: "delta_gates",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
#[ignore = "needs a GPU"]
fn swiglu_matches_cpu() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = StdRng::seed_from_u64(8);
    // inter 300 takes the vectorised path, 301 the scalar one.
    for (rows, inter) in [(65, 300), (3, 301)] {
        let gate_up = rand_vec(&mut rng, rows * 2 * inter, 4.0);
        let mut want = vec![0.0; rows * inter];
        cpu.swiglu(&gate_up, rows, inter, &mut want).unwrap();
        let gate_up_d = activation(&gpu, &gate_up, 0);
        let mut out = gpu.alloc(rows * inter).unwrap();
        gpu.swiglu(&gate_up_d, rows, inter, &mut out).unwrap();
        let what = format!("swiglu {rows}x{inter}");
        assert_close(&gpu.read(&out, rows * inter).unwrap(), &want, 1e-5, &what);
    }
}

/// SwiGLU fed straight into the down projection (bf16 on the way, as the GEMM's input always is)
/// against the CPU's SwiGLU, rounded to bf16, then its GEMM.
#[test]
#[ignore = "needs a GPU"]
fn swiglu_gemm_matches_cpu() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = StdRng::seed_from_u64(9);
    for (rows, inter, out_dim) in [(1, 9216, 256), (139, 1024, 2560), (7, 33, 5)] {
        let gate_up = rand_vec(&mut rng, rows * 2 * inter, 3.0);
        let (w_h, w_d) = weight(&gpu, &mut rng, out_dim * inter, 0.05);
        let mut act = vec![0.0; rows * inter];
        cpu.swiglu(&gate_up, rows, inter, &mut act).unwrap();
        let act = bf16_round(&act);
        let mut want = vec![0.0; rows * out_dim];
        cpu.gemm(&act, &w_h, GemmShape::new(rows, inter, out_dim), &mut want)
            .unwrap();
        let gate_up_d = activation(&gpu, &gate_up, 0);
        let mut act_d = gpu.alloc(rows * inter).unwrap();
        let y0 = rand_vec(&mut rng, rows * out_dim, 1.0);
        for store in [Store::Replace, Store::Add] {
            let mut y = activation(&gpu, &y0, 0);
            gpu.swiglu_gemm(
                &gate_up_d,
                rows,
                inter,
                Projection {
                    w: &w_d,
                    out_dim,
                    store,
                },
                &mut act_d,
                &mut y,
            )
            .unwrap();
            let what = format!("swiglu_gemm {rows}x{inter}x{out_dim} {store:?}");
            let want: Vec<f32> = match store {
                Store::Replace => want.clone(),
                Store::Add => y0.iter().zip(&want).map(|(a, b)| a + b).collect(),
            };
            // The odd shape may take the f32 fallback: bf16 rounding of the activation then
            // differs. An f32 ulp in SiLU can flip one bf16 rounding: allow a few such flips.
            let tol = if inter % 8 == 0 { 1e-3 } else { 1e-2 };
            assert_close(&gpu.read(&y, rows * out_dim).unwrap(), &want, tol, &what);
        }
    }
}

/// The MLP with gate|up in a bf16 buffer (`alloc_gemm_input`): the GEMM writes bf16 (its f32
/// result rounded once), SwiGLU and SwiGLU + down read it. Against the CPU's GEMM rounded to bf16.
#[test]
#[ignore = "needs a GPU"]
fn gemm_into_bf16_then_swiglu_matches_cpu() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = StdRng::seed_from_u64(12);
    // The real MLP widths at 1 and 139 rows; an odd inter (the scalar SwiGLU path).
    for (rows, hidden, inter, out_dim) in [
        (1, 2560, 9216, 2560),
        (139, 256, 1024, 320),
        (5, 64, 33, 16),
    ] {
        let x = bf16_round(&rand_vec(&mut rng, rows * hidden, 1.0));
        let (gu_h, gu_d) = weight(&gpu, &mut rng, 2 * inter * hidden, 0.05);
        let (w_h, w_d) = weight(&gpu, &mut rng, out_dim * inter, 0.05);
        let mut gate_up = vec![0.0; rows * 2 * inter];
        cpu.gemm(
            &x,
            &gu_h,
            GemmShape::new(rows, hidden, 2 * inter),
            &mut gate_up,
        )
        .unwrap();
        let gate_up = bf16_round(&gate_up);
        let mut act = vec![0.0; rows * inter];
        cpu.swiglu(&gate_up, rows, inter, &mut act).unwrap();
        let mut want = vec![0.0; rows * out_dim];
        cpu.gemm(
            &bf16_round(&act),
            &w_h,
            GemmShape::new(rows, inter, out_dim),
            &mut want,
        )
        .unwrap();

        let x_d = activation(&gpu, &x, 0);
        let mut gate_up_d = gpu.alloc_gemm_input(rows * 2 * inter).unwrap();
        assert_eq!(gate_up_d.dtype(), DType::Bf16);
        gpu.gemm(
            &x_d,
            &gu_d,
            GemmShape::new(rows, hidden, 2 * inter),
            &mut gate_up_d,
        )
        .unwrap();
        let what = format!("gemm into bf16 {rows}x{hidden}x{}", 2 * inter);
        // Both sides round the same f32 sums (up to summation order) to bf16: one bf16 ulp.
        let got = gpu.read(&gate_up_d, rows * 2 * inter).unwrap();
        assert_close(&got, &gate_up, 8e-3, &what);

        let mut act_d = gpu.alloc(rows * inter).unwrap();
        gpu.swiglu(&gate_up_d, rows, inter, &mut act_d).unwrap();
        let what = format!("swiglu from bf16 {rows}x{inter}");
        // SiLU of values one bf16 ulp apart: a few ulps.
        assert_close(&gpu.read(&act_d, rows * inter).unwrap(), &act, 3e-2, &what);

        let mut y = gpu.alloc(rows * out_dim).unwrap();
        gpu.swiglu_gemm(
            &gate_up_d,
            rows,
            inter,
            Projection {
                w: &w_d,
                out_dim,
                store: Store::Replace,
            },
            &mut act_d,
            &mut y,
        )
        .unwrap();
        let what = format!("swiglu_gemm from bf16 {rows}x{inter}x{out_dim}");
        assert_close(&gpu.read(&y, rows * out_dim).unwrap(), &want, 2e-2, &what);
    }
}

#[test]
#[ignore = "needs a GPU"]
fn scatter_rows_matches_cpu() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = StdRng::seed_from_u64(10);
    // A screenshot's 1,024 feature rows over a 1,400-row batch, a lone row, the model's width and
    // an odd one; the slots in any order.
    for (count, out_rows, width) in [(1024, 1400, 2560), (1, 3, 2560), (37, 40, 33)] {
        let rows = rand_vec(&mut rng, count * width, 1.0);
        let base = rand_vec(&mut rng, out_rows * width, 1.0);
        let mut slots: Vec<u32> = (0..out_rows as u32).collect();
        slots.reverse();
        slots.truncate(count);
        let mut want = base.clone();
        cpu.scatter_rows(&rows, &slots, count, width, &mut want)
            .unwrap();
        let mut out = activation(&gpu, &base, 0);
        gpu.scatter_rows(
            &activation(&gpu, &rows, 0),
            &indices(&gpu, &slots),
            count,
            width,
            &mut out,
        )
        .unwrap();
        assert_eq!(
            gpu.read(&out, out_rows * width).unwrap(),
            want,
            "{count} rows into {out_rows} of {width}"
        );
    }
}

#[test]
#[ignore = "needs a GPU"]
fn gather_last_matches_cpu() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = StdRng::seed_from_u64(9);
    let dim = 2560;
    for lens in BATCHES {
        let cu = cu_of(lens);
        let rows = *cu.last().unwrap() as usize;
        let x = rand_vec(&mut rng, rows * dim, 1.0);
        let mut want = vec![0.0; lens.len() * dim];
        let cpu_batch = Varlen {
            cu_seqlens: &cu,
            num_seqs: lens.len(),
            rows,
        };
        cpu.gather_last(&x, cpu_batch, dim, &mut want).unwrap();
        let x_d = activation(&gpu, &x, 0);
        let cu_d = indices(&gpu, &cu);
        let mut out = gpu.alloc(lens.len() * dim).unwrap();
        let gpu_batch = Varlen {
            cu_seqlens: &cu_d,
            num_seqs: lens.len(),
            rows,
        };
        gpu.gather_last(&x_d, gpu_batch, dim, &mut out).unwrap();
        assert_eq!(
            gpu.read(&out, lens.len() * dim).unwrap(),
            want,
            "lens {lens:?}"
        );
    }
}

/// Weights go up through a pinned staging buffer of 16 Mi values: parts of odd sizes, one empty and
/// one spanning two chunks land back to back, each value rounded to bf16 as on the host.
#[test]
#[ignore = "needs a GPU"]
fn upload_stacked_rounds_every_part_into_place() {
    let gpu = gpu();
    let mut rng = StdRng::seed_from_u64(13);
    let parts: Vec<Vec<f32>> = [3, (16 << 20) + 5, 0, 7]
        .into_iter()
        .map(|n| rand_vec(&mut rng, n, 3.0))
        .collect();
    let refs: Vec<&[f32]> = parts.iter().map(Vec::as_slice).collect();
    let buf = gpu.upload_stacked(&refs).unwrap();
    assert_eq!(buf.dtype(), DType::Bf16);
    let want = bf16_round(&parts.concat());
    assert_eq!(buf.len(), want.len());
    assert_eq!(bits(&gpu.read(&buf, want.len()).unwrap()), bits(&want));
    // A single upload is the same path.
    let one = gpu.upload(&parts[3]).unwrap();
    assert_eq!(gpu.read(&one, 7).unwrap(), bf16_round(&parts[3]));
}

/// `write_parts` into a GEMM input (bf16 on the GPU: the vision tower's pixels) rounds every value
/// as the host does and lands the parts back to back, across the staging buffer's chunks; into
/// f32 it copies them as they are. The values past the parts stay as they were, and a
/// destination too small is refused.
#[test]
#[ignore = "needs a GPU"]
fn write_parts_lands_every_part_in_place() {
    let gpu = gpu();
    let mut rng = StdRng::seed_from_u64(17);
    let parts: Vec<Vec<f32>> = [5, 0, (16 << 20) + 3, 11]
        .into_iter()
        .map(|n| rand_vec(&mut rng, n, 3.0))
        .collect();
    let refs: Vec<&[f32]> = parts.iter().map(Vec::as_slice).collect();
    let all = parts.concat();
    let len = all.len() + 4;
    let mut input = gpu.alloc_gemm_input(len).unwrap();
    assert_eq!(input.dtype(), DType::Bf16);
    gpu.write_parts(&mut input, &refs).unwrap();
    let got = gpu.read(&input, len).unwrap();
    assert_eq!(bits(&got[..all.len()]), bits(&bf16_round(&all)));
    assert_eq!(got[all.len()..], [0.0; 4]);
    let mut plain = gpu.alloc(len).unwrap();
    gpu.write_parts(&mut plain, &refs[2..]).unwrap();
    let tail = parts[2..].concat();
    assert_eq!(bits(&gpu.read(&plain, tail.len()).unwrap()), bits(&tail));
    let e = gpu.write_parts(&mut input, &[&all, &all]).unwrap_err();
    assert!(e.to_string().contains("destination holds"), "{e}");
}

#[test]
#[ignore = "needs a GPU"]
fn gemm_matches_cpu_on_odd_sizes() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = StdRng::seed_from_u64(10);
    // Real projection shapes (cuBLASLt) and odd ones cuBLASLt may refuse (the tiled fallback).
    // x is bf16-exact, so both paths see the same operands and differ only in summation order.
    let shapes = [
        (1, 2560, 300),
        (139, 2560, 4096),
        (300, 9216, 512),
        (70, 129, 65),
        (17, 16, 1),
    ];
    for (rows, in_dim, out_dim) in shapes {
        let x = bf16_round(&rand_vec(&mut rng, rows * in_dim, 1.0));
        let (w_h, w_d) = weight(&gpu, &mut rng, out_dim * in_dim, 0.1);
        let mut want = vec![0.0; rows * out_dim];
        cpu.gemm(&x, &w_h, GemmShape::new(rows, in_dim, out_dim), &mut want)
            .unwrap();
        let x_d = activation(&gpu, &x, 0);
        let mut y = gpu.alloc(rows * out_dim).unwrap();
        gpu.gemm(&x_d, &w_d, GemmShape::new(rows, in_dim, out_dim), &mut y)
            .unwrap();
        let what = format!("gemm {rows}x{in_dim}x{out_dim}");
        // f32 sums of in_dim products in another order than the CPU's (the batch-invariant
        // reference algorithm's): their error grows with √in_dim.
        let tol = 1e-4 * (in_dim as f32 / 1024.0).sqrt().max(1.0);
        assert_close(&gpu.read(&y, rows * out_dim).unwrap(), &want, tol, &what);

        // Added to a residual-like y, twice (the second time the shape's plan and tuning exist):
        // y0 + 2·x Wᵀ, the adds done by the GEMM in place.
        let y0 = rand_vec(&mut rng, rows * out_dim, 1.0);
        let mut y = activation(&gpu, &y0, 0);
        for _ in 0..2 {
            gpu.gemm_to(
                &x_d,
                &w_d,
                GemmShape::new(rows, in_dim, out_dim),
                Store::Add,
                &mut y,
            )
            .unwrap();
        }
        let twice: Vec<f32> = y0.iter().zip(&want).map(|(a, b)| a + 2.0 * b).collect();
        let what = format!("gemm += twice {rows}x{in_dim}x{out_dim}");
        assert_close(&gpu.read(&y, rows * out_dim).unwrap(), &twice, tol, &what);
    }
    // Only an f32 output can be added to.
    let x_d = activation(&gpu, &bf16_round(&rand_vec(&mut rng, 4 * 64, 1.0)), 0);
    let (_, w_d) = weight(&gpu, &mut rng, 64 * 64, 0.1);
    let mut y = gpu.alloc_gemm_input(4 * 64).unwrap();
    let err = gpu
        .gemm_to(&x_d, &w_d, GemmShape::new(4, 64, 64), Store::Add, &mut y)
        .unwrap_err();
    assert!(matches!(err, KernelError::Invalid { .. }), "{err}");
}

#[test]
#[ignore = "needs a GPU"]
fn attention_matches_cpu_on_ragged_batches() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = StdRng::seed_from_u64(11);
    // A head size off the tensor-core kernel's grid (not a multiple of 16), so this checks the
    // exact f32 kernel; tests/cuda_attention.rs covers the flash kernel at the real shape.
    let dims = AttentionDims {
        q_heads: 8,
        kv_heads: 2,
        head_dim: 264,
        scale: 1.0 / 16.0,
    };
    for lens in BATCHES {
        let cu = cu_of(lens);
        let rows = *cu.last().unwrap() as usize;
        let qg = rand_vec(&mut rng, rows * dims.q_heads * 2 * dims.head_dim, 2.0);
        let k = rand_vec(&mut rng, rows * dims.kv_heads * dims.head_dim, 2.0);
        let v = rand_vec(&mut rng, rows * dims.kv_heads * dims.head_dim, 1.0);
        let out_len = rows * dims.q_heads * dims.head_dim;
        let mut want = vec![0.0; out_len];
        let cpu_batch = Varlen {
            cu_seqlens: &cu,
            num_seqs: lens.len(),
            rows,
        };
        cpu.attention(&qg, &k, &v, cpu_batch, dims, &mut want)
            .unwrap();
        let (qg_d, k_d, v_d) = (
            activation(&gpu, &qg, 0),
            activation(&gpu, &k, 0),
            activation(&gpu, &v, 0),
        );
        let cu_d = indices(&gpu, &cu);
        let mut out = gpu.alloc(out_len).unwrap();
        let gpu_batch = Varlen {
            cu_seqlens: &cu_d,
            num_seqs: lens.len(),
            rows,
        };
        gpu.attention(&qg_d, &k_d, &v_d, gpu_batch, dims, &mut out)
            .unwrap();
        let what = format!("attention lens {lens:?}");
        assert_close(&gpu.read(&out, out_len).unwrap(), &want, 1e-4, &what);
    }
}

#[test]
#[ignore = "needs a GPU"]
fn delta_rule_both_forms_match_cpu_with_and_without_carried_state() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = StdRng::seed_from_u64(12);
    let dims = DeltaDims {
        k_heads: 2,
        v_heads: 4,
        k_dim: 128,
        v_dim: 128,
    };
    let width = dims.qkv_width();
    for lens in BATCHES {
        let cu = cu_of(lens);
        let rows = *cu.last().unwrap() as usize;
        let mut qkv = rand_vec(&mut rng, rows * width, 1.0);
        // q and k must arrive L2-normalised, as the model's l2_norm leaves them.
        let qk = dims.qk_layout();
        cpu.l2_norm(&mut qkv, qk, rows, 1e-6).unwrap();
        let beta: Vec<f32> = (0..rows * dims.v_heads)
            .map(|_| rng.gen_range(0.0..1.0))
            .collect();
        let g: Vec<f32> = (0..rows * dims.v_heads)
            .map(|_| rng.gen_range(-2.0..0.0))
            .collect();
        let state_len = lens.len() * dims.state_len();
        let initial = rand_vec(&mut rng, state_len, 0.5);
        let cpu_batch = Varlen {
            cu_seqlens: &cu,
            num_seqs: lens.len(),
            rows,
        };
        let out_len = rows * dims.v_heads * dims.v_dim;

        let (qkv_d, beta_d, g_d) = (
            activation(&gpu, &qkv, 0),
            activation(&gpu, &beta, 0),
            activation(&gpu, &g, 0),
        );
        let cu_d = indices(&gpu, &cu);
        let initial_d = activation(&gpu, &initial, 0);
        for with_initial in [false, true] {
            let mut want = vec![0.0; out_len];
            let mut want_final = vec![0.0; state_len];
            let cpu_state = DeltaState {
                initial: with_initial.then_some(&initial),
                final_out: Some(&mut want_final),
                final_at: None,
            };
            cpu.gated_delta_rule_recurrent(
                DeltaInputs {
                    qkv: &qkv,
                    beta: &beta,
                    g: &g,
                },
                cpu_batch,
                dims,
                cpu_state,
                &mut want,
            )
            .unwrap();
            for chunked in [false, true] {
                let gpu_batch = Varlen {
                    cu_seqlens: &cu_d,
                    num_seqs: lens.len(),
                    rows,
                };
                let mut out = gpu.alloc(out_len).unwrap();
                let mut final_d = gpu.alloc(state_len).unwrap();
                let gpu_state = DeltaState {
                    initial: with_initial.then_some(&initial_d),
                    final_out: Some(&mut final_d),
                    final_at: None,
                };
                if chunked {
                    gpu.gated_delta_rule_chunked(
                        DeltaInputs {
                            qkv: &qkv_d,
                            beta: &beta_d,
                            g: &g_d,
                        },
                        gpu_batch,
                        dims,
                        gpu_state,
                        &mut out,
                    )
                } else {
                    gpu.gated_delta_rule_recurrent(
                        DeltaInputs {
                            qkv: &qkv_d,
                            beta: &beta_d,
                            g: &g_d,
                        },
                        gpu_batch,
                        dims,
                        gpu_state,
                        &mut out,
                    )
                }
                .unwrap();
                let what = format!("delta lens {lens:?} initial {with_initial} chunked {chunked}");
                // The chunked form's state products run on bf16 tensor cores (see
                // cuda_delta_chunked.rs, which tests it in depth); the recurrent one is f32.
                let tol = if chunked { 5e-3 } else { 1e-4 };
                assert_close(&gpu.read(&out, out_len).unwrap(), &want, tol, &what);
                assert_close(
                    &gpu.read(&final_d, state_len).unwrap(),
                    &want_final,
                    tol,
                    &what,
                );
            }
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn index_writes_arrive_whole_and_in_order_through_the_pinned_halves() {
    let gpu = gpu();
    let mut rng = StdRng::seed_from_u64(18);
    // Many writes without a synchronization between them: small ones (a half holds thousands),
    // some longer than a half at first (it is replaced by a larger one), a write of nothing.
    let mut bufs: Vec<_> = (0..8).map(|_| gpu.alloc_idx(150_000).unwrap()).collect();
    let mut want = vec![Vec::new(); bufs.len()];
    for step in 0..400 {
        let n = match step {
            100 => 70_000,
            250 => 150_000,
            _ if step % 37 == 0 => 0,
            _ => rng.gen_range(1..5_000),
        };
        let data: Vec<u32> = (0..n).map(|_| rng.gen()).collect();
        let b = step % bufs.len();
        gpu.write_idx(&mut bufs[b], &data).unwrap();
        // A shorter write leaves the rest of what was there.
        let held = &mut want[b];
        if held.len() < n {
            held.resize(n, 0);
        }
        held[..n].copy_from_slice(&data);
    }
    for (b, (buf, want)) in bufs.iter().zip(&want).enumerate() {
        assert_eq!(gpu.read_idx(buf, want.len()).unwrap(), *want, "buffer {b}");
    }

    // A kernel queued between two writes of one buffer reads the first: the second copy runs
    // after it on the stream, although the host returned at once from both.
    let (vocab, dim, rows) = (64, 2, 700);
    let table: Vec<f32> = (0..vocab * dim).map(|i| (i / dim) as f32).collect();
    let table_d = gpu.upload(&table).unwrap();
    let mut ids_d = gpu.alloc_idx(rows).unwrap();
    let firsts: Vec<u32> = (0..rows).map(|_| rng.gen_range(0..vocab as u32)).collect();
    let seconds: Vec<u32> = firsts.iter().map(|&i| (i + 1) % vocab as u32).collect();
    let mut outs = [
        gpu.alloc(rows * dim).unwrap(),
        gpu.alloc(rows * dim).unwrap(),
    ];
    for (ids, out) in [&firsts, &seconds].into_iter().zip(&mut outs) {
        gpu.write_idx(&mut ids_d, ids).unwrap();
        gpu.embedding(&table_d, vocab, &ids_d, rows, dim, out)
            .unwrap();
    }
    for (ids, out) in [&firsts, &seconds].into_iter().zip(&outs) {
        let got = gpu.read(out, rows * dim).unwrap();
        let want: Vec<f32> = ids.iter().flat_map(|&i| [i as f32; 2]).collect();
        assert_eq!(got, want);
    }
}
