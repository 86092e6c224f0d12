//! The CUDA backend's vision ops against the CPU reference on random inputs: the Qwen3.5-4B vision
//! tower's shapes (hidden 1024, 16 heads of 64, MLP 4096) and odd ones (widths that are not
//! multiples of 32, one row, segments of one token, empty segments, ragged batches of several
//! images).
//!
//! These need a GPU: `cargo test -p instinct-kernels --test cuda_vision -- --ignored`.
//!
//! One generic body per op runs on both backends. Weights and biases are bf16-exact (the CUDA
//! backend uploads them in bf16), so both compute with the same numbers and differ by f32
//! summation order and the device's math functions only. Every buffer is longer than the op's
//! rows and the excess holds NaN: a read beyond the rows would show up in the result, a write
//! beyond them would overwrite the NaN (both backends must leave it).

mod common;
use common::{bf16_round, cu_of, gpu, rand_vec};

use instinct_kernels::backend::{bias_rope_attention_apart, Gelu, VisionBackend};
use instinct_kernels::cuda::CudaBackend;
use instinct_kernels::patches::{PatchImage, PatchRows, PATCH_VALUES};
use instinct_kernels::{Backend, CpuBackend, GemmShape, HeadLayout, KernelError, RowNorm, Varlen};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The vision tower of Qwen3.5-4B.
const HIDDEN: usize = 1024;
const HEADS: usize = 16;
const HEAD_DIM: usize = 64;
const MLP: usize = 4096;
const THETA: f32 = 10_000.0;
/// NaN values after every buffer's data.
const PAD: usize = 37;

/// Values that must agree: `|got − want| ≤ tol · (1 + |want|)`, NaN where the other has NaN.
#[track_caller]
fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_nan() {
            g.is_nan()
        } else {
            (g - w).abs() <= tol * (1.0 + w.abs())
        };
        assert!(ok, "{what}: index {i}: cuda {g} vs cpu {w}");
    }
}

/// A buffer of `be` holding `data` then [`PAD`] NaNs.
fn padded<B: Backend>(be: &B, data: &[f32]) -> B::Buf {
    let mut host = data.to_vec();
    host.resize(data.len() + PAD, f32::NAN);
    let mut buf = be.alloc(host.len()).unwrap();
    be.write(&mut buf, &host).unwrap();
    buf
}

/// A u32 buffer of `be` holding `data`.
fn indices<B: Backend>(be: &B, data: &[u32]) -> B::Idx {
    let mut buf = be.alloc_idx(data.len().max(1)).unwrap();
    be.write_idx(&mut buf, data).unwrap();
    buf
}

/// The whole of `buf` (its data and the padding after it) on the host.
fn read_all<B: Backend>(be: &B, buf: &B::Buf, len: usize) -> Vec<f32> {
    be.read(buf, len + PAD).unwrap()
}

/// A LayerNorm over `rows` rows of `dim` with `weight` (the tower's epsilon).
fn row_norm<Buf>(weight: &Buf, rows: usize, dim: usize) -> RowNorm<'_, Buf> {
    RowNorm {
        weight,
        rows,
        dim,
        eps: 1e-6,
    }
}

/// A random bf16-exact weight.
fn bf16_weight(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    bf16_round(&rand_vec(rng, n, scale))
}

// ---- the generic bodies -------------------------------------------------------------------------

/// LayerNorm of `x` (`rows` rows of `w.len()`), into a NaN-filled output.
fn layer_norm_on<B: VisionBackend>(
    be: &B,
    x: &[f32],
    w: &[f32],
    b: &[f32],
    rows: usize,
) -> Vec<f32> {
    let dim = w.len();
    let x_d = padded(be, x);
    let (w_d, b_d) = (be.upload(w).unwrap(), be.upload(b).unwrap());
    let mut out = padded(be, &vec![f32::NAN; rows * dim]);
    be.layer_norm(&x_d, row_norm(&w_d, rows, dim), &b_d, &mut out)
        .unwrap();
    read_all(be, &out, rows * dim)
}

/// `x += bias` per row, then `x += delta`: (after the bias, after the delta).
fn adds_on<B: VisionBackend>(be: &B, x: &[f32], bias: &[f32], delta: &[f32]) -> [Vec<f32>; 2] {
    let (len, dim) = (x.len(), bias.len());
    let mut x_d = padded(be, x);
    let bias_d = be.upload(bias).unwrap();
    let delta_d = padded(be, delta);
    be.add_bias(&mut x_d, &bias_d, len / dim, dim).unwrap();
    let after_bias = read_all(be, &x_d, len);
    be.add_in_place(&mut x_d, &delta_d, len).unwrap();
    [after_bias, read_all(be, &x_d, len)]
}

fn gelu_on<B: VisionBackend>(be: &B, x: &[f32], kind: Gelu) -> Vec<f32> {
    let mut x_d = padded(be, x);
    be.gelu(&mut x_d, x.len(), kind).unwrap();
    read_all(be, &x_d, x.len())
}

/// Axial rope on each of `layouts` in turn over `rows` rows of `x`.
fn rope_on<B: VisionBackend>(
    be: &B,
    x: &[f32],
    layouts: &[HeadLayout],
    positions: &[u32],
    rows: usize,
) -> Vec<f32> {
    let mut x_d = padded(be, x);
    let pos = indices(be, positions);
    for &layout in layouts {
        be.rope_axial(&mut x_d, layout, &pos, rows, THETA).unwrap();
    }
    read_all(be, &x_d, x.len())
}

