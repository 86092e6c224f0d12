//! Gated delta rule (Gated DeltaNet core), per sequence and value head, f32 state.
//!
//! Two forms of the same recurrence: token by token, and chunked (64 tokens) with the WY / UT
//! transform as in transformers' `torch_chunk_gated_delta_rule`. The chunk grid restarts at every
//! sequence start, and a partial last chunk is simply shorter (no padding).

use super::{check_len, seq_ranges, CpuBackend};
use crate::backend::{DeltaDims, DeltaInputs, DeltaState, KernelResult, Varlen};
use crate::error::KernelError;

/// Tokens per chunk of the chunked form.
pub const CHUNK: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mode {
    Chunked,
    Recurrent,
}

/// One (sequence, value head) problem, gathered into contiguous arrays.
struct Head {
    /// `[n, dk]`, L2-normalised and scaled by `dk^-0.5`.
    q: Vec<f32>,
    /// `[n, dk]`, L2-normalised.
    k: Vec<f32>,
    /// `[n, dv]`
    v: Vec<f32>,
    beta: Vec<f32>,
    g: Vec<f32>,
    dk: usize,
    dv: usize,
}

pub(super) fn run(
    mode: Mode,
    inputs: DeltaInputs<'_, Vec<f32>>,
    batch: Varlen<'_, Vec<u32>>,
    dims: DeltaDims,
    state: DeltaState<'_, CpuBackend>,
    out: &mut [f32],
) -> KernelResult<()> {
    const OP: &str = "gated_delta_rule";
    let (qkv, beta, g) = (
        inputs.qkv.as_slice(),
        inputs.beta.as_slice(),
        inputs.g.as_slice(),
    );
    let (k_heads, v_heads, dk, dv) = (dims.k_heads, dims.v_heads, dims.k_dim, dims.v_dim);
    if k_heads == 0 || dk == 0 || dv == 0 || v_heads % k_heads != 0 {
        return Err(KernelError::invalid(
            OP,
            format!("v_heads {v_heads} must be a multiple of k_heads {k_heads}; dims > 0"),
        ));
    }
    let width = dims.qkv_width();
    let ranges = seq_ranges(OP, batch, qkv.len() / width)?;
    let rows = ranges.last().map_or(0, |r| r.end);
    check_len(OP, "beta", beta, rows * v_heads)?;
    check_len(OP, "g", g, rows * v_heads)?;
    check_len(OP, "out", out, rows * v_heads * dv)?;
    let state_len = dims.state_len();
    if let Some(s) = state.initial {
        check_len(OP, "initial state", s, ranges.len() * state_len)?;
    }
    let mut final_out = state.final_out;
    if let Some(s) = final_out.as_deref() {
        check_len(OP, "final state", s, ranges.len() * state_len)?;
    }
    let final_at = state.final_at.map(|at| at.as_slice());
    if let Some(at) = final_at {
        check_len(OP, "final_at", at, ranges.len())?;
    }

    let group = v_heads / k_heads;
    let scale = (dk as f64).powf(-0.5) as f32;
    let head_state = dk * dv;
    for (s, r) in ranges.iter().enumerate() {
        for h in 0..v_heads {
            let kh = h / group;
            let q_off = kh * dk;
            let k_off = k_heads * dk + kh * dk;
            let v_off = 2 * k_heads * dk + h * dv;
            let mut head = Head {
                q: Vec::with_capacity(r.len() * dk),
                k: Vec::with_capacity(r.len() * dk),
                v: Vec::with_capacity(r.len() * dv),
                beta: Vec::with_capacity(r.len()),
                g: Vec::with_capacity(r.len()),
                dk,
                dv,
            };
            for t in r.clone() {
                let row = &qkv[t * width..(t + 1) * width];
                head.q
                    .extend(row[q_off..q_off + dk].iter().map(|&x| x * scale));
                head.k.extend_from_slice(&row[k_off..k_off + dk]);
                head.v.extend_from_slice(&row[v_off..v_off + dv]);
                head.beta.push(beta[t * v_heads + h]);
                head.g.push(g[t * v_heads + h]);
            }
            let at = (s * v_heads + h) * head_state;
            let mut st = match state.initial {
                Some(init) => init[at..at + head_state].to_vec(),
                None => vec![0.0f32; head_state],
            };
            let mut o = vec![0.0f32; r.len() * dv];
            // The state asked for is taken where the tokens are split: the rest continues from
            // it as a later call resumed from it would (its own chunk grid).
            let split = match (final_out.is_some(), final_at) {
                (true, Some(at)) => (at[s] as usize).min(r.len()),
                _ => r.len(),
            };
            let step = |part: &Head, st: &mut [f32], o: &mut [f32]| match mode {
                Mode::Recurrent => recurrent(part, st, o),
                Mode::Chunked => chunked(part, st, o),
            };
            let after = if split < r.len() {
                let (before, after) = head.split(split);
                step(&before, &mut st, &mut o[..split * dv]);
                Some(after)
            } else {
                step(&head, &mut st, &mut o);
                None
            };
            if let Some(f) = final_out.as_deref_mut() {
                f[at..at + head_state].copy_from_slice(&st);
            }
            if let Some(after) = after {
                step(&after, &mut st, &mut o[split * dv..]);
            }
            for (i, t) in r.clone().enumerate() {
                out[t * v_heads * dv + h * dv..][..dv].copy_from_slice(&o[i * dv..(i + 1) * dv]);
            }
        }
    }
    Ok(())
}

