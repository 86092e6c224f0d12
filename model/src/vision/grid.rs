//! Patch coordinates and the learned position embedding, per image grid.
//!
//! `pixel_values` rows come in spatial-merge-block order: the `merge×merge` patches of one LLM
//! token are consecutive, blocks in row-major order. Patch `i` of a frame therefore sits at
//! `row = block_row·merge + in_row`, `col = block_col·merge + in_col`.

use anyhow::{ensure, Result};

/// `(row, col)` of every patch of an image, frame after frame, in block order.
pub fn patch_coords(grid_thw: [u32; 3], merge: usize) -> Result<Vec<(usize, usize)>> {
    let [t, h, w] = grid_thw.map(|v| v as usize);
    ensure!(
        t > 0 && h > 0 && w > 0 && merge > 0 && h % merge == 0 && w % merge == 0,
        "image grid {grid_thw:?} is empty or not divisible by the merge size {merge}"
    );
    let blocks_w = w / merge;
    let frame: Vec<(usize, usize)> = (0..h * w)
        .map(|i| {
            let in_col = i % merge;
            let in_row = (i / merge) % merge;
            let block = i / (merge * merge);
            let (block_row, block_col) = (block / blocks_w, block % blocks_w);
            (block_row * merge + in_row, block_col * merge + in_col)
        })
        .collect();
    Ok(frame.iter().copied().cycle().take(t * h * w).collect())
}

/// The two taps into a `side`-long table axis and their weights for target index `index` on an
/// axis of `size` (bilinear, align_corners = True, edge-clamped), with PyTorch's f32 rounding:
/// `src = f32(index·(side−1)) / f32(max(size−1, 1))`.
fn axis_taps(index: usize, size: usize, side: usize) -> [(usize, f32); 2] {
    let src = (index * (side - 1)) as f32 / (size.max(2) - 1) as f32;
    let floor = src.floor();
    let frac = src - floor;
    let lo = floor as usize;
    [
        (lo.min(side - 1), (1.0 - frac.abs()).max(0.0)),
        ((lo + 1).min(side - 1), (1.0 - (frac - 1.0).abs()).max(0.0)),
    ]
}

/// Adds the position table (`[side², dim]`), bilinearly resampled to the image grid, to `hidden`
/// (`[patches, dim]`, patches as [`patch_coords`] lists them).
pub fn add_position_embedding(
    hidden: &mut [f32],
    coords: &[(usize, usize)],
    grid_hw: (usize, usize),
    table: &[f32],
    side: usize,
    dim: usize,
) -> Result<()> {
    ensure!(
        hidden.len() == coords.len() * dim && table.len() == side * side * dim && side > 0,
        "position embedding: sizes do not fit"
    );
    let mut sum = vec![0.0f32; dim];
    for (row_out, &(r, c)) in hidden.chunks_exact_mut(dim).zip(coords) {
        let rows = axis_taps(r, grid_hw.0, side);
        let cols = axis_taps(c, grid_hw.1, side);
        sum.fill(0.0);
        // Tap order (r0c0, r0c1, r1c0, r1c1), weights multiplied in f32 as transformers does.
        for &(tr, wr) in &rows {
            for &(tc, wc) in &cols {
                let weight = wr * wc;
                let entry = &table[(tr * side + tc) * dim..][..dim];
                for (s, &e) in sum.iter_mut().zip(entry) {
                    *s += e * weight;
                }
            }
        }
        for (h, &s) in row_out.iter_mut().zip(&sum) {
            *h += s;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_order_visits_each_2x2_block_before_the_next() {
        let coords = patch_coords([1, 4, 6], 2).unwrap();
        assert_eq!(
            &coords[..8],
            &[
                (0, 0),
                (0, 1),
                (1, 0),
                (1, 1),
                (0, 2),
                (0, 3),
                (1, 2),
                (1, 3)
            ]
        );
        assert_eq!(coords[12], (2, 0));
        let mut sorted = coords.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 24);
    }

    #[test]
    fn taps_hit_the_table_corners_exactly() {
        assert_eq!(axis_taps(0, 10, 8), [(0, 1.0), (1, 0.0)]);
        assert_eq!(axis_taps(9, 10, 8), [(7, 1.0), (7, 0.0)]);
        // A one-patch axis reads the first entry.
        assert_eq!(axis_taps(0, 1, 8), [(0, 1.0), (1, 0.0)]);
        let [(a, wa), (b, wb)] = axis_taps(3, 8, 8);
        assert_eq!((a, b), (3, 4));
        assert!((wa - 1.0).abs() < 1e-6 && wb.abs() < 1e-6);
    }
}