/// Bidirectional attention over segments of `lens` of the stacked `qkv`, into a NaN-filled output.
fn attention_on<B: VisionBackend>(
    be: &B,
    qkv: &[f32],
    lens: &[usize],
    (heads, head_dim): (usize, usize),
    out_len: usize,
) -> Vec<f32> {
    let qkv_d = padded(be, qkv);
    let cu = indices(be, &cu_of(lens));
    let mut out = padded(be, &vec![f32::NAN; out_len]);
    let batch = Varlen {
        cu_seqlens: &cu,
        num_seqs: lens.len(),
        rows: lens.iter().sum(),
    };
    let scale = (head_dim as f64).powf(-0.5) as f32;
    be.attention_bidirectional(&qkv_d, batch, heads, head_dim, scale, &mut out)
        .unwrap();
    read_all(be, &out, out_len)
}

// ---- CUDA against CPU ---------------------------------------------------------------------------

#[test]
#[ignore = "needs a GPU"]
fn layer_norm_matches_cpu() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = StdRng::seed_from_u64(11);
    // The tower's width (one row and many); widths the 256-thread rows hold in 4, 8 and 16 values
    // per thread (1, 33, 1025, 4096) and one they loop over (5000).
    for (rows, dim) in [
        (1, HIDDEN),
        (300, HIDDEN),
        (3, 1),
        (5, 33),
        (7, 100),
        (2, 1025),
        (2, 4096),
        (2, 5000),
    ] {
        // Rows with a large mean: the variance must not cancel.
        let x: Vec<f32> = rand_vec(&mut rng, rows * dim, 2.0)
            .iter()
            .map(|v| v + 20.0)
            .collect();
        let w = bf16_weight(&mut rng, dim, 1.0);
        let b = bf16_weight(&mut rng, dim, 0.5);
        let want = layer_norm_on(&cpu, &x, &w, &b, rows);
        let got = layer_norm_on(&gpu, &x, &w, &b, rows);
        assert_close(&got, &want, 1e-4, &format!("layer_norm {rows}x{dim}"));
    }
}

