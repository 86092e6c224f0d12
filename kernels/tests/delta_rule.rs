//! The chunked gated delta rule against the token-by-token recurrence and an f64 reference, over
//! chunk boundaries, ragged packed batches, initial and final states.

use instinct_kernels::{Backend, CpuBackend, DeltaDims, DeltaState, Strided, Varlen};
use instinct_kernels::{DeltaGates, DeltaInputs};
use rand::rngs::StdRng;

mod common;
use common::cpu_gates;
use rand::{Rng, SeedableRng};

/// Inputs of one packed batch, already through the gates and the q/k L2 norm.
struct Inputs {
    dims: DeltaDims,
    cu: Vec<u32>,
    qkv: Vec<f32>,
    beta: Vec<f32>,
    g: Vec<f32>,
}

fn make_inputs(rng: &mut StdRng, dims: DeltaDims, lens: &[usize]) -> Inputs {
    let cpu = CpuBackend::new();
    let rows: usize = lens.iter().sum();
    let mut cu = vec![0u32];
    for &l in lens {
        cu.push(cu.last().unwrap() + l as u32);
    }
    let width = dims.qkv_width();
    let mut qkv: Vec<f32> = (0..rows * width)
        .map(|_| rng.gen_range(-1.0..1.0))
        .collect();
    let qk = dims.qk_layout();
    cpu.l2_norm(&mut qkv, qk, rows, 1e-6).unwrap();
    let hv = dims.v_heads;
    // Real gate ranges: A in [0.01, 16], dt_bias around 0, logits a, b ~ N(0, 2).
    let a_log: Vec<f32> = (0..hv).map(|_| rng.gen_range(0.01f32..16.0).ln()).collect();
    let dt_bias: Vec<f32> = (0..hv).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let b: Vec<f32> = (0..rows * hv).map(|_| rng.gen_range(-4.0..4.0)).collect();
    let a: Vec<f32> = (0..rows * hv).map(|_| rng.gen_range(-6.0..3.0)).collect();
    let dense = Strided::dense(hv);
    let gates = DeltaGates {
        b: &b,
        b_at: dense,
        a: &a,
        a_at: dense,
        a_log: &a_log,
        dt_bias: &dt_bias,
        heads: hv,
    };
    let (beta, g) = cpu_gates(gates, rows);
    Inputs {
        dims,
        cu,
        qkv,
        beta,
        g,
    }
}

fn random_state(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-0.5..0.5)).collect()
}

/// Runs one form; returns (output, final state).
fn run(inp: &Inputs, chunked: bool, initial: Option<&Vec<f32>>) -> (Vec<f32>, Vec<f32>) {
    let cpu = CpuBackend::new();
    let rows = *inp.cu.last().unwrap() as usize;
    let seqs = inp.cu.len() - 1;
    let mut out = vec![f32::NAN; rows * inp.dims.v_heads * inp.dims.v_dim];
    let mut fin = vec![f32::NAN; seqs * inp.dims.state_len()];
    let batch = Varlen {
        cu_seqlens: &inp.cu,
        num_seqs: seqs,
        rows,
    };
    let state = DeltaState {
        initial,
        final_out: Some(&mut fin),
        final_at: None,
    };
    let inputs = DeltaInputs {
        qkv: &inp.qkv,
        beta: &inp.beta,
        g: &inp.g,
    };
    if chunked {
        cpu.gated_delta_rule_chunked(inputs, batch, inp.dims, state, &mut out)
    } else {
        cpu.gated_delta_rule_recurrent(inputs, batch, inp.dims, state, &mut out)
    }
    .unwrap();
    (out, fin)
}

