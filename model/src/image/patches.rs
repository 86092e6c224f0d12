//! Normalization and patch packing: the flat `pixel_values` the vision tower's patch embedding reads.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use super::decode::RgbImage;

pub const PATCH_SIZE: usize = 16;
pub const TEMPORAL_PATCH_SIZE: usize = 2;
pub const MERGE_SIZE: usize = 2;
const CHANNELS: usize = 3;
/// Values per patch: channel 3 x frame 2 x y 16 x x 16.
pub const PATCH_VALUES: usize = CHANNELS * TEMPORAL_PATCH_SIZE * PATCH_SIZE * PATCH_SIZE;

/// The reference fuses rescale (1/255) and normalize (mean = std = 0.5) into
/// `(v - 127.5) / 127.5` in f32 (a subtraction then a true division), so one table of the 256
/// possible results is bit-exact.
fn normalization_table() -> [f32; 256] {
    let mut table = [0f32; 256];
    for (v, out) in table.iter_mut().enumerate() {
        *out = (v as f32 - 127.5f32) / 127.5f32;
    }
    table
}

/// Packs an image whose sides are multiples of `PATCH_SIZE * MERGE_SIZE` into
/// `[grid_h * grid_w, PATCH_VALUES]`, patches in spatial-merge-block order (2x2 blocks row-major,
/// inside a block r0c0, r0c1, r1c0, r1c1), the one frame repeated to `TEMPORAL_PATCH_SIZE`.
pub fn patchify(image: &RgbImage) -> (Vec<f32>, usize, usize) {
    let table = normalization_table();
    let (width, height) = (image.width as usize, image.height as usize);
    let (grid_h, grid_w) = (height / PATCH_SIZE, width / PATCH_SIZE);
    let row_len = width * CHANNELS;
    let len = grid_h * grid_w * PATCH_VALUES;
    // Not zeroed first: zeroing the 24 MB of a 1024x1024 image cost more than filling them (the
    // allocator hands back reused memory, so the zeroing was a memset on one thread).
    let mut values: Vec<f32> = Vec::with_capacity(len);
    let spare = &mut values.spare_capacity_mut()[..len];
    let block = PATCH_SIZE * MERGE_SIZE;
    if width % block != 0 || height % block != 0 {
        // Patches outside whole merge blocks are not filled below: they stay zero.
        spare.fill(MaybeUninit::new(0.0));
    }
    // One row of merge blocks is one contiguous run of patches: the rows fill in parallel (the
    // packing writes 8 bytes per pixel value and is bound by memory, which one core cannot fill).
    let block_row_len = (grid_w * MERGE_SIZE * PATCH_VALUES).max(1);
    spare
        .par_chunks_mut(block_row_len)
        .enumerate()
        .for_each(|(block_row, run)| {
            let mut patches = run.chunks_exact_mut(PATCH_VALUES);
            for block_col in 0..grid_w / MERGE_SIZE {
                for inner_row in 0..MERGE_SIZE {
                    for inner_col in 0..MERGE_SIZE {
                        let patch = patches.next().expect("patch count matches the grid");
                        let top = (block_row * MERGE_SIZE + inner_row) * PATCH_SIZE;
                        let left = (block_col * MERGE_SIZE + inner_col) * PATCH_SIZE;
                        fill_patch(patch, &image.pixels, row_len, top, left, &table);
                    }
                }
            }
        });
    // SAFETY: all `len` values are initialized: with both sides multiples of the merge block, the
    // block rows cover the buffer and every patch of each is filled whole (`fill_patch` writes all
    // PATCH_VALUES); otherwise the buffer was zeroed first.
    unsafe { values.set_len(len) };
    (values, grid_h, grid_w)
}

/// Writes all `PATCH_VALUES` of one patch.
fn fill_patch(
    patch: &mut [MaybeUninit<f32>],
    pixels: &[u8],
    row_len: usize,
    top: usize,
    left: usize,
    table: &[f32; 256],
) {
    let frame_len = PATCH_SIZE * PATCH_SIZE;
    for c in 0..CHANNELS {
        let (first, rest) = patch[c * TEMPORAL_PATCH_SIZE * frame_len..].split_at_mut(frame_len);
        for y in 0..PATCH_SIZE {
            let row = &pixels[(top + y) * row_len + left * CHANNELS..][..PATCH_SIZE * CHANNELS];
            for x in 0..PATCH_SIZE {
                first[y * PATCH_SIZE + x] = MaybeUninit::new(table[row[x * CHANNELS + c] as usize]);
            }
        }
        // Later frames repeat the first.
        for frame in rest[..(TEMPORAL_PATCH_SIZE - 1) * frame_len].chunks_exact_mut(frame_len) {
            frame.copy_from_slice(first);
        }
    }
}