#[test]
#[ignore = "needs a GPU"]
fn bias_and_residual_adds_match_cpu_exactly() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = StdRng::seed_from_u64(12);
    for (rows, dim) in [(1, HIDDEN), (257, MLP), (3, 33), (5, 1)] {
        let n = rows * dim;
        let x = rand_vec(&mut rng, n, 3.0);
        let bias = bf16_weight(&mut rng, dim, 1.0);
        let delta = rand_vec(&mut rng, n, 3.0);
        let want = adds_on(&cpu, &x, &bias, &delta);
        let got = adds_on(&gpu, &x, &bias, &delta);
        // One f32 addition per value: the same bits.
        for (g, w) in got.iter().zip(&want) {
            assert_close(g, w, 0.0, &format!("adds {rows}x{dim}"));
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn gelu_matches_cpu() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = StdRng::seed_from_u64(13);
    let mut x = rand_vec(&mut rng, MLP * 3 + 5, 6.0);
    // The tails, zero and values far out (tanh and erf saturate to ±1 there).
    x.extend([0.0, -0.0, 1e-6, -1e-6, 10.0, -10.0, 40.0, -40.0, 1e4, -1e4]);
    for kind in [Gelu::Tanh, Gelu::Erf] {
        for len in [1, 3, x.len()] {
            let want = gelu_on(&cpu, &x[..len], kind);
            let got = gelu_on(&gpu, &x[..len], kind);
            assert_close(&got, &want, 1e-5, &format!("gelu {kind:?} len {len}"));
        }
    }
}

/// The fused bias ops (one pass each on a GPU) against the separate ops on the same backend, bit
/// for bit, and the LayerNorm into a GEMM input against its f32 output rounded: `bias_gelu` into an f32 and into a bf16 GEMM input (the separate ops' result rounded
/// to nearest even, as the GEMM rounds an f32 input, where `gemm_input_is_bf16`),
/// `add_bias_residual`.
fn fused_bias_ops_match_the_separate_ones<B: VisionBackend>(be: &B, gemm_input_is_bf16: bool) {
    let mut rng = StdRng::seed_from_u64(21);
    let rounded = |values: &[f32]| -> Vec<f32> {
        values
            .iter()
            .map(|&v| match gemm_input_is_bf16 {
                true => half::bf16::from_f32(v).to_f32(),
                false => v,
            })
            .collect()
    };
    for (rows, dim) in [(1, 4), (37, MLP), (5, 1000), (64, HIDDEN), (3, 33)] {
        let len = rows * dim;
        let x = rand_vec(&mut rng, len, 4.0);
        let bias = bf16_weight(&mut rng, dim, 1.0);
        let bias_d = be.upload(&bias).unwrap();
        for kind in [Gelu::Tanh, Gelu::Erf] {
            let mut x_d = padded(be, &x);
            be.add_bias(&mut x_d, &bias_d, rows, dim).unwrap();
            be.gelu(&mut x_d, len, kind).unwrap();
            let want = read_all(be, &x_d, len);
            let mut x_d = padded(be, &x);
            let mut out = padded(be, &vec![0.0; len]);
            be.bias_gelu(&mut x_d, &bias_d, (rows, dim), kind, &mut out)
                .unwrap();
            let got = read_all(be, &out, len);
            let what = format!("bias_gelu {kind:?} {rows}x{dim}");
            assert_eq!(
                got[..len].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want[..len].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{what}"
            );
            assert!(got[len..].iter().all(|v| v.is_nan()), "{what}: wrote past");
            let mut x_d = padded(be, &x);
            let mut gemm_in = be.alloc_gemm_input(len).unwrap();
            be.bias_gelu(&mut x_d, &bias_d, (rows, dim), kind, &mut gemm_in)
                .unwrap();
            let got = be.read(&gemm_in, len).unwrap();
            assert_eq!(got, rounded(&want[..len]), "{what} into a GEMM input");
        }
        // A LayerNorm into a GEMM input: its f32 output, rounded the same way.
        let w = bf16_weight(&mut rng, dim, 1.0);
        let want = layer_norm_on(be, &x, &w, &bias, rows);
        let (x_d, w_d) = (padded(be, &x), be.upload(&w).unwrap());
        let mut gemm_in = be.alloc_gemm_input(len).unwrap();
        be.layer_norm(&x_d, row_norm(&w_d, rows, dim), &bias_d, &mut gemm_in)
            .unwrap();
        assert_eq!(
            be.read(&gemm_in, len).unwrap(),
            rounded(&want[..len]),
            "layer_norm {rows}x{dim} into a GEMM input"
        );

        let residual = rand_vec(&mut rng, len, 2.0);
        let mut r_d = padded(be, &residual);
        let mut x_d = padded(be, &x);
        be.add_bias(&mut x_d, &bias_d, rows, dim).unwrap();
        be.add_in_place(&mut r_d, &x_d, len).unwrap();
        let want = read_all(be, &r_d, len);
        let mut r_d = padded(be, &residual);
        let mut x_d = padded(be, &x);
        be.add_bias_residual(&mut r_d, &mut x_d, &bias_d, (rows, dim))
            .unwrap();
        let got = read_all(be, &r_d, len);
        assert_eq!(
            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "add_bias_residual {rows}x{dim}"
        );
    }
}

#[test]
#[ignore = "needs a GPU"]
fn fused_bias_ops_equal_the_separate_ops_on_the_gpu() {
    fused_bias_ops_match_the_separate_ones(&gpu(), true);
}

#[test]
fn fused_bias_ops_equal_the_separate_ops_on_the_cpu() {
    fused_bias_ops_match_the_separate_ones(&CpuBackend::new(), false);
}

/// The GEMMs with their bias ops (on a GPU in cuBLASLt's epilogues) against the GEMM and the ops
/// apart on the same backend, at the tower's MLP and projection shapes (`dims`) and ragged row
/// counts: `gemm_bias_residual` bit for bit (the same f32 adds in the same order);
/// `gemm_bias_gelu` into a GEMM input within one bf16 step of the rounded value, on at most 1% of
/// the values (another tanh GELU, rounded once: it moves a value across a rounding boundary
/// rarely), and the erf GELU as the ops apart. Returns how many GELU values differed.
fn gemm_bias_ops_match_the_ops_apart<B: VisionBackend>(
    be: &B,
    dims: [(usize, usize); 3],
    rows: &[usize],
) -> usize {
    let mut rng = StdRng::seed_from_u64(22);
    let mut gelu_differing = 0;
    for &(in_dim, out_dim) in &dims {
        let w = bf16_weight(&mut rng, out_dim * in_dim, 1.0 / (in_dim as f32).sqrt());
        let bias = bf16_weight(&mut rng, out_dim, 0.5);
        let (w_d, bias_d) = (be.upload(&w).unwrap(), be.upload(&bias).unwrap());
        let mut bias_f32 = be.alloc(out_dim).unwrap();
        be.write(&mut bias_f32, &bias).unwrap();
        for &n in rows {
            let (len, shape) = (n * out_dim, GemmShape::new(n, in_dim, out_dim));
            let what = format!("{n}x{in_dim} -> {out_dim}");
            let x = rand_vec(&mut rng, n * in_dim, 2.0);
            let mut x_in = be.alloc_gemm_input(n * in_dim).unwrap();
            be.write(&mut x_in, &x).unwrap();
            let residual = rand_vec(&mut rng, len, 2.0);

            let mut product = padded(be, &vec![f32::NAN; len]);
            be.gemm(&x_in, &w_d, shape, &mut product).unwrap();
            let mut want = padded(be, &residual);
            be.add_bias_residual(&mut want, &mut product, &bias_d, (n, out_dim))
                .unwrap();
            let want = read_all(be, &want, len);
            let mut got = padded(be, &residual);
            let mut scratch = padded(be, &vec![f32::NAN; len]);
            let weights = (&w_d, &bias_d, &bias_f32);
            be.gemm_bias_residual(&x_in, weights, shape, &mut scratch, &mut got)
                .unwrap();
            let got = read_all(be, &got, len);
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "gemm_bias_residual {what}"
            );

            for kind in [Gelu::Tanh, Gelu::Erf] {
                let mut product = padded(be, &vec![f32::NAN; len]);
                be.gemm(&x_in, &w_d, shape, &mut product).unwrap();
                let mut want = be.alloc_gemm_input(len).unwrap();
                be.bias_gelu(&mut product, &bias_d, (n, out_dim), kind, &mut want)
                    .unwrap();
                let want = be.read(&want, len).unwrap();
                let mut got = be.alloc_gemm_input(len).unwrap();
                let mut scratch = padded(be, &vec![f32::NAN; len]);
                be.gemm_bias_gelu(
                    &x_in,
                    (&w_d, &bias_d),
                    shape,
                    kind,
                    (&mut scratch, &mut got),
                )
                .unwrap();
                let got = be.read(&got, len).unwrap();
                let what = format!("gemm_bias_gelu {kind:?} {what}");
                let differing = got.iter().zip(&want).filter(|(g, w)| g != w).count();
                if kind == Gelu::Erf {
                    assert_eq!(differing, 0, "{what}: the erf GELU runs apart");
                }
                // One bf16 step at the value's magnitude (8 bits of mantissa).
                assert_close(&got, &want, 1.0 / 128.0, &what);
                assert!(
                    differing * 100 <= len,
                    "{what}: {differing} of {len} values differ"
                );
                gelu_differing += differing;
            }
        }
    }
    gelu_differing
}