/// The recurrence written directly in f64 from the definition.
fn reference_f64(inp: &Inputs, initial: Option<&Vec<f32>>) -> (Vec<f64>, Vec<f64>) {
    let DeltaDims {
        k_heads,
        v_heads,
        k_dim: dk,
        v_dim: dv,
    } = inp.dims;
    let width = inp.dims.qkv_width();
    let rows = *inp.cu.last().unwrap() as usize;
    let seqs = inp.cu.len() - 1;
    let mut out = vec![0.0; rows * v_heads * dv];
    let mut fin = vec![0.0; seqs * inp.dims.state_len()];
    let scale = 1.0 / (dk as f64).sqrt();
    for s in 0..seqs {
        for h in 0..v_heads {
            let kh = h / (v_heads / k_heads);
            let base = (s * v_heads + h) * dk * dv;
            let mut st: Vec<f64> = match initial {
                Some(i) => i[base..base + dk * dv].iter().map(|&x| x as f64).collect(),
                None => vec![0.0; dk * dv],
            };
            for t in inp.cu[s] as usize..inp.cu[s + 1] as usize {
                let row = &inp.qkv[t * width..];
                let q = |i: usize| row[kh * dk + i] as f64 * scale;
                let k = |i: usize| row[k_heads * dk + kh * dk + i] as f64;
                let v = |j: usize| row[2 * k_heads * dk + h * dv + j] as f64;
                let decay = (inp.g[t * v_heads + h] as f64).exp();
                let beta = inp.beta[t * v_heads + h] as f64;
                st.iter_mut().for_each(|x| *x *= decay);
                for j in 0..dv {
                    let pred: f64 = (0..dk).map(|i| st[i * dv + j] * k(i)).sum();
                    let delta = beta * (v(j) - pred);
                    for i in 0..dk {
                        st[i * dv + j] += k(i) * delta;
                    }
                }
                for j in 0..dv {
                    out[t * v_heads * dv + h * dv + j] =
                        (0..dk).map(|i| st[i * dv + j] * q(i)).sum();
                }
            }
            fin[base..base + dk * dv].copy_from_slice(&st);
        }
    }
    (out, fin)
}

fn max_err(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y).abs())
        .fold(0.0, f64::max)
}

fn max_abs(b: &[f64]) -> f64 {
    b.iter().fold(0.0, |m, x| m.max(x.abs()))
}

fn check(dims: DeltaDims, lens: &[usize], with_initial: bool, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let inp = make_inputs(&mut rng, dims, lens);
    let init = with_initial.then(|| random_state(&mut rng, lens.len() * dims.state_len()));
    let (ref_out, ref_fin) = reference_f64(&inp, init.as_ref());
    // Outputs and states are O(1); 2e-5 absolute is well below any real mistake (an off-by-one
    // in the chunk grid or the decay gives errors of order 1e-1).
    let tol = 2e-5 * (1.0 + max_abs(&ref_out).max(max_abs(&ref_fin)));
    for chunked in [false, true] {
        let (out, fin) = run(&inp, chunked, init.as_ref());
        let (eo, ef) = (max_err(&out, &ref_out), max_err(&fin, &ref_fin));
        assert!(
            eo < tol && ef < tol,
            "lens {lens:?} initial {with_initial} chunked {chunked}: out err {eo:e}, state err {ef:e} (tol {tol:e})"
        );
    }
}

const SMALL: DeltaDims = DeltaDims {
    k_heads: 2,
    v_heads: 4,
    k_dim: 16,
    v_dim: 8,
};

#[test]
fn chunked_matches_recurrence_at_chunk_boundaries() {
    for (i, &len) in [1usize, 63, 64, 65, 130, 200].iter().enumerate() {
        check(SMALL, &[len], false, 10 + i as u64);
        check(SMALL, &[len], true, 20 + i as u64);
    }
}

#[test]
fn chunked_matches_recurrence_on_ragged_packed_batch() {
    check(SMALL, &[65, 1, 200, 63, 64, 130], false, 31);
    check(SMALL, &[65, 1, 200, 63, 64, 130], true, 32);
}

#[test]
fn chunked_matches_recurrence_at_real_head_dims() {
    // Qwen3.5 head sizes (128) with the real 2:1 value-to-key head ratio.
    let dims = DeltaDims {
        k_heads: 1,
        v_heads: 2,
        k_dim: 128,
        v_dim: 128,
    };
    check(dims, &[130, 70], true, 41);
}