impl Head {
    /// The first `n` tokens and the rest, as two problems of their own.
    fn split(&self, n: usize) -> (Head, Head) {
        let (dk, dv) = (self.dk, self.dv);
        let part = |t: std::ops::Range<usize>| Head {
            q: self.q[t.start * dk..t.end * dk].to_vec(),
            k: self.k[t.start * dk..t.end * dk].to_vec(),
            v: self.v[t.start * dv..t.end * dv].to_vec(),
            beta: self.beta[t.clone()].to_vec(),
            g: self.g[t].to_vec(),
            dk,
            dv,
        };
        let len = self.beta.len();
        (part(0..n), part(n..len))
    }
}

/// `S ← e^g S; δ = β (v − Sᵀk); S ← S + k δᵀ; o = Sᵀ q`, one token at a time. `st` is `[dk][dv]`.
fn recurrent(head: &Head, st: &mut [f32], o: &mut [f32]) {
    let (dk, dv) = (head.dk, head.dv);
    let mut delta = vec![0.0f32; dv];
    for t in 0..head.beta.len() {
        let (q, k, v) = (
            &head.q[t * dk..][..dk],
            &head.k[t * dk..][..dk],
            &head.v[t * dv..][..dv],
        );
        let decay = head.g[t].exp();
        st.iter_mut().for_each(|x| *x *= decay);
        delta.fill(0.0);
        for (kk, &kv) in k.iter().enumerate() {
            for (d, &s) in delta.iter_mut().zip(&st[kk * dv..(kk + 1) * dv]) {
                *d += s * kv;
            }
        }
        for (d, &vv) in delta.iter_mut().zip(v) {
            *d = (vv - *d) * head.beta[t];
        }
        for (kk, &kv) in k.iter().enumerate() {
            for (s, &d) in st[kk * dv..(kk + 1) * dv].iter_mut().zip(&delta) {
                *s += kv * d;
            }
        }
        let ot = &mut o[t * dv..(t + 1) * dv];
        ot.fill(0.0);
        for (kk, &qv) in q.iter().enumerate() {
            for (x, &s) in ot.iter_mut().zip(&st[kk * dv..(kk + 1) * dv]) {
                *x += s * qv;
            }
        }
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `out[i] = Σ_k a[i][k] · S[k]` for `a: [n, dk]`, `S: [dk, dv]`, `out: [n, dv]`.
fn rows_times_state(a: &[f32], st: &[f32], dk: usize, dv: usize, out: &mut [f32]) {
    for (ai, oi) in a.chunks_exact(dk).zip(out.chunks_exact_mut(dv)) {
        oi.fill(0.0);
        for (kk, &x) in ai.iter().enumerate() {
            for (o, &s) in oi.iter_mut().zip(&st[kk * dv..(kk + 1) * dv]) {
                *o += x * s;
            }
        }
    }
}

/// The chunked form (see the reference notes §4.1), chunk by chunk over one head.
fn chunked(head: &Head, st: &mut [f32], o: &mut [f32]) {
    let (dk, dv) = (head.dk, head.dv);
    let total = head.beta.len();
    let mut gam = vec![0.0f32; CHUNK];
    let mut a = vec![0.0f32; CHUNK * CHUNK];
    let mut u = vec![0.0f32; CHUNK * dv];
    let mut w = vec![0.0f32; CHUNK * dk];
    let mut ws = vec![0.0f32; CHUNK * dv];
    let mut qs = vec![0.0f32; CHUNK * dv];
    let mut c0 = 0;
    while c0 < total {
        let n = CHUNK.min(total - c0);
        let k = &head.k[c0 * dk..(c0 + n) * dk];
        let q = &head.q[c0 * dk..(c0 + n) * dk];
        let v = &head.v[c0 * dv..(c0 + n) * dv];
        let beta = &head.beta[c0..c0 + n];
        // 1. Local cumulative log-decay.
        let mut acc = 0.0f32;
        for (gi, &g) in gam.iter_mut().zip(&head.g[c0..c0 + n]) {
            acc += g;
            *gi = acc;
        }
        // 2-3. Strictly lower A_ij = β_i (k_i·k_j) e^{γ_i−γ_j}; only i > j is ever exponentiated.
        for i in 0..n {
            for j in 0..i {
                a[i * CHUNK + j] =
                    beta[i] * dot(&k[i * dk..][..dk], &k[j * dk..][..dk]) * (gam[i] - gam[j]).exp();
            }
        }
        // 4-5. U = (I + A)⁻¹ (β v), W = (I + A)⁻¹ (β e^γ k), by forward substitution.
        for i in 0..n {
            let (done_u, rest_u) = u.split_at_mut(i * dv);
            let ui = &mut rest_u[..dv];
            for (x, &vv) in ui.iter_mut().zip(&v[i * dv..][..dv]) {
                *x = beta[i] * vv;
            }
            let (done_w, rest_w) = w.split_at_mut(i * dk);
            let wi = &mut rest_w[..dk];
            let kscale = beta[i] * gam[i].exp();
            for (x, &kv) in wi.iter_mut().zip(&k[i * dk..][..dk]) {
                *x = kscale * kv;
            }
            for j in 0..i {
                let aij = a[i * CHUNK + j];
                for (x, &y) in ui.iter_mut().zip(&done_u[j * dv..][..dv]) {
                    *x -= aij * y;
                }
                for (x, &y) in wi.iter_mut().zip(&done_w[j * dk..][..dk]) {
                    *x -= aij * y;
                }
            }
        }
        // 6. V' = U − W S (U is overwritten with V').
        rows_times_state(&w[..n * dk], st, dk, dv, &mut ws[..n * dv]);
        for (x, &y) in u[..n * dv].iter_mut().zip(&ws[..n * dv]) {
            *x -= y;
        }
        // 7. O_i = e^{γ_i} q_i S + Σ_{j≤i} (q_i·k_j) e^{γ_i−γ_j} V'_j.
        rows_times_state(q, st, dk, dv, &mut qs[..n * dv]);
        for i in 0..n {
            let oi = &mut o[(c0 + i) * dv..][..dv];
            let inter = gam[i].exp();
            for (x, &y) in oi.iter_mut().zip(&qs[i * dv..][..dv]) {
                *x = inter * y;
            }
            for j in 0..=i {
                let coef = dot(&q[i * dk..][..dk], &k[j * dk..][..dk]) * (gam[i] - gam[j]).exp();
                for (x, &y) in oi.iter_mut().zip(&u[j * dv..][..dv]) {
                    *x += coef * y;
                }
            }
        }
        // 8. S ← e^{γ_last} S + Σ_j e^{γ_last−γ_j} k_j V'_jᵀ.
        let last = gam[n - 1];
        let chunk_decay = last.exp();
        st.iter_mut().for_each(|x| *x *= chunk_decay);
        for j in 0..n {
            let kd = (last - gam[j]).exp();
            let vj = &u[j * dv..][..dv];
            for (kk, &kv) in k[j * dk..][..dk].iter().enumerate() {
                let c = kd * kv;
                for (s, &y) in st[kk * dv..(kk + 1) * dv].iter_mut().zip(vj) {
                    *s += c * y;
                }
            }
        }
        c0 += n;
    }
}