#[test]
#[ignore = "needs a GPU"]
fn gemm_bias_ops_in_the_epilogues_match_the_ops_apart_on_the_gpu() {
    let dims = [(HIDDEN, MLP), (HIDDEN, HIDDEN), (MLP, HIDDEN)];
    let differing = gemm_bias_ops_match_the_ops_apart(&gpu(), dims, &[1, 37, 300, 1024, 4096]);
    eprintln!("tanh GELU values one bf16 step apart: {differing}");
}

#[test]
fn gemm_bias_ops_equal_the_ops_apart_on_the_cpu() {
    let differing = gemm_bias_ops_match_the_ops_apart(
        &CpuBackend::new(),
        [(64, 256), (64, 64), (256, 64)],
        &[1, 37, 130],
    );
    assert_eq!(differing, 0, "the CPU runs the default: the ops apart");
}

#[test]
#[ignore = "needs a GPU"]
fn rope_axial_matches_cpu() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = StdRng::seed_from_u64(14);
    // The tower: q then k heads of the stacked qkv rows (the v block must stay as it is).
    let tower_q = HeadLayout {
        heads: HEADS,
        head_dim: HEAD_DIM,
        head_stride: HEAD_DIM,
        row_stride: 3 * HIDDEN,
        offset: 0,
    };
    let tower_k = HeadLayout {
        offset: HIDDEN,
        ..tower_q
    };
    let spread = HeadLayout {
        heads: 3,
        head_dim: 20,
        head_stride: 23,
        row_stride: 80,
        offset: 7,
    };
    let cases: [(&[HeadLayout], usize); 6] = [
        (&[tower_q, tower_k], 257),
        (&[tower_q, tower_k], 1),
        (&[HeadLayout::dense(1, 4)], 9),
        (&[spread], 33),
        (&[HeadLayout::dense(2, 256)], 5),
        (&[HeadLayout::dense(5, 12)], 64),
    ];
    for (layouts, rows) in cases {
        let len = layouts.iter().map(|l| l.required_len(rows)).max().unwrap();
        let x = rand_vec(&mut rng, len, 2.0);
        // Patch rows and columns of images up to 128 patches a side, and a few far out.
        let mut positions: Vec<u32> = (0..2 * rows).map(|_| rng.gen_range(0..128)).collect();
        positions[0] = 1000;
        let want = rope_on(&cpu, &x, layouts, &positions, rows);
        let got = rope_on(&gpu, &x, layouts, &positions, rows);
        let d = layouts[0].head_dim;
        assert_close(&got, &want, 1e-4, &format!("rope_axial d {d} rows {rows}"));
    }
}

#[test]
#[ignore = "needs a GPU"]
fn attention_bidirectional_matches_cpu() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = StdRng::seed_from_u64(15);
    // (heads, head_dim, segment lengths, rows the buffers hold beyond the batch)
    let cases: &[(usize, usize, &[usize], usize)] = &[
        // The tower: images of several sizes in one batch, one of a single patch.
        (HEADS, HEAD_DIM, &[1, 64, 257, 1024], 0),
        (HEADS, HEAD_DIM, &[16], 3),
        // The tiny model's heads; segments of one token, an empty one, tiles cut mid-segment.
        (2, 16, &[1, 1, 0, 17, 33], 5),
        // Heads that are not multiples of 32 (every variant: up to 64, 128, 256).
        (3, 40, &[5, 31, 70], 1),
        (2, 100, &[129, 2], 0),
        (2, 200, &[33, 100], 2),
        // The largest head (its shared memory needs the opt-in above 48 KiB).
        (1, 256, &[65, 1, 40], 0),
        (1, 4, &[3, 50], 0),
    ];
    for &(heads, head_dim, lens, extra_rows) in cases {
        let rows: usize = lens.iter().sum::<usize>() + extra_rows;
        let width = heads * head_dim;
        let qkv = rand_vec(&mut rng, rows * 3 * width, 2.0);
        // Head sizes that are multiples of 16 run on the flash kernel's bidirectional form, with
        // bf16 operands (fed bf16-exact inputs here; the scaled queries and the softmax weights
        // still round): the flash tolerance. The rest run the f32 kernel.
        let (qkv, tol) = if head_dim.is_multiple_of(16) {
            (bf16_round(&qkv), 1e-2)
        } else {
            (qkv, 1e-3)
        };
        let want = attention_on(&cpu, &qkv, lens, (heads, head_dim), rows * width);
        let what = format!("attention {heads}x{head_dim} {lens:?}");
        // Each mma.sync flash layout (the narrow one of short segments, the wide one of long
        // images), forced: both sum a row's keys in one order, so they agree bit for bit. Unforced,
        // heads of 64 on an H100/H200 take the warpgroup-MMA kernel, which sums them in that order
        // too; the rest one of the two.
        let mut layouts = Vec::new();
        for rows_per_block in [Some(64), Some(128)] {
            CudaBackend::force_flash_query_rows(rows_per_block);
            layouts.push(attention_on(
                &gpu,
                &qkv,
                lens,
                (heads, head_dim),
                rows * width,
            ));
        }
        CudaBackend::force_flash_query_rows(None);
        let got = attention_on(&gpu, &qkv, lens, (heads, head_dim), rows * width);
        assert_close(&got, &want, tol, &what);
        for layout in &layouts {
            assert_eq!(
                layout.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{what}: a forced layout differs"
            );
        }
    }
}

