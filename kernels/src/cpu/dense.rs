//! Row-wise and element-wise CPU ops: embedding, the norms, GEMM, gates, SwiGLU, last-row gather.

use super::{check_len, check_row_norm, seq_ranges, sigmoid, silu};
use crate::backend::{
    DeltaGates, GateOutputs, GatedNorm, GemmShape, HeadLayout, KernelResult, RowNorm, Store, Varlen,
};
use crate::error::KernelError;

pub(super) fn embedding(
    table: &[f32],
    vocab: usize,
    ids: &[u32],
    rows: usize,
    dim: usize,
    out: &mut [f32],
) -> KernelResult<()> {
    const OP: &str = "embedding";
    check_len(OP, "table", table, vocab * dim)?;
    check_len(OP, "ids", ids, rows)?;
    check_len(OP, "out", out, rows * dim)?;
    for (t, &id) in ids[..rows].iter().enumerate() {
        let id = id as usize;
        if id >= vocab {
            return Err(KernelError::invalid(
                OP,
                format!("token id {id} at row {t} >= vocab {vocab}"),
            ));
        }
        out[t * dim..(t + 1) * dim].copy_from_slice(&table[id * dim..(id + 1) * dim]);
    }
    Ok(())
}

/// `out[slots[i]] = rows[i]` for `i < count`, rows of `width`.
pub(super) fn scatter_rows(
    rows: &[f32],
    slots: &[u32],
    count: usize,
    width: usize,
    out: &mut [f32],
) -> KernelResult<()> {
    const OP: &str = "scatter_rows";
    check_len(OP, "rows", rows, count * width)?;
    check_len(OP, "slots", slots, count)?;
    let out_rows = out.len() / width.max(1);
    for (i, &slot) in slots[..count].iter().enumerate() {
        let slot = slot as usize;
        if slot >= out_rows {
            return Err(KernelError::invalid(
                OP,
                format!("slot {slot} of row {i} is past out's {out_rows} rows"),
            ));
        }
        out[slot * width..(slot + 1) * width].copy_from_slice(&rows[i * width..(i + 1) * width]);
    }
    Ok(())
}

