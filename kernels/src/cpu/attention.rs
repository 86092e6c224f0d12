//! Gated causal GQA attention within each packed sequence.

use super::{check_len, exp_shifted, seq_ranges, sigmoid};
use crate::backend::{AttentionDims, KernelResult, Strided, Varlen};
use crate::error::KernelError;

pub(super) fn gated_causal_gqa(
    qg: &[f32],
    k: &[f32],
    v: &[f32],
    batch: Varlen<'_, Vec<u32>>,
    dims: AttentionDims,
    out: &mut [f32],
) -> KernelResult<()> {
    let (qg_w, kv_w) = (
        2 * dims.q_heads * dims.head_dim,
        dims.kv_heads * dims.head_dim,
    );
    gated_causal_gqa_at(
        [
            (qg, Strided::dense(qg_w)),
            (k, Strided::dense(kv_w)),
            (v, Strided::dense(kv_w)),
        ],
        batch,
        dims,
        out,
    )
}

/// [`gated_causal_gqa`] with `qg`, `k` and `v` rows where their [`Strided`] layouts put them
/// (e.g. the column blocks of one stacked projection).
pub(super) fn gated_causal_gqa_at(
    [(qg, qg_at), (k, k_at), (v, v_at)]: [(&[f32], Strided); 3],
    batch: Varlen<'_, Vec<u32>>,
    dims: AttentionDims,
    out: &mut [f32],
) -> KernelResult<()> {
    const OP: &str = "attention";
    let (q_heads, kv_heads, d, scale) = (dims.q_heads, dims.kv_heads, dims.head_dim, dims.scale);
    if kv_heads == 0 || d == 0 || q_heads % kv_heads != 0 {
        return Err(KernelError::invalid(
            OP,
            format!(
                "q_heads {q_heads} must be a multiple of kv_heads {kv_heads}, head_dim {d} > 0"
            ),
        ));
    }
    let group = q_heads / kv_heads;
    let (qg_w, kv_w, out_w) = (2 * q_heads * d, kv_heads * d, q_heads * d);
    let ranges = seq_ranges(OP, batch, qg_at.rows_in(qg.len(), qg_w))?;
    let rows = ranges.last().map_or(0, |r| r.end);
    check_len(OP, "k", k, k_at.required_len(rows, kv_w))?;
    check_len(OP, "v", v, v_at.required_len(rows, kv_w))?;
    check_len(OP, "out", out, rows * out_w)?;

    let mut probs = Vec::new();
    let mut acc = vec![0.0f32; d];
    for r in ranges {
        for h in 0..q_heads {
            let kh = h / group;
            for i in r.clone() {
                let q = &qg[qg_at.at(i, h * 2 * d)..][..d];
                let gate = &qg[qg_at.at(i, h * 2 * d + d)..][..d];
                probs.clear();
                let mut max = f32::NEG_INFINITY;
                for j in r.start..=i {
                    let kj = &k[k_at.at(j, kh * d)..][..d];
                    let s = q.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>() * scale;
                    max = max.max(s);
                    probs.push(s);
                }
                let denom = exp_shifted(&mut probs, max);
                acc.fill(0.0);
                for (j, &p) in (r.start..=i).zip(probs.iter()) {
                    let vj = &v[v_at.at(j, kh * d)..][..d];
                    let w = p / denom;
                    for (a, &x) in acc.iter_mut().zip(vj) {
                        *a += w * x;
                    }
                }
                let o = &mut out[i * out_w + h * d..][..d];
                for ((o, &a), &g) in o.iter_mut().zip(&acc).zip(gate) {
                    *o = a * sigmoid(g);
                }
            }
        }
    }
    Ok(())
}