/// An image's attention rows are the same bits alone as beside other images in one batch (the
/// tower's features must not depend on what else a pass holds), in the layout the op picks and in
/// each forced one: a whole screenshot, small images, segments of one row and not multiples of a
/// tile.
#[test]
#[ignore = "needs a GPU"]
fn attention_bidirectional_rows_do_not_depend_on_the_batch() {
    let gpu = gpu();
    let mut rng = StdRng::seed_from_u64(25);
    let lens: &[usize] = &[300, 1, 4096, 64, 129, 1000];
    let width = HEADS * HEAD_DIM;
    let rows: usize = lens.iter().sum();
    let qkv = bf16_round(&rand_vec(&mut rng, rows * 3 * width, 2.0));
    for force in [None, Some(64), Some(128)] {
        CudaBackend::force_flash_query_rows(force);
        let together = attention_on(&gpu, &qkv, lens, (HEADS, HEAD_DIM), rows * width);
        let mut at = 0;
        for &len in lens {
            let alone = attention_on(
                &gpu,
                &qkv[at * 3 * width..(at + len) * 3 * width],
                &[len],
                (HEADS, HEAD_DIM),
                len * width,
            );
            let mine = &together[at * width..(at + len) * width];
            assert!(
                alone
                    .iter()
                    .zip(mine)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "layout {force:?}: a segment of {len} rows differs alone and in the batch"
            );
            at += len;
        }
    }
    CudaBackend::force_flash_query_rows(None);
}

/// The attention into a GEMM input (bf16 on the GPU, as the tower's proj GEMM reads it): each value
/// the f32 output rounded to nearest even (the kernel rounds as it stores), for the head sizes the
/// flash kernel takes; the others refuse a bf16 out.
#[test]
#[ignore = "needs a GPU"]
fn attention_into_a_gemm_input_is_the_f32_output_rounded() {
    let gpu = gpu();
    let mut rng = StdRng::seed_from_u64(24);
    let cases: &[(usize, usize, &[usize])] = &[
        (HEADS, HEAD_DIM, &[1, 64, 257, 1024]),
        (2, 16, &[1, 17, 33]),
        (1, 256, &[65, 1]),
    ];
    for &(heads, head_dim, lens) in cases {
        let rows: usize = lens.iter().sum();
        let width = heads * head_dim;
        let qkv = bf16_round(&rand_vec(&mut rng, rows * 3 * width, 2.0));
        let want = attention_on(&gpu, &qkv, lens, (heads, head_dim), rows * width);
        let qkv_d = padded(&gpu, &qkv);
        let cu = indices(&gpu, &cu_of(lens));
        let batch = Varlen {
            cu_seqlens: &cu,
            num_seqs: lens.len(),
            rows,
        };
        let mut out = gpu.alloc_gemm_input(rows * width).unwrap();
        let scale = (head_dim as f64).powf(-0.5) as f32;
        gpu.attention_bidirectional(&qkv_d, batch, heads, head_dim, scale, &mut out)
            .unwrap();
        assert_eq!(
            gpu.read(&out, rows * width).unwrap(),
            bf16_round(&want[..rows * width]),
            "attention {heads}x{head_dim} {lens:?} into a GEMM input"
        );
    }
    let (heads, head_dim, rows) = (3, 40, 5);
    let qkv_d = padded(&gpu, &vec![0.5; rows * 3 * heads * head_dim]);
    let cu = indices(&gpu, &cu_of(&[rows]));
    let batch = Varlen {
        cu_seqlens: &cu,
        num_seqs: 1,
        rows,
    };
    let mut out = gpu.alloc_gemm_input(rows * heads * head_dim).unwrap();
    let e = gpu
        .attention_bidirectional(&qkv_d, batch, heads, head_dim, 0.1, &mut out)
        .unwrap_err();
    assert!(e.to_string().contains("multiple of 16"), "{e}");
}