/// `1 / sqrt(mean(x²) + eps)`, the sum accumulated in f64.
fn inv_rms(x: &[f32], eps: f32) -> f32 {
    let ss: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    let mean = (ss / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

fn norm_row_zero_centred(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let inv = inv_rms(x, eps);
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = (v * inv) * (1.0 + w);
    }
}

pub(super) fn rms_norm(
    x: &[f32],
    norm: RowNorm<'_, Vec<f32>>,
    out: &mut [f32],
) -> KernelResult<()> {
    check_row_norm("rms_norm", "x", x, &norm, out)?;
    norm_rows_zero_centred(x, norm, out);
    Ok(())
}

/// Zero-centred RMSNorm of every row of `x` into `out` (lengths checked by the caller).
fn norm_rows_zero_centred(x: &[f32], norm: RowNorm<'_, Vec<f32>>, out: &mut [f32]) {
    let dim = norm.dim;
    for t in 0..norm.rows {
        let r = t * dim..(t + 1) * dim;
        norm_row_zero_centred(&x[r.clone()], &norm.weight[..dim], norm.eps, &mut out[r]);
    }
}

pub(super) fn add_rms_norm(
    residual: &mut [f32],
    delta: &[f32],
    norm: RowNorm<'_, Vec<f32>>,
    out: &mut [f32],
) -> KernelResult<()> {
    const OP: &str = "add_rms_norm";
    let len = norm.len();
    check_row_norm(OP, "residual", residual, &norm, out)?;
    check_len(OP, "delta", delta, len)?;
    for (r, d) in residual[..len].iter_mut().zip(&delta[..len]) {
        *r += d;
    }
    norm_rows_zero_centred(residual, norm, out);
    Ok(())
}

pub(super) fn gemm(
    x: &[f32],
    w: &[f32],
    shape: GemmShape,
    store: Store,
    y: &mut [f32],
) -> KernelResult<()> {
    const OP: &str = "gemm";
    let (rows, in_dim, out_dim) = (shape.rows, shape.in_dim, shape.out_dim);
    check_len(OP, "x", x, rows * in_dim)?;
    check_len(OP, "w", w, out_dim * in_dim)?;
    check_len(OP, "y", y, rows * out_dim)?;
    if rows == 0 || out_dim == 0 {
        return Ok(());
    }
    if store == Store::Add {
        // The product first, then the add: the same bits as a separate residual add
        // (matrixmultiply's own β = 1 adds each block of the depth in turn, another rounding).
        let mut product = vec![0.0; rows * out_dim];
        gemm(x, w, shape, Store::Replace, &mut product)?;
        for (y, p) in y.iter_mut().zip(product) {
            *y += p;
        }
        return Ok(());
    }
    if in_dim == 0 {
        y[..rows * out_dim].fill(0.0);
        return Ok(());
    }
    // SAFETY: the length checks above guarantee every index matrixmultiply touches is in bounds:
    // x is rows×in_dim (row stride in_dim), Wᵀ is read as in_dim×out_dim with row stride 1 and
    // column stride in_dim, y is rows×out_dim (row stride out_dim). y does not alias x or w.
    unsafe {
        matrixmultiply::sgemm(
            rows,
            in_dim,
            out_dim,
            1.0,
            x.as_ptr(),
            in_dim as isize,
            1,
            w.as_ptr(),
            1,
            in_dim as isize,
            0.0,
            y.as_mut_ptr(),
            out_dim as isize,
            1,
        );
    }
    Ok(())
}

/// Calls `f` on every head slice of the first `rows` rows.
fn for_each_head(
    x: &mut [f32],
    layout: HeadLayout,
    rows: usize,
    mut f: impl FnMut(usize, usize, &mut [f32]),
) {
    for t in 0..rows {
        for h in 0..layout.heads {
            let start = t * layout.row_stride + layout.offset + h * layout.head_stride;
            f(t, h, &mut x[start..start + layout.head_dim]);
        }
    }
}

pub(super) fn head_rms_norm(
    x: &mut [f32],
    weight: &[f32],
    layout: HeadLayout,
    rows: usize,
    eps: f32,
) -> KernelResult<()> {
    const OP: &str = "head_rms_norm";
    layout.check_fits(OP, x.len(), rows)?;
    check_len(OP, "weight", weight, layout.head_dim)?;
    let mut tmp = vec![0.0f32; layout.head_dim];
    for_each_head(x, layout, rows, |_, _, head| {
        norm_row_zero_centred(head, weight, eps, &mut tmp);
        head.copy_from_slice(&tmp);
    });
    Ok(())
}

pub(super) fn l2_norm(
    x: &mut [f32],
    layout: HeadLayout,
    rows: usize,
    eps: f32,
) -> KernelResult<()> {
    layout.check_fits("l2_norm", x.len(), rows)?;
    for_each_head(x, layout, rows, |_, _, head| {
        let ss: f64 = head.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let inv = 1.0 / (ss as f32 + eps).sqrt();
        head.iter_mut().for_each(|v| *v *= inv);
    });
    Ok(())
}

/// PyTorch's softplus (beta 1, threshold 20): the input itself above the threshold.
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

pub(super) fn delta_gates(
    gates: DeltaGates<'_, Vec<f32>>,
    rows: usize,
    out: GateOutputs<'_, Vec<f32>>,
) -> KernelResult<()> {
    const OP: &str = "delta_gates";
    let (b_at, a_at, heads) = (gates.b_at, gates.a_at, gates.heads);
    let (beta, g) = (out.beta, out.g);
    check_len(OP, "b", gates.b, b_at.required_len(rows, heads))?;
    check_len(OP, "a", gates.a, a_at.required_len(rows, heads))?;
    check_len(OP, "a_log", gates.a_log, heads)?;
    check_len(OP, "dt_bias", gates.dt_bias, heads)?;
    check_len(OP, "beta", beta, rows * heads)?;
    check_len(OP, "g", g, rows * heads)?;
    let (b, a, a_log, dt_bias) = (gates.b, gates.a, gates.a_log, gates.dt_bias);
    for t in 0..rows {
        for h in 0..heads {
            let i = t * heads + h;
            beta[i] = sigmoid(b[b_at.at(t, h)]);
            g[i] = -a_log[h].exp() * softplus(a[a_at.at(t, h)] + dt_bias[h]);
        }
    }
    Ok(())
}

pub(super) fn gated_rms_norm(x: &mut [f32], norm: GatedNorm<'_, Vec<f32>>) -> KernelResult<()> {
    const OP: &str = "gated_rms_norm";
    let (z, z_at, weight, eps) = (norm.z, norm.z_at, norm.weight, norm.eps);
    let (rows, dim, width) = (norm.rows, norm.dim, norm.width());
    check_len(OP, "x", x, rows * width)?;
    check_len(OP, "z", z, z_at.required_len(rows, width))?;
    check_len(OP, "weight", weight, dim)?;
    if width == 0 {
        return Ok(());
    }
    for t in 0..rows {
        let gates = &z[z_at.at(t, 0)..][..width];
        let heads_x = x[t * width..(t + 1) * width].chunks_exact_mut(dim);
        for (row, gate) in heads_x.zip(gates.chunks_exact(dim)) {
            let inv = inv_rms(row, eps);
            for ((v, &w), &zg) in row.iter_mut().zip(weight).zip(gate) {
                *v = w * (*v * inv) * silu(zg);
            }
        }
    }
    Ok(())
}

pub(super) fn swiglu(
    gate_up: &[f32],
    rows: usize,
    inter: usize,
    out: &mut [f32],
) -> KernelResult<()> {
    const OP: &str = "swiglu";
    check_len(OP, "gate_up", gate_up, rows * 2 * inter)?;
    check_len(OP, "out", out, rows * inter)?;
    for t in 0..rows {
        let gu = &gate_up[t * 2 * inter..(t + 1) * 2 * inter];
        let (gate, up) = gu.split_at(inter);
        for ((o, &g), &u) in out[t * inter..(t + 1) * inter].iter_mut().zip(gate).zip(up) {
            *o = silu(g) * u;
        }
    }
    Ok(())
}

pub(super) fn gather_last(
    x: &[f32],
    batch: Varlen<'_, Vec<u32>>,
    dim: usize,
    out: &mut [f32],
) -> KernelResult<()> {
    const OP: &str = "gather_last";
    let ranges = seq_ranges(OP, batch, x.len() / dim.max(1))?;
    check_len(OP, "out", out, ranges.len() * dim)?;
    for (s, r) in ranges.iter().enumerate() {
        let row = &mut out[s * dim..(s + 1) * dim];
        // An empty sequence (a padded pass's padding) has no last row: NaN, as on the GPU.
        match r.end.checked_sub(1).filter(|_| !r.is_empty()) {
            Some(last) => row.copy_from_slice(&x[last * dim..(last + 1) * dim]),
            None => row.fill(f32::NAN),
        }
    }
    Ok(())
}
