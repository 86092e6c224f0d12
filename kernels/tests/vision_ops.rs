//! The CPU vision ops against direct formulas, plus the properties the vision tower relies on
//! (attention is bidirectional within a segment and blind across segments; the 2-D rotary makes
//! scores depend only on relative patch offsets).

use instinct_kernels::backend::{Gelu, VisionBackend};
use instinct_kernels::RowNorm;
use instinct_kernels::{CpuBackend, HeadLayout, Varlen};
use rand::rngs::StdRng;
use rand::SeedableRng;

mod common;
use common::{max_diff, rand_unit as rand_vec};

#[test]
fn layer_norm_matches_formula() {
    let be = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(1);
    let (rows, dim, eps) = (5, 24, 1e-6f32);
    let x: Vec<f32> = rand_vec(&mut rng, rows * dim)
        .iter()
        .map(|v| v * 3.0 + 0.7)
        .collect();
    let (w, b) = (rand_vec(&mut rng, dim), rand_vec(&mut rng, dim));
    let mut out = vec![0.0; rows * dim];
    be.layer_norm(
        &x,
        RowNorm {
            weight: &w,
            rows,
            dim,
            eps,
        },
        &b,
        &mut out,
    )
    .unwrap();
    let mut want = vec![0.0f32; rows * dim];
    for r in 0..rows {
        let row = &x[r * dim..(r + 1) * dim];
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / dim as f64;
        let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / dim as f64;
        for i in 0..dim {
            want[r * dim + i] = ((row[i] as f64 - mean) / (var + eps as f64).sqrt() * w[i] as f64
                + b[i] as f64) as f32;
        }
    }
    assert!(max_diff(&out, &want) < 1e-5);
    // Too short an output is refused.
    let mut short = vec![0.0; rows * dim - 1];
    assert!(be
        .layer_norm(
            &x,
            RowNorm {
                weight: &w,
                rows,
                dim,
                eps
            },
            &b,
            &mut short
        )
        .is_err());
}

#[test]
fn gelu_variants_match_reference_values() {
    let be = CpuBackend::new();
    // torch.nn.functional.gelu(x) and gelu(x, approximate="tanh") in float64.
    let x = vec![-3.0f32, -1.0, 0.0, 0.5, 1.0, 2.5];
    let erf = [
        -0.00404969409489031,
        -0.15865525393145702,
        0.0,
        0.34573123063700656,
        0.841344746068543,
        2.4844758366855597,
    ];
    let tanh = [
        -0.0036373920817729943,
        -0.15880800939172324,
        0.0,
        0.34571400982514394,
        0.8411919906082768,
        2.484915733910001,
    ];
    for (kind, want) in [(Gelu::Erf, erf), (Gelu::Tanh, tanh)] {
        let mut y = x.clone();
        be.gelu(&mut y, x.len(), kind).unwrap();
        for (a, b) in y.iter().zip(want) {
            assert!((*a as f64 - b).abs() < 1e-6, "{kind:?}: {a} vs {b}");
        }
    }
}

#[test]
fn bias_and_residual_adds() {
    let be = CpuBackend::new();
    let mut x = vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    be.add_bias(&mut x, &vec![10.0, 20.0, 30.0], 2, 3).unwrap();
    assert_eq!(x, [11.0, 22.0, 33.0, 14.0, 25.0, 36.0]);
    be.add_in_place(&mut x, &vec![1.0; 6], 4).unwrap();
    assert_eq!(x, [12.0, 23.0, 34.0, 15.0, 25.0, 36.0]);
    assert!(be.add_bias(&mut x, &vec![1.0; 2], 2, 3).is_err());
}

