//! Partial multi-axis rotary embedding (see [`Rope`] for the frequency-to-axis rule).

use super::check_len;
use crate::backend::{HeadLayout, KernelResult, Rope};
use crate::error::KernelError;

pub(super) fn apply(
    x: &mut [f32],
    layout: HeadLayout,
    positions: &[u32],
    rows: usize,
    rope: &Rope,
) -> KernelResult<()> {
    const OP: &str = "rope";
    layout.check_fits(OP, x.len(), rows)?;
    check_len(OP, "positions", positions, rows * 3)?;
    let rot = rope.rotary_dim;
    if !rot.is_multiple_of(2) || rot > layout.head_dim {
        return Err(KernelError::invalid(
            OP,
            format!(
                "rotary_dim {rot} must be even and at most head_dim {}",
                layout.head_dim
            ),
        ));
    }
    let half = rot / 2;
    let inv_freq: Vec<f32> = (0..half).map(|j| rope.inv_freq(j)).collect();
    let axes: Vec<usize> = (0..half).map(|j| rope.axis(j)).collect();
    let mut cos = vec![0.0f32; half];
    let mut sin = vec![0.0f32; half];
    for t in 0..rows {
        let pos = &positions[t * 3..t * 3 + 3];
        for j in 0..half {
            // Same rounding as PyTorch: the angle is an f32 product, cos/sin of that f32.
            let angle = pos[axes[j]] as f32 * inv_freq[j];
            cos[j] = angle.cos();
            sin[j] = angle.sin();
        }
        for h in 0..layout.heads {
            let start = t * layout.row_stride + layout.offset + h * layout.head_stride;
            let head = &mut x[start..start + rot];
            let (lo, hi) = head.split_at_mut(half);
            for j in 0..half {
                let (a, b) = (lo[j], hi[j]);
                lo[j] = a * cos[j] - b * sin[j];
                hi[j] = b * cos[j] + a * sin[j];
            }
        }
    }
    Ok(())
}
