//! CPU ops of the vision tower: LayerNorm, bias and residual adds, GELU, 2-D axial RoPE and
//! bidirectional segment attention.

use super::{check_len, check_row_norm, exp_shifted, seq_ranges};
use crate::backend::{Gelu, HeadLayout, KernelResult, RowNorm, Varlen};
use crate::error::KernelError;

pub(super) fn layer_norm(
    x: &[f32],
    norm: RowNorm<'_, Vec<f32>>,
    bias: &[f32],
    out: &mut [f32],
) -> KernelResult<()> {
    const OP: &str = "layer_norm";
    let (weight, rows, dim, eps) = (norm.weight, norm.rows, norm.dim, norm.eps);
    if dim == 0 {
        return Err(KernelError::invalid(OP, "dim is 0"));
    }
    check_row_norm(OP, "x", x, &norm, out)?;
    check_len(OP, "bias", bias, dim)?;
    for (xr, or) in x[..rows * dim]
        .chunks_exact(dim)
        .zip(out[..rows * dim].chunks_exact_mut(dim))
    {
        // Moments in f64: at least as accurate as PyTorch's f32 accumulation.
        let mean = xr.iter().map(|&v| v as f64).sum::<f64>() / dim as f64;
        let var = xr.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / dim as f64;
        let inv_std = 1.0 / (var + eps as f64).sqrt();
        for (((o, &v), &w), &b) in or.iter_mut().zip(xr).zip(weight).zip(bias) {
            *o = (((v as f64 - mean) * inv_std) as f32) * w + b;
        }
    }
    Ok(())
}

pub(super) fn add_bias(x: &mut [f32], bias: &[f32], rows: usize, dim: usize) -> KernelResult<()> {
    const OP: &str = "add_bias";
    check_len(OP, "x", x, rows * dim)?;
    check_len(OP, "bias", bias, dim)?;
    if dim == 0 {
        return Ok(());
    }
    for row in x[..rows * dim].chunks_exact_mut(dim) {
        for (v, &b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
    Ok(())
}

pub(super) fn add_in_place(x: &mut [f32], delta: &[f32], len: usize) -> KernelResult<()> {
    const OP: &str = "add_in_place";
    check_len(OP, "x", x, len)?;
    check_len(OP, "delta", delta, len)?;
    for (v, &d) in x[..len].iter_mut().zip(&delta[..len]) {
        *v += d;
    }
    Ok(())
}

pub(super) fn gelu(x: &mut [f32], len: usize, kind: Gelu) -> KernelResult<()> {
    check_len("gelu", "x", x, len)?;
    for v in &mut x[..len] {
        let z = *v as f64;
        let y = match kind {
            Gelu::Tanh => {
                let inner = (2.0 / std::f64::consts::PI).sqrt() * (z + 0.044715 * z * z * z);
                0.5 * z * (1.0 + inner.tanh())
            }
            Gelu::Erf => 0.5 * z * (1.0 + libm::erf(z * std::f64::consts::FRAC_1_SQRT_2)),
        };
        *v = y as f32;
    }
    Ok(())
}

pub(super) fn rope_axial(
    x: &mut [f32],
    layout: HeadLayout,
    positions: &[u32],
    rows: usize,
    theta: f32,
) -> KernelResult<()> {
    const OP: &str = "rope_axial";
    layout.check_fits(OP, x.len(), rows)?;
    check_len(OP, "positions", positions, rows * 2)?;
    let d = layout.head_dim;
    if !d.is_multiple_of(4) {
        return Err(KernelError::invalid(
            OP,
            format!("head_dim {d} is not a multiple of 4"),
        ));
    }
    let (half, quarter) = (d / 2, d / 4);
    // PyTorch: 1 / theta^(arange(0, D/2, 2) / (D/2)), all in f32.
    let inv_freq: Vec<f32> = (0..quarter)
        .map(|i| 1.0 / theta.powf((2 * i) as f32 / half as f32))
        .collect();
    let mut cos = vec![0.0f32; half];
    let mut sin = vec![0.0f32; half];
    for t in 0..rows {
        let (row, col) = (positions[2 * t] as f32, positions[2 * t + 1] as f32);
        for i in 0..quarter {
            let (a_row, a_col) = (row * inv_freq[i], col * inv_freq[i]);
            cos[i] = a_row.cos();
            sin[i] = a_row.sin();
            cos[quarter + i] = a_col.cos();
            sin[quarter + i] = a_col.sin();
        }
        for h in 0..layout.heads {
            let start = t * layout.row_stride + layout.offset + h * layout.head_stride;
            let (lo, hi) = x[start..start + d].split_at_mut(half);
            for j in 0..half {
                let (a, b) = (lo[j], hi[j]);
                lo[j] = a * cos[j] - b * sin[j];
                hi[j] = b * cos[j] + a * sin[j];
            }
        }
    }
    Ok(())
}

pub(super) fn attention_bidirectional(
    qkv: &[f32],
    batch: Varlen<'_, Vec<u32>>,
    heads: usize,
    d: usize,
    scale: f32,
    out: &mut [f32],
) -> KernelResult<()> {
    const OP: &str = "attention_bidirectional";
    if heads == 0 || d == 0 {
        return Err(KernelError::invalid(OP, "heads and head_dim must be > 0"));
    }
    let width = heads * d;
    let ranges = seq_ranges(OP, batch, qkv.len() / (3 * width))?;
    let rows = ranges.last().map_or(0, |r| r.end);
    check_len(OP, "out", out, rows * width)?;
    let mut probs = Vec::new();
    for r in ranges {
        for h in 0..heads {
            for i in r.clone() {
                let q = &qkv[i * 3 * width + h * d..][..d];
                probs.clear();
                let mut max = f32::NEG_INFINITY;
                for j in r.clone() {
                    let kj = &qkv[j * 3 * width + width + h * d..][..d];
                    let s = q.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>() * scale;
                    max = max.max(s);
                    probs.push(s);
                }
                let denom = exp_shifted(&mut probs, max);
                let o = &mut out[i * width + h * d..][..d];
                o.fill(0.0);
                for (j, &p) in r.clone().zip(probs.iter()) {
                    let vj = &qkv[j * 3 * width + 2 * width + h * d..][..d];
                    let w = p / denom;
                    for (a, &x) in o.iter_mut().zip(vj) {
                        *a += w * x;
                    }
                }
            }
        }
    }
    Ok(())
}