/// The block's attention from its qkv product before the bias (`bias_rope_attention`), its way
/// (on the GPU the bias and the rotary applied as the flash kernel's inputs are written, for head
/// sizes of 64, 128 and 256) against the four ops apart, on `be`: the same bits, nothing written
/// past the rows. Patch positions as a grid's (row, column), ragged segments, one of one patch.
fn bias_rope_attention_matches_the_ops_apart<B: VisionBackend>(be: &B) {
    let mut rng = StdRng::seed_from_u64(23);
    let cases: &[(usize, usize, &[usize])] = &[
        (HEADS, HEAD_DIM, &[1, 64, 257, 1024]),
        (HEADS, HEAD_DIM, &[16]),
        (2, 128, &[3, 70]),
        (1, 256, &[65, 1]),
        // Not fused on the GPU (its flash head size is padded): the ops apart, as before.
        (2, 16, &[1, 17, 33]),
        (3, 40, &[5, 31]),
    ];
    for &(heads, head_dim, lens) in cases {
        let rows: usize = lens.iter().sum();
        let width = heads * head_dim;
        let qkv = rand_vec(&mut rng, rows * 3 * width, 2.0);
        let bias = bf16_weight(&mut rng, 3 * width, 1.0);
        let positions: Vec<u32> = (0..rows as u32).flat_map(|t| [t / 32, t % 32]).collect();
        let (bias_d, pos, cu) = (
            be.upload(&bias).unwrap(),
            indices(be, &positions),
            indices(be, &cu_of(lens)),
        );
        let batch = Varlen {
            cu_seqlens: &cu,
            num_seqs: lens.len(),
            rows,
        };
        let dims = (heads, head_dim, (head_dim as f64).powf(-0.5) as f32);
        let run = |fused: bool| {
            let mut qkv_d = padded(be, &qkv);
            let mut out = padded(be, &vec![f32::NAN; rows * width]);
            let args = ((&mut qkv_d, &bias_d), (&pos, THETA), batch, dims);
            match fused {
                true => be.bias_rope_attention(args.0, args.1, args.2, args.3, &mut out),
                false => bias_rope_attention_apart(be, args.0, args.1, args.2, args.3, &mut out),
            }
            .unwrap();
            read_all(be, &out, rows * width)
        };
        let (got, want) = (run(true), run(false));
        let what = format!("bias_rope_attention {heads}x{head_dim} {lens:?}");
        assert_eq!(
            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "{what}"
        );
        assert!(got[..rows * width].iter().all(|v| v.is_finite()), "{what}");
        assert!(
            got[rows * width..].iter().all(|v| v.is_nan()),
            "{what}: wrote past"
        );
        // Into a GEMM input (the tower's way; bf16 on the GPU for the flash head sizes): the
        // same bits both ways, each the f32 output rounded to nearest even where it is bf16.
        if head_dim.is_multiple_of(16) {
            let into_gemm_input = |fused: bool| {
                let mut qkv_d = padded(be, &qkv);
                let mut out = be.alloc_gemm_input(rows * width).unwrap();
                let args = ((&mut qkv_d, &bias_d), (&pos, THETA), batch, dims);
                match fused {
                    true => be.bias_rope_attention(args.0, args.1, args.2, args.3, &mut out),
                    false => {
                        bias_rope_attention_apart(be, args.0, args.1, args.2, args.3, &mut out)
                    }
                }
                .unwrap();
                be.read(&out, rows * width).unwrap()
            };
            let got = into_gemm_input(true);
            assert_eq!(got, into_gemm_input(false), "{what} into a GEMM input");
            if got != want[..rows * width] {
                let rounded: Vec<f32> = want[..rows * width]
                    .iter()
                    .map(|&v| half::bf16::from_f32(v).to_f32())
                    .collect();
                assert_eq!(
                    got, rounded,
                    "{what} into a GEMM input: the f32 output rounded"
                );
            }
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn bias_rope_attention_equals_the_ops_apart_on_the_gpu() {
    bias_rope_attention_matches_the_ops_apart(&gpu());
}

#[test]
fn bias_rope_attention_equals_the_ops_apart_on_the_cpu() {
    bias_rope_attention_matches_the_ops_apart(&CpuBackend::new());
}

/// The tower's attention on one 1024×1024 screenshot (4,096 patches, 16 heads of 64): time per
/// call and the tensor-core rate it reaches (QKᵀ and PV: 4·n²·heads·head_dim FLOP) in each
/// layout, printed (`attention_bidirectional_matches_cpu` checks the values, up to 1,024-patch
/// segments, in both layouts).
#[test]
#[ignore = "needs a GPU"]
fn attention_bidirectional_speed_on_a_full_screenshot() {
    let gpu = gpu();
    let mut rng = StdRng::seed_from_u64(16);
    let n = 4096;
    let width = HEADS * HEAD_DIM;
    let qkv = bf16_round(&rand_vec(&mut rng, n * 3 * width, 2.0));
    let qkv_d = padded(&gpu, &qkv);
    let cu = indices(&gpu, &cu_of(&[n]));
    let mut out = padded(&gpu, &vec![0.0; n * width]);
    let batch = Varlen {
        cu_seqlens: &cu,
        num_seqs: 1,
        rows: n,
    };
    let scale = (HEAD_DIM as f64).powf(-0.5) as f32;
    let flops = 4.0 * (n * n) as f64 * (HEADS * HEAD_DIM) as f64;
    // Each layout forced, then the one the op picks (the wide one for a whole screenshot, or on an
    // H100/H200 the warpgroup-MMA kernel).
    for (layout, rows_per_block) in [("narrow", Some(64)), ("wide", Some(128)), ("picked", None)] {
        CudaBackend::force_flash_query_rows(rows_per_block);
        let seconds = common::mean_seconds(&gpu, 20, || {
            gpu.attention_bidirectional(&qkv_d, batch, HEADS, HEAD_DIM, scale, &mut out)
                .unwrap()
        });
        eprintln!(
            "attention {n} patches, {HEADS}x{HEAD_DIM}, {layout}: {:.3} ms, {:.0} TFLOP/s",
            seconds * 1e3,
            flops / seconds / 1e12
        );
    }
    CudaBackend::force_flash_query_rows(None);
    // The rows, not the NaN padding `padded` puts after them.
    let got = read_all(&gpu, &out, n * width);
    assert!(
        got[..n * width].iter().all(|v| v.is_finite()),
        "every row written"
    );
}

// ---- refusals -----------------------------------------------------------------------------------

/// Fails unless `result` is the refusal of `op` and its message contains `says`.
#[track_caller]
fn assert_refused(result: Result<(), KernelError>, op: &str, says: &str) {
    let err = result.expect_err("must be refused");
    assert!(
        matches!(err, KernelError::Invalid { op: o, .. } if o == op),
        "{err}"
    );
    assert!(err.to_string().contains(says), "{err}");
}

#[test]
#[ignore = "needs a GPU"]
fn ops_refuse_buffers_of_the_wrong_type() {
    let gpu = gpu();
    let (rows, dim) = (2, 8);
    let x = gpu.alloc(rows * dim).unwrap();
    let w = gpu.upload(&[1.0; 8]).unwrap();
    let not_a_weight = gpu.alloc(dim).unwrap();
    let mut out = gpu.alloc(rows * dim).unwrap();
    let mut gemm_input = gpu.alloc_gemm_input(rows * 3 * dim).unwrap();
    let norm = |weight| row_norm(weight, rows, dim);
    // Weights and biases are uploads (bf16).
    let res = gpu.layer_norm(&x, norm(&not_a_weight), &w, &mut out);
    assert_refused(res, "layer_norm", "weight must be Bf16");
    let res = gpu.layer_norm(&x, norm(&w), &not_a_weight, &mut out);
    assert_refused(res, "layer_norm", "bias must be Bf16");
    let res = gpu.add_bias(&mut out, &not_a_weight, rows, dim);
    assert_refused(res, "add_bias", "bias must be Bf16");
    // Activations are f32, but for the outputs only a GEMM reads (a LayerNorm's, GELU(x + b)'s),
    // which may be bf16.
    let res = gpu.add_bias(&mut gemm_input, &w, rows, dim);
    assert_refused(res, "add_bias", "x must be F32");
    let res = gpu.add_in_place(&mut out, &gemm_input, rows * dim);
    assert_refused(res, "add_in_place", "delta must be F32");
    let res = gpu.gelu(&mut gemm_input, rows * dim, Gelu::Tanh);
    assert_refused(res, "gelu", "x must be F32");
    let (mut out2, mut gemm_input2) = (
        gpu.alloc(rows * dim).unwrap(),
        gpu.alloc_gemm_input(rows * dim).unwrap(),
    );
    let res = gpu.bias_gelu(&mut gemm_input2, &w, (rows, dim), Gelu::Tanh, &mut out2);
    assert_refused(res, "bias_gelu", "x must be F32");
    let res = gpu.add_bias_residual(&mut gemm_input2, &mut out2, &w, (rows, dim));
    assert_refused(res, "add_bias_residual", "residual must be F32");
    let cu = indices(&gpu, &cu_of(&[rows]));
    let batch = Varlen {
        cu_seqlens: &cu,
        num_seqs: 1,
        rows,
    };
    let res = gpu.attention_bidirectional(&gemm_input, batch, 2, 4, 0.5, &mut out);
    assert_refused(res, "attention_bidirectional", "qkv must be F32");
}

#[test]
#[ignore = "needs a GPU"]
fn ops_refuse_shapes_they_do_not_take() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let rows = 3;
    // Rotary heads must split in four; the frequency table holds heads up to 256 (the CPU has no
    // such limit).
    let mut x = gpu.alloc(rows * 260).unwrap();
    let pos = indices(&gpu, &[0; 6]);
    let mut x_h = vec![0.0; rows * 6];
    let res = cpu.rope_axial(&mut x_h, HeadLayout::dense(1, 6), &vec![0; 6], rows, THETA);
    assert_refused(res, "rope_axial", "multiple of 4");
    let res = gpu.rope_axial(&mut x, HeadLayout::dense(1, 6), &pos, rows, THETA);
    assert_refused(res, "rope_axial", "multiple of 4");
    let res = gpu.rope_axial(&mut x, HeadLayout::dense(1, 260), &pos, rows, THETA);
    assert_refused(res, "rope_axial", "up to 256");
    let short_pos = indices(&gpu, &[0; 5]);
    let res = gpu.rope_axial(&mut x, HeadLayout::dense(1, 8), &short_pos, rows, THETA);
    assert_refused(res, "rope_axial", "positions holds 5 values, needs 6");

    // Attention heads up to 256; buffers must hold the batch's rows.
    let cu = indices(&gpu, &cu_of(&[rows]));
    let batch = Varlen {
        cu_seqlens: &cu,
        num_seqs: 1,
        rows,
    };
    let qkv = gpu.alloc(rows * 3 * 257).unwrap();
    let mut out = gpu.alloc(rows * 257).unwrap();
    let res = gpu.attention_bidirectional(&qkv, batch, 1, 257, 1.0, &mut out);
    assert_refused(res, "attention_bidirectional", "head_dim 257 exceeds 256");
    let res = gpu.attention_bidirectional(&qkv, batch, 0, 64, 1.0, &mut out);
    assert_refused(res, "attention_bidirectional", "must be > 0");
    let mut short_out = gpu.alloc(rows * 64 - 1).unwrap();
    let res = gpu.attention_bidirectional(&qkv, batch, 1, 64, 1.0, &mut short_out);
    assert_refused(
        res,
        "attention_bidirectional",
        "batch has 3 rows, buffers hold 2",
    );

    // LayerNorm rows of 0 values, and an output too short.
    let w = gpu.upload(&[1.0; 8]).unwrap();
    let norm = |dim| row_norm(&w, rows, dim);
    let xs = gpu.alloc(rows * 8).unwrap();
    let res = gpu.layer_norm(&xs, norm(0), &w, &mut out);
    assert_refused(res, "layer_norm", "dim is 0");
    let mut short = gpu.alloc(rows * 8 - 1).unwrap();
    let res = gpu.layer_norm(&xs, norm(8), &w, &mut short);
    assert_refused(res, "layer_norm", "out holds 23 values, needs 24");
}

/// The patch rows of `images` (RGB bytes, width, height) written by `be` into a GEMM input (or,
/// with `f32_dst`, an f32 buffer) at `firsts`, every other row of the `rows` holding
/// [`UNTOUCHED_ROW`], read back.
fn patch_rows_on<B: VisionBackend>(
    be: &B,
    images: &[(Vec<u8>, usize, usize)],
    firsts: &[usize],
    rows: usize,
    f32_dst: bool,
) -> Vec<f32> {
    let len = rows * PATCH_VALUES;
    let mut dst = if f32_dst {
        be.alloc(len).unwrap()
    } else {
        be.alloc_gemm_input(len).unwrap()
    };
    be.write(&mut dst, &vec![UNTOUCHED_ROW; len]).unwrap();
    let parts: Vec<PatchRows> = images
        .iter()
        .zip(firsts)
        .map(|((rgb, w, h), &first_row)| PatchRows {
            image: PatchImage::new(rgb, *w, *h),
            first_row,
        })
        .collect();
    be.write_patch_rows(&mut dst, &parts).unwrap();
    be.read(&dst, len).unwrap()
}

/// What rows no image covers hold (exact in bf16).
const UNTOUCHED_ROW: f32 = 7.0;

/// Asserts `got` and `want` hold the same bits, naming the first value that differs.
#[track_caller]
fn assert_same_bits(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        let (row, col) = (i / PATCH_VALUES, i % PATCH_VALUES);
        panic!(
            "{what}: row {row} value {col}: cuda {} vs cpu {}",
            got[i], want[i]
        );
    }
}

#[test]
#[ignore = "needs a GPU"]
fn patch_rows_are_the_cpu_values_rounded_to_bf16_bit_for_bit() {
    let gpu = gpu();
    let cpu = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(31);
    let mut image = |w: usize, h: usize| {
        let rgb: Vec<u8> = (0..w * h * 3).map(|_| rng.gen()).collect();
        (rgb, w, h)
    };
    let patches = |(_, w, h): &(Vec<u8>, usize, usize)| w * h / 256;
    // One image at row 0: square, one merge block, non-square, grid widths of 6 and 10.
    let singles = [
        image(1024, 1024),
        image(32, 32),
        image(480, 224),
        image(96, 64),
        image(160, 608),
    ];
    for single in &singles {
        let (_, w, h) = single;
        let images = std::slice::from_ref(single);
        let rows = patches(single);
        let want = patch_rows_on(&cpu, images, &[0], rows, false);
        let got = patch_rows_on(&gpu, images, &[0], rows, false);
        assert_same_bits(&got, &bf16_round(&want), &format!("{w}x{h} into bf16"));
        let got = patch_rows_on(&gpu, images, &[0], rows, true);
        assert_same_bits(&got, &want, &format!("{w}x{h} into f32"));
    }
    // Several images in one buffer, out of row order, rows between and after them: a 1024x1024
    // and a non-square one, then four (after a larger call, so the staging buffers are reused).
    let pairs: [&[usize]; 2] = [&[0, 2], &[3, 1, 4, 2]];
    for order in pairs {
        let images: Vec<_> = order.iter().map(|&i| singles[i].clone()).collect();
        let mut firsts = Vec::new();
        let mut row = 3;
        for im in &images {
            firsts.push(row);
            row += patches(im) + 2;
        }
        // Given to the op last image first.
        let (images, firsts): (Vec<_>, Vec<_>) = images.into_iter().zip(firsts).rev().unzip();
        let want = patch_rows_on(&cpu, &images, &firsts, row, false);
        assert!(want[..3 * PATCH_VALUES].iter().all(|&v| v == UNTOUCHED_ROW));
        let got = patch_rows_on(&gpu, &images, &firsts, row, false);
        assert_same_bits(&got, &bf16_round(&want), &format!("images {order:?}"));
    }
    // Refused as on the CPU.
    let mut short = gpu.alloc_gemm_input(PATCH_VALUES).unwrap();
    let (rgb, w, h) = &singles[3];
    let part = PatchRows {
        image: PatchImage::new(rgb, *w, *h),
        first_row: 0,
    };
    let res = gpu.write_patch_rows(&mut short, &[part]);
    assert_refused(res, "write_patch_rows", "ends at row 24");

    // Four 1024x1024 screenshots (a full tower pass): staged, copied up and packed, for the log.
    let four: Vec<PatchRows> = (0..4)
        .map(|i| PatchRows {
            image: PatchImage::new(&singles[0].0, 1024, 1024),
            first_row: i * 4096,
        })
        .collect();
    let mut dst = gpu.alloc_gemm_input(4 * 4096 * PATCH_VALUES).unwrap();
    let secs = common::mean_seconds(&gpu, 20, || gpu.write_patch_rows(&mut dst, &four).unwrap());
    eprintln!(
        "write_patch_rows of four 1024x1024 images, to the end of the kernel: {:.3} ms",
        secs * 1e3
    );
}
