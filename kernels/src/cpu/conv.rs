//! Causal depthwise conv1d + SiLU per packed sequence, with an optional carried window.

use super::{check_len, seq_ranges, silu};
use crate::backend::{Conv1d, ConvWindow, KernelResult, Varlen};
use crate::error::KernelError;

pub(super) fn causal_conv1d_silu(
    conv: Conv1d<'_, Vec<f32>>,
    batch: Varlen<'_, Vec<u32>>,
    window: ConvWindow<'_, Vec<f32>, Vec<u32>>,
    out: &mut [f32],
) -> KernelResult<()> {
    const OP: &str = "conv1d_silu";
    let (x, x_at, weight, channels, kernel) =
        (conv.x, conv.x_at, conv.weight, conv.channels, conv.kernel);
    let window_in = window.input.map(|w| w.as_slice());
    let window_out = window.output.map(|w| w.as_mut_slice());
    if kernel == 0 || channels == 0 {
        return Err(KernelError::invalid(OP, "kernel and channels must be > 0"));
    }
    let ranges = seq_ranges(OP, batch, x_at.rows_in(x.len(), channels))?;
    let rows = ranges.last().map_or(0, |r| r.end);
    let hist = kernel - 1;
    let win_len = ranges.len() * hist * channels;
    check_len(OP, "weight", weight, channels * kernel)?;
    check_len(OP, "out", out, rows * channels)?;
    if let Some(w) = window_in {
        check_len(OP, "window_in", w, win_len)?;
    }
    let mut window_out = window_out;
    if let Some(w) = window_out.as_deref() {
        check_len(OP, "window_out", w, win_len)?;
    }
    let output_at = window.output_at.map(|at| at.as_slice());
    if let Some(at) = output_at {
        check_len(OP, "output_at", at, ranges.len())?;
    }

    for (s, r) in ranges.iter().enumerate() {
        let len = r.len();
        // Pre-conv input at sequence-local time `t`, where t < 0 reads the carried window.
        let input = |t: isize, c: usize| -> f32 {
            if t >= 0 {
                x[x_at.at(r.start + t as usize, c)]
            } else {
                let back = (-t) as usize; // 1 = the newest window row
                if back > hist {
                    return 0.0;
                }
                window_in.map_or(0.0, |w| w[(s * hist + hist - back) * channels + c])
            }
        };
        for t in 0..len {
            for c in 0..channels {
                let mut acc = 0.0f32;
                for i in 0..kernel {
                    let src = t as isize - hist as isize + i as isize;
                    acc += weight[c * kernel + i] * input(src, c);
                }
                out[(r.start + t) * channels + c] = silu(acc);
            }
        }
        if let Some(w) = window_out.as_deref_mut() {
            // The window after `end` of the sequence's tokens (all of them unless told).
            let end = output_at.map_or(len, |at| (at[s] as usize).min(len));
            for i in 0..hist {
                let t = end as isize - hist as isize + i as isize;
                for c in 0..channels {
                    w[(s * hist + i) * channels + c] = input(t, c);
                }
            }
        }
    }
    Ok(())
}