#[test]
fn packed_batch_equals_each_sequence_alone() {
    let mut rng = StdRng::seed_from_u64(51);
    let lens = [65usize, 3, 130];
    let inp = make_inputs(&mut rng, SMALL, &lens);
    let init = random_state(&mut rng, lens.len() * SMALL.state_len());
    let width = SMALL.qkv_width();
    let (hv, dv, sl) = (SMALL.v_heads, SMALL.v_dim, SMALL.state_len());
    for chunked in [false, true] {
        let (out, fin) = run(&inp, chunked, Some(&init));
        for s in 0..lens.len() {
            let r = inp.cu[s] as usize..inp.cu[s + 1] as usize;
            let alone = Inputs {
                dims: SMALL,
                cu: vec![0, r.len() as u32],
                qkv: inp.qkv[r.start * width..r.end * width].to_vec(),
                beta: inp.beta[r.start * hv..r.end * hv].to_vec(),
                g: inp.g[r.start * hv..r.end * hv].to_vec(),
            };
            let (o1, f1) = run(&alone, chunked, Some(&init[s * sl..(s + 1) * sl].to_vec()));
            assert_eq!(
                o1,
                out[r.start * hv * dv..r.end * hv * dv],
                "seq {s} chunked {chunked}"
            );
            assert_eq!(
                f1,
                fin[s * sl..(s + 1) * sl],
                "seq {s} state, chunked {chunked}"
            );
        }
    }
}

#[test]
fn split_sequence_resumed_from_state_equals_one_pass() {
    // Running 0..100 then 100..170 from the carried state equals one pass over 0..170.
    let mut rng = StdRng::seed_from_u64(61);
    let inp = make_inputs(&mut rng, SMALL, &[170]);
    let (width, hv, dv) = (SMALL.qkv_width(), SMALL.v_heads, SMALL.v_dim);
    let part = |a: usize, b: usize| Inputs {
        dims: SMALL,
        cu: vec![0, (b - a) as u32],
        qkv: inp.qkv[a * width..b * width].to_vec(),
        beta: inp.beta[a * hv..b * hv].to_vec(),
        g: inp.g[a * hv..b * hv].to_vec(),
    };
    let (full_out, full_fin) = run(&inp, true, None);
    let (_, mid) = run(&part(0, 100), true, None);
    let (tail_out, tail_fin) = run(&part(100, 170), true, Some(&mid));
    let err_o = tail_out
        .iter()
        .zip(&full_out[100 * hv * dv..])
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    let err_s = tail_fin
        .iter()
        .zip(&full_fin)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(
        err_o < 1e-5 && err_s < 1e-5,
        "resume: out {err_o:e}, state {err_s:e}"
    );
}

#[test]
fn rejects_bad_shapes() {
    let cpu = CpuBackend::new();
    let cu = vec![0u32, 5];
    let qkv = vec![0.0f32; 4 * SMALL.qkv_width()]; // 4 rows, cu says 5
    let mut out = vec![0.0f32; 5 * 32];
    let beta = vec![0.5f32; 20];
    let g = vec![-0.1f32; 20];
    let r = cpu.gated_delta_rule_chunked(
        DeltaInputs {
            qkv: &qkv,
            beta: &beta,
            g: &g,
        },
        Varlen {
            cu_seqlens: &cu,
            num_seqs: 1,
            rows: 5,
        },
        SMALL,
        DeltaState {
            initial: None,
            final_out: None,
            final_at: None,
        },
        &mut out,
    );
    assert!(r.is_err());
    let bad = DeltaDims {
        k_heads: 3,
        ..SMALL
    };
    let r = cpu.gated_delta_rule_recurrent(
        DeltaInputs {
            qkv: &qkv,
            beta: &beta,
            g: &g,
        },
        Varlen {
            cu_seqlens: &vec![0u32, 1],
            num_seqs: 1,
            rows: 1,
        },
        bad,
        DeltaState {
            initial: None,
            final_out: None,
            final_at: None,
        },
        &mut out,
    );
    assert!(r.is_err());
}
