//! Gated causal GQA attention within each packed sequence, optionally after a per-sequence
//! prefix of cached keys and values.

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
        None,
        out,
    )
}

/// A prefix's keys and values on the CPU: dense `[prefix rows, kv_heads·head_dim]` each, and the
/// `num_seqs + 1` row offsets of each sequence's prefix.
pub(super) struct Prefix<'a> {
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub cu: &'a Vec<u32>,
    pub rows: usize,
}

/// [`gated_causal_gqa`] with `qg`, `k` and `v` rows where their [`Strided`] layouts put them
/// (e.g. the column blocks of one stacked projection), and each sequence's queries attending to
/// its `prefix` rows first. With no prefix (or empty ones) the arithmetic is the same, in the same
/// order, as without.
pub(super) fn gated_causal_gqa_at(
    [(qg, qg_at), (k, k_at), (v, v_at)]: [(&[f32], Strided); 3],
    batch: Varlen<'_, Vec<u32>>,
    dims: AttentionDims,
    prefix: Option<Prefix<'_>>,
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
    let prefix_ranges = match &prefix {
        Some(p) => {
            let cu = Varlen {
                cu_seqlens: p.cu,
                num_seqs: batch.num_seqs,
                rows: p.rows,
            };
            let ranges = seq_ranges("attention prefix", cu, p.rows)?;
            check_len(OP, "prefix k", p.k, p.rows * kv_w)?;
            check_len(OP, "prefix v", p.v, p.rows * kv_w)?;
            ranges
        }
        None => vec![0..0; ranges.len()],
    };
    let (prefix_k, prefix_v) = prefix.as_ref().map_or((&[][..], &[][..]), |p| (p.k, p.v));

    let mut probs = Vec::new();
    let mut acc = vec![0.0f32; d];
    for (r, pr) in ranges.into_iter().zip(prefix_ranges) {
        for h in 0..q_heads {
            let kh = h / group;
            for i in r.clone() {
                let q = &qg[qg_at.at(i, h * 2 * d)..][..d];
                let gate = &qg[qg_at.at(i, h * 2 * d + d)..][..d];
                probs.clear();
                let mut max = f32::NEG_INFINITY;
                for j in pr.clone() {
                    let kj = &prefix_k[j * kv_w + kh * d..][..d];
                    let s = q.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>() * scale;
                    max = max.max(s);
                    probs.push(s);
                }
                for j in r.start..=i {
                    let kj = &k[k_at.at(j, kh * d)..][..d];
                    let s = q.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>() * scale;
                    max = max.max(s);
                    probs.push(s);
                }
                let denom = exp_shifted(&mut probs, max);
                acc.fill(0.0);
                let (before, own) = probs.split_at(pr.len());
                for (j, &p) in pr.clone().zip(before) {
                    let vj = &prefix_v[j * kv_w + kh * d..][..d];
                    let w = p / denom;
                    for (a, &x) in acc.iter_mut().zip(vj) {
                        *a += w * x;
                    }
                }
                for (j, &p) in (r.start..=i).zip(own) {
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