/// One row, one head, head_dim 8: the explicit rotation.
#[test]
fn axial_rope_rotates_row_then_column_frequencies() {
    let be = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(2);
    let d = 8;
    let x0 = rand_vec(&mut rng, d);
    let mut x = x0.clone();
    let (row, col, theta) = (3u32, 5u32, 10000f32);
    be.rope_axial(&mut x, HeadLayout::dense(1, d), &vec![row, col], 1, theta)
        .unwrap();
    // inv_freq over D/2 = 4 with step 2: [1, theta^-0.5]; angles [r·f0, r·f1, c·f0, c·f1].
    let f = [1.0f64, (theta as f64).powf(-0.5)];
    let angles = [
        row as f64 * f[0],
        row as f64 * f[1],
        col as f64 * f[0],
        col as f64 * f[1],
    ];
    for j in 0..4 {
        let (a, b) = (x0[j] as f64, x0[j + 4] as f64);
        let (c, s) = (angles[j].cos(), angles[j].sin());
        assert!((x[j] as f64 - (a * c - b * s)).abs() < 1e-5);
        assert!((x[j + 4] as f64 - (b * c + a * s)).abs() < 1e-5);
    }
}

#[test]
fn axial_rope_scores_depend_only_on_relative_offsets() {
    let be = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(3);
    let d = 16;
    let (q, k) = (rand_vec(&mut rng, d), rand_vec(&mut rng, d));
    let score = |pq: [u32; 2], pk: [u32; 2]| {
        let (mut a, mut b) = (q.clone(), k.clone());
        let layout = HeadLayout::dense(1, d);
        be.rope_axial(&mut a, layout, &pq.to_vec(), 1, 10000.0)
            .unwrap();
        be.rope_axial(&mut b, layout, &pk.to_vec(), 1, 10000.0)
            .unwrap();
        a.iter().zip(&b).map(|(x, y)| x * y).sum::<f32>()
    };
    let base = score([1, 2], [4, 7]);
    assert!((base - score([11, 5], [14, 10])).abs() < 1e-4);
    // Swapping the axes changes the score: rows and columns use different halves of the head.
    assert!((base - score([2, 1], [7, 4])).abs() > 1e-3);
}

fn attention_reference(
    qkv: &[f32],
    lens: &[usize],
    heads: usize,
    d: usize,
    scale: f32,
) -> Vec<f32> {
    let w = heads * d;
    let rows: usize = lens.iter().sum();
    let mut out = vec![0.0f32; rows * w];
    let mut start = 0;
    for &len in lens {
        for h in 0..heads {
            for i in start..start + len {
                let q = &qkv[i * 3 * w + h * d..][..d];
                let scores: Vec<f64> = (start..start + len)
                    .map(|j| {
                        let k = &qkv[j * 3 * w + w + h * d..][..d];
                        q.iter()
                            .zip(k)
                            .map(|(a, b)| *a as f64 * *b as f64)
                            .sum::<f64>()
                            * scale as f64
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let denom: f64 = scores.iter().map(|s| (s - max).exp()).sum();
                for (j, s) in (start..start + len).zip(&scores) {
                    let v = &qkv[j * 3 * w + 2 * w + h * d..][..d];
                    for e in 0..d {
                        out[i * w + h * d + e] += ((s - max).exp() / denom * v[e] as f64) as f32;
                    }
                }
            }
        }
        start += len;
    }
    out
}

#[test]
fn bidirectional_attention_matches_formula_within_segments() {
    let be = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(4);
    let (heads, d, lens) = (2, 8, [5usize, 3]);
    let rows: usize = lens.iter().sum();
    let qkv = rand_vec(&mut rng, rows * 3 * heads * d);
    let cu = vec![0u32, 5, 8];
    let scale = (d as f32).powf(-0.5);
    let run = |qkv: &Vec<f32>| {
        let mut out = vec![0.0; rows * heads * d];
        let batch = Varlen {
            cu_seqlens: &cu,
            num_seqs: 2,
            rows,
        };
        be.attention_bidirectional(qkv, batch, heads, d, scale, &mut out)
            .unwrap();
        out
    };
    let out = run(&qkv);
    assert!(max_diff(&out, &attention_reference(&qkv, &lens, heads, d, scale)) < 1e-5);

    // Changing the last row of segment 0 changes its first row (not causal) but not segment 1.
    let mut changed = qkv.clone();
    let w = heads * d;
    for v in &mut changed[4 * 3 * w..5 * 3 * w] {
        *v += 0.5;
    }
    let out2 = run(&changed);
    assert!(max_diff(&out[..w], &out2[..w]) > 1e-4);
    assert_eq!(&out[5 * w..], &out2[5 * w..]);
}
