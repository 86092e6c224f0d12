//! Each CPU op against a direct formula, plus the structural properties the model relies on
//! (causality, packing, carried conv window, RoPE relativity).

use instinct_kernels::{
    AttentionDims, Backend, CpuBackend, HeadLayout, Rope, Store, Strided, Varlen,
};
use instinct_kernels::{
    AttentionOutput, Conv1d, ConvWindow, DeltaGates, GateOutputs, GatedNorm, GemmShape, PrefixKv,
    Projection, QkPrologue, RowNorm,
};
use rand::rngs::StdRng;
use rand::SeedableRng;

mod common;
use common::{cpu_gates, max_diff, rand_unit as rand_vec};

fn silu64(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

fn sigmoid64(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn cu_of(lens: &[usize]) -> Vec<u32> {
    let mut cu = vec![0u32];
    for &l in lens {
        cu.push(cu.last().unwrap() + l as u32);
    }
    cu
}

#[test]
fn rms_norm_matches_formula_and_fused_add() {
    let cpu = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(1);
    let (rows, dim) = (5, 37);
    let x = rand_vec(&mut rng, rows * dim);
    let w = rand_vec(&mut rng, dim);
    let mut out = vec![0.0; rows * dim];
    cpu.rms_norm(
        &x,
        RowNorm {
            weight: &w,
            rows,
            dim,
            eps: 1e-6,
        },
        &mut out,
    )
    .unwrap();
    for t in 0..rows {
        let row = &x[t * dim..(t + 1) * dim];
        let ms: f64 = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / dim as f64;
        for d in 0..dim {
            let want = row[d] as f64 / (ms + 1e-6).sqrt() * (1.0 + w[d] as f64);
            assert!(
                (out[t * dim + d] as f64 - want).abs() < 1e-5,
                "row {t} dim {d}"
            );
        }
    }
    // Fused residual add: residual becomes x + delta, out is its norm.
    let delta = rand_vec(&mut rng, rows * dim);
    let mut residual = x.clone();
    let mut fused = vec![0.0; rows * dim];
    cpu.add_rms_norm(
        &mut residual,
        &delta,
        RowNorm {
            weight: &w,
            rows,
            dim,
            eps: 1e-6,
        },
        &mut fused,
    )
    .unwrap();
    let sum: Vec<f32> = x.iter().zip(&delta).map(|(a, b)| a + b).collect();
    assert_eq!(residual, sum);
    let mut separate = vec![0.0; rows * dim];
    cpu.rms_norm(
        &sum,
        RowNorm {
            weight: &w,
            rows,
            dim,
            eps: 1e-6,
        },
        &mut separate,
    )
    .unwrap();
    assert_eq!(fused, separate);
}

#[test]
fn gemm_matches_naive_on_odd_sizes() {
    let cpu = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(2);
    for (rows, k, n) in [(1, 1, 1), (3, 17, 5), (37, 64, 129), (8, 300, 33)] {
        let x = rand_vec(&mut rng, rows * k);
        let w = rand_vec(&mut rng, n * k);
        let mut y = vec![f32::NAN; rows * n];
        cpu.gemm(&x, &w, GemmShape::new(rows, k, n), &mut y)
            .unwrap();
        for r in 0..rows {
            for o in 0..n {
                let want: f64 = (0..k)
                    .map(|i| x[r * k + i] as f64 * w[o * k + i] as f64)
                    .sum();
                assert!(
                    (y[r * n + o] as f64 - want).abs() < 1e-4,
                    "{rows}x{k}x{n} at {r},{o}"
                );
            }
        }
    }
    let mut y = vec![0.0; 3];
    assert!(cpu
        .gemm(
            &vec![0.0; 5],
            &vec![0.0; 6],
            GemmShape::new(2, 3, 2),
            &mut y
        )
        .is_err());
}

/// `Store::Add` is the GEMM then `y += product`, bit for bit (the residual add the forward pass
/// used to do separately); with no input columns it leaves `y` as it is.
#[test]
fn gemm_adding_to_y_is_the_gemm_then_the_add() {
    let cpu = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(3);
    for (rows, k, n) in [(1, 1, 1), (3, 17, 5), (37, 64, 129), (8, 300, 33)] {
        let x = rand_vec(&mut rng, rows * k);
        let w = rand_vec(&mut rng, n * k);
        let y0 = rand_vec(&mut rng, rows * n);
        let mut product = vec![0.0; rows * n];
        cpu.gemm(&x, &w, GemmShape::new(rows, k, n), &mut product)
            .unwrap();
        let want: Vec<u32> = y0
            .iter()
            .zip(&product)
            .map(|(a, b)| (a + b).to_bits())
            .collect();
        let mut y = y0.clone();
        cpu.gemm_to(&x, &w, GemmShape::new(rows, k, n), Store::Add, &mut y)
            .unwrap();
        let got: Vec<u32> = y.iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, want, "{rows}x{k}x{n}");
    }
    let mut y = vec![1.5; 4];
    cpu.gemm_to(
        &vec![],
        &vec![],
        GemmShape::new(2, 0, 2),
        Store::Add,
        &mut y,
    )
    .unwrap();
    assert_eq!(y, [1.5; 4]);
}

#[test]
fn head_rms_norm_touches_only_query_slots_of_interleaved_gate_layout() {
    let cpu = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(3);
    let (rows, heads, d) = (3, 2, 8);
    let layout = HeadLayout {
        heads,
        head_dim: d,
        head_stride: 2 * d,
        row_stride: 2 * heads * d,
        offset: 0,
    };
    let orig = rand_vec(&mut rng, rows * 2 * heads * d);
    let w = rand_vec(&mut rng, d);
    let mut x = orig.clone();
    cpu.head_rms_norm(&mut x, &w, layout, rows, 1e-6).unwrap();
    for t in 0..rows {
        for h in 0..heads {
            let base = t * 2 * heads * d + h * 2 * d;
            let q = &orig[base..base + d];
            let ms: f64 = q.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / d as f64;
            for i in 0..d {
                let want = q[i] as f64 / (ms + 1e-6).sqrt() * (1.0 + w[i] as f64);
                assert!((x[base + i] as f64 - want).abs() < 1e-5);
            }
            assert_eq!(
                x[base + d..base + 2 * d],
                orig[base + d..base + 2 * d],
                "gate changed"
            );
        }
    }
}

const QWEN_ROPE: Rope = Rope {
    rotary_dim: 64,
    theta: 1e7,
    section: [11, 11, 10],
    interleaved: true,
};

#[test]
fn mrope_axis_rule_is_thw_interleaved() {
    let axes: Vec<usize> = (0..32).map(|j| QWEN_ROPE.axis(j)).collect();
    let want: Vec<usize> = (0..32).map(|j| j % 3).collect();
    assert_eq!(axes, want);
    assert_eq!(
        [0, 1, 2].map(|a| axes.iter().filter(|&&x| x == a).count()),
        [11, 11, 10]
    );
    let contiguous = Rope {
        interleaved: false,
        ..QWEN_ROPE
    };
    assert_eq!(
        (
            contiguous.axis(10),
            contiguous.axis(11),
            contiguous.axis(22)
        ),
        (0, 1, 2)
    );
}

/// Applies 1-D RoPE directly in f64 to one head.
fn rope_1d_f64(head: &[f32], pos: f64, rot: usize, theta: f64) -> Vec<f64> {
    let half = rot / 2;
    let mut out: Vec<f64> = head.iter().map(|&v| v as f64).collect();
    for j in 0..half {
        let ang = pos * theta.powf(-(2.0 * j as f64) / rot as f64);
        let (a, b) = (head[j] as f64, head[j + half] as f64);
        out[j] = a * ang.cos() - b * ang.sin();
        out[j + half] = b * ang.cos() + a * ang.sin();
    }
    out
}

#[test]
fn mrope_with_text_positions_is_plain_rope_and_passes_tail_through() {
    let cpu = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(4);
    let (rows, heads, d) = (40, 3, 256);
    let layout = HeadLayout::dense(heads, d);
    let orig = rand_vec(&mut rng, rows * heads * d);
    let positions: Vec<u32> = (0..rows as u32)
        .flat_map(|p| [p * 7, p * 7, p * 7])
        .collect();
    let mut x = orig.clone();
    cpu.rope(&mut x, layout, &positions, rows, &QWEN_ROPE)
        .unwrap();
    for t in 0..rows {
        for h in 0..heads {
            let base = (t * heads + h) * d;
            let want = rope_1d_f64(&orig[base..base + d], (t * 7) as f64, 64, 1e7);
            for i in 0..d {
                // f32 angles of positions up to ~300: error ~ |pos| · 2^-24.
                assert!(
                    (x[base + i] as f64 - want[i]).abs() < 2e-4,
                    "t {t} h {h} i {i}"
                );
            }
            assert_eq!(x[base + 64..base + d], orig[base + 64..base + d]);
        }
    }
}

#[test]
fn mrope_uses_each_axis_for_its_frequencies() {
    let cpu = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(5);
    let d = 64;
    let orig = rand_vec(&mut rng, d);
    let pos = [3u32, 50, 900];
    let mut x = orig.clone();
    cpu.rope(
        &mut x,
        HeadLayout::dense(1, d),
        &pos.to_vec(),
        1,
        &QWEN_ROPE,
    )
    .unwrap();
    for j in 0..32 {
        let p = pos[j % 3] as f64;
        let ang = p * 1e7f64.powf(-(2.0 * j as f64) / 64.0);
        let want_lo = orig[j] as f64 * ang.cos() - orig[j + 32] as f64 * ang.sin();
        assert!((x[j] as f64 - want_lo).abs() < 1e-3, "pair {j}");
    }
}

#[test]
fn rope_scores_depend_only_on_position_difference() {
    let cpu = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(6);
    let d = 32;
    let rope = Rope {
        rotary_dim: 32,
        theta: 10000.0,
        section: [16, 0, 0],
        interleaved: true,
    };
    let (q, k) = (rand_vec(&mut rng, d), rand_vec(&mut rng, d));
    let score = |pq: u32, pk: u32| {
        let mut qq = q.clone();
        let mut kk = k.clone();
        cpu.rope(&mut qq, HeadLayout::dense(1, d), &vec![pq; 3], 1, &rope)
            .unwrap();
        cpu.rope(&mut kk, HeadLayout::dense(1, d), &vec![pk; 3], 1, &rope)
            .unwrap();
        qq.iter().zip(&kk).map(|(a, b)| a * b).sum::<f32>()
    };
    assert!((score(10, 4) - score(26, 20)).abs() < 1e-4);
    assert!(
        (score(10, 4) - score(10, 5)).abs() > 1e-4,
        "rotation had no effect"
    );
}

/// Naive gated causal GQA in f64 for one packed batch.
fn attention_f64(qg: &[f32], k: &[f32], v: &[f32], cu: &[u32], dims: AttentionDims) -> Vec<f32> {
    let AttentionDims {
        q_heads: hq,
        kv_heads: hk,
        head_dim: d,
        scale,
    } = dims;
    let rows = *cu.last().unwrap() as usize;
    let mut out = vec![0.0f32; rows * hq * d];
    for s in 0..cu.len() - 1 {
        let (a, b) = (cu[s] as usize, cu[s + 1] as usize);
        for h in 0..hq {
            let kh = h / (hq / hk);
            for i in a..b {
                let q = &qg[i * 2 * hq * d + h * 2 * d..][..d];
                let gate = &qg[i * 2 * hq * d + h * 2 * d + d..][..d];
                let scores: Vec<f64> = (a..=i)
                    .map(|j| {
                        let kj = &k[j * hk * d + kh * d..][..d];
                        q.iter()
                            .zip(kj)
                            .map(|(x, y)| *x as f64 * *y as f64)
                            .sum::<f64>()
                            * scale as f64
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = scores.iter().map(|s| (s - m).exp()).sum();
                for e in 0..d {
                    let o: f64 = (a..=i)
                        .zip(&scores)
                        .map(|(j, s)| (s - m).exp() / z * v[j * hk * d + kh * d + e] as f64)
                        .sum();
                    out[i * hq * d + h * d + e] = (o * sigmoid64(gate[e] as f64)) as f32;
                }
            }
        }
    }
    out
}

#[test]
fn attention_matches_naive_is_causal_and_packs() {
    let cpu = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(7);
    let dims = AttentionDims {
        q_heads: 4,
        kv_heads: 2,
        head_dim: 8,
        scale: 8f32.powf(-0.5),
    };
    let lens = [5usize, 1, 9];
    let rows: usize = lens.iter().sum();
    let qg = rand_vec(&mut rng, rows * 2 * 4 * 8);
    let k = rand_vec(&mut rng, rows * 2 * 8);
    let v = rand_vec(&mut rng, rows * 2 * 8);
    let cu = cu_of(&lens);
    let run = |qg: &[f32], k: &[f32], v: &[f32], cu: &Vec<u32>| {
        let rows = *cu.last().unwrap() as usize;
        let mut out = vec![f32::NAN; rows * 32];
        let batch = Varlen {
            cu_seqlens: cu,
            num_seqs: cu.len() - 1,
            rows,
        };
        cpu.attention(
            &qg.to_vec(),
            &k.to_vec(),
            &v.to_vec(),
            batch,
            dims,
            &mut out,
        )
        .unwrap();
        out
    };
    let out = run(&qg, &k, &v, &cu);
    assert!(max_diff(&out, &attention_f64(&qg, &k, &v, &cu, dims)) < 1e-5);
    // Each sequence alone gives the same rows.
    for s in 0..lens.len() {
        let (a, b) = (cu[s] as usize, cu[s + 1] as usize);
        let alone = run(
            &qg[a * 64..b * 64],
            &k[a * 16..b * 16],
            &v[a * 16..b * 16],
            &vec![0, (b - a) as u32],
        );
        assert_eq!(alone, out[a * 32..b * 32], "sequence {s}");
    }
    // Causality: the first 4 tokens of the last sequence alone equal its first 4 rows.
    let a = cu[2] as usize;
    let prefix = run(
        &qg[a * 64..(a + 4) * 64],
        &k[a * 16..(a + 4) * 16],
        &v[a * 16..(a + 4) * 16],
        &vec![0, 4],
    );
    assert_eq!(prefix, out[a * 32..(a + 4) * 32]);
}

/// Four query heads over two kv heads of 16, and a multi-axis rope over half of each head: the
/// attention shape the stacked-projection tests use.
fn small_attention() -> (AttentionDims, Rope) {
    let dims = AttentionDims {
        q_heads: 4,
        kv_heads: 2,
        head_dim: 16,
        scale: 16f32.powf(-0.5),
    };
    let rope = Rope {
        rotary_dim: 8,
        theta: 10_000.0,
        section: [2, 1, 1],
        interleaved: true,
    };
    (dims, rope)
}

/// `gated_attention` on a stacked q|gate|k|v projection is the head norms and rope on its q and k
/// heads, then `attention` (or `attention_last`) on the three blocks split apart: the same bits.
#[test]
fn gated_attention_is_norm_rope_then_attention_on_the_blocks() {
    let cpu = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(19);
    let (dims, rope) = small_attention();
    let lens = [5usize, 1, 9];
    let cu = cu_of(&lens);
    let rows: usize = lens.iter().sum();
    let width = dims.stacked_width();
    assert_eq!(width, 2 * (4 + 2) * 16);
    let qkv = rand_vec(&mut rng, rows * width);
    let (q_norm, k_norm) = (rand_vec(&mut rng, 16), rand_vec(&mut rng, 16));
    let positions: Vec<u32> = (0..rows as u32).flat_map(|t| [t, t / 2, t / 3]).collect();
    let batch = Varlen {
        cu_seqlens: &cu,
        num_seqs: lens.len(),
        rows,
    };
    let [qg_at, k_at, v_at] = dims.stacked_blocks();
    let block = |at: Strided, w: usize| -> Vec<f32> {
        (0..rows)
            .flat_map(|t| qkv[at.at(t, 0)..at.at(t, w)].to_vec())
            .collect()
    };
    let (mut qg, mut k, v) = (block(qg_at, 128), block(k_at, 32), block(v_at, 32));
    let q_layout = HeadLayout {
        head_stride: 32,
        row_stride: 128,
        ..HeadLayout::dense(4, 16)
    };
    cpu.qk_norm_rope(
        (&mut qg, &q_norm, q_layout),
        (&mut k, &k_norm, HeadLayout::dense(2, 16)),
        &positions,
        rows,
        &rope,
        1e-6,
    )
    .unwrap();
    for last in [false, true] {
        let out_rows = if last { lens.len() } else { rows };
        let mut want = vec![f32::NAN; out_rows * 64];
        if last {
            cpu.attention_last(&qg, &k, &v, batch, dims, &mut want)
        } else {
            cpu.attention(&qg, &k, &v, batch, dims, &mut want)
        }
        .unwrap();
        let mut got = vec![f32::NAN; out_rows * 64];
        cpu.gated_attention(
            &mut qkv.clone(),
            QkPrologue {
                q_norm: &q_norm,
                k_norm: &k_norm,
                positions: &positions,
                rope: &rope,
                eps: 1e-6,
            },
            batch,
            dims,
            last,
            &mut got,
        )
        .unwrap();
        assert_eq!(
            got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "last {last}"
        );
    }
}

/// `gated_attention_carried`: a sequence's tail attending over its prefix's k and v (as the
/// prefix's own pass wrote them out) answers as the whole sequence does, next to a sequence with
/// no prefix in the same batch; with no prefix and no kv output it is `gated_attention`, bit for
/// bit.
#[test]
fn attention_over_a_carried_prefix_equals_attention_over_the_whole_sequence() {
    let cpu = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(23);
    let (dims, rope) = small_attention();
    let (width, kv_w, out_w) = (dims.stacked_width(), 32, 64);
    let (q_norm, k_norm) = (rand_vec(&mut rng, 16), rand_vec(&mut rng, 16));
    // Sequence 0: 7 rows, cut after 3. Sequence 1: 4 rows, never cut.
    let (seq0, seq1) = (rand_vec(&mut rng, 7 * width), rand_vec(&mut rng, 4 * width));
    let text =
        |range: std::ops::Range<u32>| -> Vec<u32> { range.flat_map(|p| [p, p, p]).collect() };
    // Runs `parts` (stacked rows and their first position) as one batch; returns out and k|v.
    let run = |parts: &[(&[f32], u32)], prefix: Option<PrefixKv<'_, CpuBackend>>, last: bool| {
        let lens: Vec<usize> = parts.iter().map(|(x, _)| x.len() / width).collect();
        let cu = cu_of(&lens);
        let rows: usize = lens.iter().sum();
        let mut qkv: Vec<f32> = parts.iter().flat_map(|(x, _)| x.to_vec()).collect();
        let positions: Vec<u32> = parts
            .iter()
            .zip(&lens)
            .flat_map(|((_, at), &len)| text(*at..*at + len as u32))
            .collect();
        let out_rows = if last { lens.len() } else { rows };
        let (mut out, mut k, mut v) = (
            vec![f32::NAN; out_rows * out_w],
            vec![f32::NAN; rows * kv_w],
            vec![f32::NAN; rows * kv_w],
        );
        let prologue = QkPrologue {
            q_norm: &q_norm,
            k_norm: &k_norm,
            positions: &positions,
            rope: &rope,
            eps: 1e-6,
        };
        let batch = Varlen {
            cu_seqlens: &cu,
            num_seqs: lens.len(),
            rows,
        };
        let output = AttentionOutput {
            out: &mut out,
            last_only: last,
            kv: Some((&mut k, &mut v)),
        };
        cpu.gated_attention_carried(&mut qkv, prologue, batch, dims, prefix, output)
            .unwrap();
        (out, k, v)
    };
    for last in [false, true] {
        let (whole, k_whole, v_whole) = run(&[(&seq0, 0), (&seq1, 0)], None, last);
        let (_, k_pre, v_pre) = run(&[(&seq0[..3 * width], 0)], None, false);
        assert_eq!(
            k_pre,
            k_whole[..3 * kv_w],
            "the prefix's keys as the whole pass has them"
        );
        assert_eq!(v_pre, v_whole[..3 * kv_w]);
        let cu_prefix = vec![0u32, 3, 3];
        let prefix = PrefixKv {
            k: &k_pre,
            v: &v_pre,
            cu_prefix: &cu_prefix,
            rows: 3,
        };
        let (tail, k_tail, _) = run(&[(&seq0[3 * width..], 3), (&seq1, 0)], Some(prefix), last);
        let want: Vec<f32> = if last {
            whole.clone()
        } else {
            [&whole[3 * out_w..7 * out_w], &whole[7 * out_w..]].concat()
        };
        assert!(max_diff(&tail, &want) < 1e-6, "last {last}");
        assert_eq!(k_tail[..4 * kv_w], k_whole[3 * kv_w..7 * kv_w]);
        // A prefix it ignored would change the answer.
        let (alone, _, _) = run(&[(&seq0[3 * width..], 3), (&seq1, 0)], None, last);
        assert!(
            max_diff(&alone[..out_w], &want[..out_w]) > 1e-3,
            "last {last}"
        );

        let mut plain = vec![f32::NAN; whole.len()];
        let positions = text(0..7).into_iter().chain(text(0..4)).collect::<Vec<_>>();
        cpu.gated_attention(
            &mut [seq0.clone(), seq1.clone()].concat(),
            QkPrologue {
                q_norm: &q_norm,
                k_norm: &k_norm,
                positions: &positions,
                rope: &rope,
                eps: 1e-6,
            },
            Varlen {
                cu_seqlens: &cu_of(&[7, 4]),
                num_seqs: 2,
                rows: 11,
            },
            dims,
            last,
            &mut plain,
        )
        .unwrap();
        assert_eq!(
            plain.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            whole.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }
}

#[test]
fn conv_with_carried_window_equals_conv_over_concatenation() {
    let cpu = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(8);
    let (ch, kern) = (6, 4);
    let x = rand_vec(&mut rng, 11 * ch);
    let w = rand_vec(&mut rng, ch * kern);
    let conv = |x: &[f32], cu: Vec<u32>, win: Option<&Vec<f32>>| {
        let rows = *cu.last().unwrap() as usize;
        let seqs = cu.len() - 1;
        let mut out = vec![f32::NAN; rows * ch];
        let mut win_out = vec![f32::NAN; seqs * (kern - 1) * ch];
        let batch = Varlen {
            cu_seqlens: &cu,
            num_seqs: seqs,
            rows,
        };
        cpu.conv1d_silu(
            Conv1d {
                x: &x.to_vec(),
                x_at: Strided::dense(ch),
                weight: &w,
                channels: ch,
                kernel: kern,
            },
            batch,
            ConvWindow {
                input: win,
                output: Some(&mut win_out),
                output_at: None,
            },
            &mut out,
        )
        .unwrap();
        (out, win_out)
    };
    let (full, full_win) = conv(&x, vec![0, 11], None);
    // Direct formula with zero history.
    for t in 0..11 {
        for c in 0..ch {
            let acc: f64 = (0..kern)
                .filter(|&i| t + i >= kern - 1)
                .map(|i| w[c * kern + i] as f64 * x[(t + i + 1 - kern) * ch + c] as f64)
                .sum();
            assert!((full[t * ch + c] as f64 - silu64(acc)).abs() < 1e-6);
        }
    }
    assert_eq!(
        full_win,
        x[8 * ch..11 * ch],
        "window_out is the last 3 pre-conv rows"
    );
    // Split at 2 (shorter than the window) and at 7; carry the window each time.
    for split in [2usize, 7] {
        let (head, head_win) = conv(&x[..split * ch], vec![0, split as u32], None);
        let (tail, tail_win) = conv(
            &x[split * ch..],
            vec![0, (11 - split) as u32],
            Some(&head_win),
        );
        assert_eq!(head, full[..split * ch]);
        assert!(max_diff(&tail, &full[split * ch..]) < 1e-6, "split {split}");
        assert_eq!(tail_win, full_win);
    }
    // Packed: two sequences do not see each other.
    let (packed, _) = conv(&x, vec![0, 4, 11], None);
    let (second, _) = conv(&x[4 * ch..], vec![0, 7], None);
    assert_eq!(packed[4 * ch..], second[..]);
}

#[test]
fn l2_norm_gives_unit_heads_and_zero_for_zero() {
    let cpu = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(9);
    let layout = HeadLayout {
        heads: 2,
        head_dim: 16,
        head_stride: 16,
        row_stride: 40,
        offset: 0,
    };
    let mut x = rand_vec(&mut rng, 3 * 40);
    x[40..56].fill(0.0); // row 1, head 0 is all zero
    let orig = x.clone();
    cpu.l2_norm(&mut x, layout, 3, 1e-6).unwrap();
    for t in 0..3 {
        for h in 0..2 {
            let head = &x[t * 40 + h * 16..][..16];
            let n: f32 = head.iter().map(|v| v * v).sum::<f32>().sqrt();
            if t == 1 && h == 0 {
                assert!(head.iter().all(|&v| v == 0.0));
            } else {
                assert!((n - 1.0).abs() < 1e-5);
            }
        }
        assert_eq!(x[t * 40 + 32..t * 40 + 40], orig[t * 40 + 32..t * 40 + 40]);
    }
}

#[test]
fn delta_gates_match_formula_with_softplus_threshold() {
    let cpu = CpuBackend::new();
    let a_log = vec![0.5f32, -1.0];
    let dt_bias = vec![0.25f32, 1.0];
    let (b0, a0) = (
        vec![-3.0f32, 0.0, 2.0, 40.0],
        vec![-2.0f32, 0.3, 19.0, 30.0],
    );
    let (mut b, mut a) = (vec![f32::NAN; 4], vec![f32::NAN; 4]);
    let dense = Strided::dense(2);
    cpu.delta_gates(
        DeltaGates {
            b: &b0,
            b_at: dense,
            a: &a0,
            a_at: dense,
            a_log: &a_log,
            dt_bias: &dt_bias,
            heads: 2,
        },
        2,
        GateOutputs {
            beta: &mut b,
            g: &mut a,
        },
    )
    .unwrap();
    for i in 0..4 {
        let h = i % 2;
        assert!((b[i] as f64 - sigmoid64(b0[i] as f64)).abs() < 1e-6);
        let x = (a0[i] + dt_bias[h]) as f64;
        let sp = if x > 20.0 { x } else { x.exp().ln_1p() };
        let want = -(a_log[h] as f64).exp() * sp;
        assert!(
            (a[i] as f64 - want).abs() < 1e-5 * want.abs().max(1.0),
            "i {i}: {} vs {want}",
            a[i]
        );
    }
    // Above the threshold softplus is the identity: −e^{−1}·31.
    assert_eq!(a[3], -(-1.0f32).exp() * 31.0);
}

#[test]
fn gated_rms_norm_and_swiglu_match_formulas() {
    let cpu = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(10);
    let (rows, dim) = (4, 12);
    let orig = rand_vec(&mut rng, rows * dim);
    let z = rand_vec(&mut rng, rows * dim);
    let w = rand_vec(&mut rng, dim);
    let mut x = orig.clone();
    cpu.gated_rms_norm(
        &mut x,
        GatedNorm {
            z: &z,
            z_at: Strided::dense(dim),
            weight: &w,
            rows,
            heads: 1,
            dim,
            eps: 1e-6,
        },
    )
    .unwrap();
    for t in 0..rows {
        let row = &orig[t * dim..(t + 1) * dim];
        let ms: f64 = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / dim as f64;
        for d in 0..dim {
            let i = t * dim + d;
            let want = w[d] as f64 * row[d] as f64 / (ms + 1e-6).sqrt() * silu64(z[i] as f64);
            assert!((x[i] as f64 - want).abs() < 1e-5);
        }
    }
    let inter = 5;
    let gu = rand_vec(&mut rng, rows * 2 * inter);
    let mut out = vec![0.0; rows * inter];
    cpu.swiglu(&gu, rows, inter, &mut out).unwrap();
    for t in 0..rows {
        for i in 0..inter {
            let want = silu64(gu[t * 2 * inter + i] as f64) * gu[t * 2 * inter + inter + i] as f64;
            assert!((out[t * inter + i] as f64 - want).abs() < 1e-6);
        }
    }
}

#[test]
fn scatter_rows_puts_each_row_at_its_slot_and_refuses_a_slot_past_the_end() {
    let cpu = CpuBackend::new();
    let rows: Vec<f32> = (0..3 * 2).map(|v| 100.0 + v as f32).collect();
    let mut out: Vec<f32> = (0..5 * 2).map(|v| v as f32).collect();
    cpu.scatter_rows(&rows, &vec![4, 0, 2], 3, 2, &mut out)
        .unwrap();
    assert_eq!(out, [102., 103., 2., 3., 104., 105., 6., 7., 100., 101.]);
    // Only the first `count` rows move.
    let mut out = vec![0.0; 10];
    cpu.scatter_rows(&rows, &vec![1, 3, 4], 1, 2, &mut out)
        .unwrap();
    assert_eq!(out, [0., 0., 100., 101., 0., 0., 0., 0., 0., 0.]);
    let e = cpu
        .scatter_rows(&rows, &vec![5], 1, 2, &mut out)
        .unwrap_err()
        .to_string();
    assert!(e.contains("slot 5 of row 0 is past out's 5 rows"), "{e}");
    assert!(cpu.scatter_rows(&rows, &vec![0], 4, 2, &mut out).is_err());
}

#[test]
fn embedding_and_gather_last_index_correctly_and_reject_bad_input() {
    let cpu = CpuBackend::new();
    let table: Vec<f32> = (0..5 * 3).map(|v| v as f32).collect();
    let ids = vec![4u32, 0, 2, 2];
    let mut out = vec![0.0; 12];
    cpu.embedding(&table, 5, &ids, 4, 3, &mut out).unwrap();
    assert_eq!(out, [12., 13., 14., 0., 1., 2., 6., 7., 8., 6., 7., 8.]);
    assert!(cpu
        .embedding(&table, 5, &vec![5u32], 1, 3, &mut out)
        .is_err());

    let cu = vec![0u32, 1, 4];
    let mut last = vec![0.0; 6];
    cpu.gather_last(
        &out,
        Varlen {
            cu_seqlens: &cu,
            num_seqs: 2,
            rows: 4,
        },
        3,
        &mut last,
    )
    .unwrap();
    assert_eq!(last, [12., 13., 14., 6., 7., 8.]);
    // An empty sequence (a padded pass's padding) gets a NaN row, as on the GPU.
    let empty = vec![0u32, 0, 4];
    cpu.gather_last(
        &out,
        Varlen {
            cu_seqlens: &empty,
            num_seqs: 2,
            rows: 4,
        },
        3,
        &mut last,
    )
    .unwrap();
    assert!(last[..3].iter().all(|v| v.is_nan()));
    assert_eq!(last[3..], [6., 7., 8.]);
    let decreasing = vec![0u32, 3, 2];
    assert!(cpu
        .gather_last(
            &out,
            Varlen {
                cu_seqlens: &decreasing,
                num_seqs: 2,
                rows: 2,
            },
            3,
            &mut last
        )
        .is_err());
    // `rows` must cover cu_seqlens.
    assert!(cpu
        .gather_last(
            &out,
            Varlen {
                cu_seqlens: &cu,
                num_seqs: 2,
                rows: 3,
            },
            3,
            &mut last
        )
        .is_err());
    let too_long = vec![0u32, 5];
    assert!(cpu
        .gather_last(
            &out,
            Varlen {
                cu_seqlens: &too_long,
                num_seqs: 1,
                rows: 5,
            },
            3,
            &mut last
        )
        .is_err());
}

#[test]
fn strided_rows_need_and_hold_the_right_lengths() {
    let at = Strided::cols(10, 3);
    assert_eq!(at.at(2, 1), 24);
    assert_eq!(at.required_len(0, 4), 0);
    assert_eq!(at.required_len(3, 4), 27);
    assert_eq!(at.rows_in(26, 4), 2);
    assert_eq!(at.rows_in(27, 4), 3);
    assert_eq!(at.rows_in(6, 4), 0);
    assert_eq!(Strided::dense(4).rows_in(11, 4), 2);
    assert_eq!(Strided::cols(usize::MAX, 0).required_len(3, 1), usize::MAX);
}

/// The Gated DeltaNet in-projection as the model runs it: the four weights stacked into one GEMM,
/// and the conv, gates and gated norm reading their column blocks of its output in place. Every
/// result must equal, bit for bit, the four separate GEMMs and the ops on dense copies.
#[test]
fn stacked_in_projection_blocks_read_in_place_equal_the_dense_ops() {
    let cpu = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(21);
    // hidden over the GEMM's depth block (256) and a width over its column block (1024); odd
    // widths so the blocks do not fall on any tile boundary.
    let (hidden, heads, dim, kernel) = (300, 3, 5, 4);
    let (qkv, vw, hv) = (1031, heads * dim, heads);
    let width = qkv + vw + 2 * hv;
    let lens = [1usize, 6, 2];
    let cu = cu_of(&lens);
    let rows: usize = lens.iter().sum();
    let batch = Varlen {
        cu_seqlens: &cu,
        num_seqs: lens.len(),
        rows,
    };
    let x = rand_vec(&mut rng, rows * hidden);
    let parts: Vec<(Vec<f32>, usize)> = [qkv, vw, hv, hv]
        .iter()
        .map(|&out| (rand_vec(&mut rng, out * hidden), out))
        .collect();
    let stacked: Vec<f32> = parts.iter().flat_map(|(w, _)| w.clone()).collect();
    let mut proj = vec![f32::NAN; rows * width];
    cpu.gemm(&x, &stacked, GemmShape::new(rows, hidden, width), &mut proj)
        .unwrap();
    let mut dense = Vec::new();
    let mut offset = 0;
    for (w, out) in &parts {
        let mut y = vec![0.0; rows * out];
        cpu.gemm(&x, w, GemmShape::new(rows, hidden, *out), &mut y)
            .unwrap();
        for t in 0..rows {
            let block = &proj[t * width + offset..][..*out];
            assert_eq!(
                block,
                &y[t * out..(t + 1) * out],
                "block at {offset}, row {t}"
            );
        }
        dense.push(y);
        offset += out;
    }
    let [qkv_at, z_at, b_at, a_at] =
        [0, qkv, qkv + vw, qkv + vw + hv].map(|o| Strided::cols(width, o));

    // conv1d over the qkv block, with a carried window in and out.
    let conv_w = rand_vec(&mut rng, qkv * kernel);
    let window = rand_vec(&mut rng, lens.len() * (kernel - 1) * qkv);
    let conv = |x: &Vec<f32>, at: Strided| {
        let mut out = vec![f32::NAN; rows * qkv];
        let mut win_out = vec![f32::NAN; window.len()];
        cpu.conv1d_silu(
            Conv1d {
                x,
                x_at: at,
                weight: &conv_w,
                channels: qkv,
                kernel,
            },
            batch,
            ConvWindow {
                input: Some(&window),
                output: Some(&mut win_out),
                output_at: None,
            },
            &mut out,
        )
        .unwrap();
        (out, win_out)
    };
    assert_eq!(conv(&proj, qkv_at), conv(&dense[0], Strided::dense(qkv)));

    // Gates from the b and a blocks into dense beta and g.
    let a_log = rand_vec(&mut rng, hv);
    let dt_bias = rand_vec(&mut rng, hv);
    let gates = |b: &Vec<f32>, b_at, a: &Vec<f32>, a_at| {
        let gates = DeltaGates {
            b,
            b_at,
            a,
            a_at,
            a_log: &a_log,
            dt_bias: &dt_bias,
            heads: hv,
        };
        cpu_gates(gates, rows)
    };
    let dense_hv = Strided::dense(hv);
    assert_eq!(
        gates(&proj, b_at, &proj, a_at),
        gates(&dense[2], dense_hv, &dense[3], dense_hv)
    );

    // Gated norm (and its fused projection) gated by the z block.
    let core = rand_vec(&mut rng, rows * vw);
    let norm_w = rand_vec(&mut rng, dim);
    let out_w = rand_vec(&mut rng, hidden * vw);
    let gated = |z: &Vec<f32>, z_at| {
        let norm = GatedNorm {
            z,
            z_at,
            weight: &norm_w,
            rows,
            heads,
            dim,
            eps: 1e-6,
        };
        let mut x = core.clone();
        cpu.gated_rms_norm(&mut x, norm).unwrap();
        let mut x2 = core.clone();
        let mut y = vec![f32::NAN; rows * hidden];
        cpu.gated_rms_norm_gemm(
            &mut x2,
            norm,
            Projection {
                w: &out_w,
                out_dim: hidden,
                store: Store::Replace,
            },
            &mut y,
        )
        .unwrap();
        (x, y)
    };
    assert_eq!(gated(&proj, z_at), gated(&dense[1], Strided::dense(vw)));

    // A block whose last row would run past the buffer is refused, not read out of bounds.
    let short = proj[..(rows - 1) * width + qkv + vw + hv + 1].to_vec();
    let (mut beta, mut g) = (vec![0.0; rows * hv], vec![0.0; rows * hv]);
    assert!(cpu
        .delta_gates(
            DeltaGates {
                b: &short,
                b_at,
                a: &short,
                a_at,
                a_log: &a_log,
                dt_bias: &dt_bias,
                heads: hv
            },
            rows,
            GateOutputs {
                beta: &mut beta,
                g: &mut g
            }
        )
        .is_err());
    let mut x = core.clone();
    assert!(cpu
        .gated_rms_norm(
            &mut x,
            GatedNorm {
                z: &proj[..(rows - 1) * width + qkv + vw - 1].to_vec(),
                z_at,
                weight: &norm_w,
                rows,
                heads,
                dim,
                eps: 1e-6
            }
        )
        .is_err());
    let mut out = vec![0.0; rows * qkv];
    assert!(cpu
        .conv1d_silu(
            Conv1d {
                x: &proj[..(rows - 1) * width + qkv - 1].to_vec(),
                x_at: qkv_at,
                weight: &conv_w,
                channels: qkv,
                kernel
            },
            batch,
            ConvWindow {
                input: None,
                output: None,
                output_at: None,
            },
            &mut out
        )
        .is_err());
}

/// `write_parts` lands its parts back to back at the start of the buffer, leaves the rest, and
/// refuses a destination too small for them.
#[test]
fn write_parts_concatenates_in_place() {
    let cpu = CpuBackend::new();
    let mut dst = cpu.alloc(8).unwrap();
    cpu.write_parts(&mut dst, &[&[1.0, 2.0], &[], &[3.0, 4.0, 5.0]])
        .unwrap();
    assert_eq!(
        cpu.read(&dst, 8).unwrap(),
        [1.0, 2.0, 3.0, 4.0, 5.0, 0.0, 0.0, 0.0]
    );
    let e = cpu
        .write_parts(&mut dst, &[&[0.0; 5], &[0.0; 4]])
        .unwrap_err();
    assert!(e.to_string().contains("destination"), "{e}");
}
