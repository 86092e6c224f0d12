//! A screenshot's patch rows, the vision tower's input: the resized u8 RGB image normalized and
//! packed as transformers' Qwen2-VL processor packs `pixel_values` (patch 16, the one frame repeated
//! to 2, spatial-merge-block order). Here: the layout, the checks and the host packing that the CPU
//! backend, the tests and the goldens use; `VisionBackend::write_patch_rows` packs on a backend.

use rayon::prelude::*;

use crate::backend::KernelResult;
use crate::error::KernelError;

pub const PATCH_SIZE: usize = 16;
pub const TEMPORAL_PATCH_SIZE: usize = 2;
pub const MERGE_SIZE: usize = 2;
pub const CHANNELS: usize = 3;
/// Values per patch row: channel 3 x frame 2 x y 16 x x 16.
pub const PATCH_VALUES: usize = CHANNELS * TEMPORAL_PATCH_SIZE * PATCH_SIZE * PATCH_SIZE;
/// Each side of a packed image is a multiple of this (patch x merge): whole merge blocks.
pub const BLOCK_SIDE: usize = PATCH_SIZE * MERGE_SIZE;

/// The value of a u8 level. The reference fuses rescale (1/255) and normalize (mean = std = 0.5)
/// into `(v - 127.5) / 127.5` in f32 (a subtraction then a true division); the CUDA kernel computes
/// the same two roundings (`patch_value` in vision.cu).
pub fn normalize(level: u8) -> f32 {
    (level as f32 - 127.5f32) / 127.5f32
}

/// [`normalize`] of every level: one lookup per value when packing.
pub fn normalization_table() -> [f32; 256] {
    std::array::from_fn(|v| normalize(v as u8))
}

/// A resized RGB image (rows top to bottom, R, G, B interleaved), sides multiples of
/// [`BLOCK_SIDE`].
#[derive(Clone, Copy, Debug)]
pub struct PatchImage<'a> {
    pub rgb: &'a [u8],
    pub width: usize,
    pub height: usize,
}

impl<'a> PatchImage<'a> {
    pub fn new(rgb: &'a [u8], width: usize, height: usize) -> Self {
        Self { rgb, width, height }
    }

    /// `(grid_h, grid_w)`: patches down and across.
    pub fn grid(&self) -> (usize, usize) {
        (self.height / PATCH_SIZE, self.width / PATCH_SIZE)
    }

    /// Patch rows it packs into.
    pub fn patches(&self) -> usize {
        let (h, w) = self.grid();
        h * w
    }

    /// Why it cannot be packed, if it cannot: sides that are not whole merge blocks, or bytes
    /// that are not its pixels.
    pub fn check(&self, op: &'static str) -> KernelResult<()> {
        let (w, h) = (self.width, self.height);
        if !w.is_multiple_of(BLOCK_SIDE) || !h.is_multiple_of(BLOCK_SIDE) {
            return Err(KernelError::invalid(
                op,
                format!("a {w}x{h} image: sides must be multiples of {BLOCK_SIDE}"),
            ));
        }
        let need = w * h * CHANNELS;
        if self.rgb.len() != need {
            return Err(KernelError::invalid(
                op,
                format!("a {w}x{h} image holds {} bytes, not {need}", self.rgb.len()),
            ));
        }
        Ok(())
    }
}

/// One image of a [`crate::backend::VisionBackend::write_patch_rows`] call: its patch rows go to
/// rows `first_row..first_row + image.patches()` of the destination.
#[derive(Clone, Copy, Debug)]
pub struct PatchRows<'a> {
    pub image: PatchImage<'a>,
    pub first_row: usize,
}

/// Checks every part of a `write_patch_rows` call into a destination of `dst_len` values: each
/// image packable, its rows inside the destination and apart from every other part's. Returns the
/// rows written in all.
pub fn check_patch_rows(
    op: &'static str,
    parts: &[PatchRows<'_>],
    dst_len: usize,
) -> KernelResult<usize> {
    let mut spans = Vec::with_capacity(parts.len());
    for (i, part) in parts.iter().enumerate() {
        part.image
            .check(op)
            .map_err(|e| KernelError::invalid(op, format!("image {i}: {e}")))?;
        let end = part.first_row + part.image.patches();
        if end * PATCH_VALUES > dst_len {
            return Err(KernelError::invalid(
                op,
                format!(
                    "image {i} ends at row {end}; the destination holds {} rows",
                    dst_len / PATCH_VALUES
                ),
            ));
        }
        if part.image.patches() > 0 {
            spans.push((part.first_row, end));
        }
    }
    spans.sort_unstable();
    if spans.windows(2).any(|w| w[1].0 < w[0].1) {
        return Err(KernelError::invalid(
            op,
            "images overlap in the destination",
        ));
    }
    Ok(spans.iter().map(|(start, end)| end - start).sum())
}

/// The patch rows of `image` (`[patches, PATCH_VALUES]`, row-major), as the reference's
/// `pixel_values`. Panics if it cannot be packed ([`PatchImage::check`]).
pub fn patchify(image: PatchImage<'_>) -> Vec<f32> {
    if let Err(e) = image.check("patchify") {
        panic!("{e}");
    }
    let len = image.patches() * PATCH_VALUES;
    // Not zeroed first: zeroing the 24 MB of a 1024x1024 image cost more than filling them (the
    // allocator hands back reused memory, so the zeroing was a memset on one thread).
    let mut values: Vec<f32> = Vec::with_capacity(len);
    pack(image, &mut values.spare_capacity_mut()[..len]);
    // SAFETY: `pack` wrote all `len` values (every patch of every merge block, whole).
    unsafe { values.set_len(len) };
    values
}

/// Writes the patch rows of `image` into the start of `out` (at least `patches · PATCH_VALUES`
/// values). Panics if it cannot be packed ([`PatchImage::check`]).
pub fn pack_patch_rows(image: PatchImage<'_>, out: &mut [f32]) {
    if let Err(e) = image.check("pack_patch_rows") {
        panic!("{e}");
    }
    let out = &mut out[..image.patches() * PATCH_VALUES];
    // SAFETY: `MaybeUninit<f32>` has the layout of `f32`, and `pack` writes only initialized
    // values, so `out` holds initialized values throughout.
    let out = unsafe { &mut *(out as *mut [f32] as *mut [std::mem::MaybeUninit<f32>]) };
    pack(image, out);
}

/// Fills all of `out` (`patches · PATCH_VALUES` values) with the patch rows of a checked image:
/// patches in spatial-merge-block order (2x2 blocks row-major, inside a block r0c0, r0c1, r1c0,
/// r1c1), the one frame repeated to `TEMPORAL_PATCH_SIZE`.
fn pack(image: PatchImage<'_>, out: &mut [std::mem::MaybeUninit<f32>]) {
    let table = normalization_table();
    let (_, grid_w) = image.grid();
    let row_len = image.width * CHANNELS;
    // One row of merge blocks is one contiguous run of patches: the rows fill in parallel (the
    // packing writes 8 bytes per pixel value and is bound by memory, which one core cannot fill).
    let block_row_len = (grid_w * MERGE_SIZE * PATCH_VALUES).max(1);
    out.par_chunks_mut(block_row_len)
        .enumerate()
        .for_each(|(block_row, run)| {
            let mut patches = run.chunks_exact_mut(PATCH_VALUES);
            for block_col in 0..grid_w / MERGE_SIZE {
                for inner_row in 0..MERGE_SIZE {
                    for inner_col in 0..MERGE_SIZE {
                        let patch = patches.next().expect("patch count matches the grid");
                        let top = (block_row * MERGE_SIZE + inner_row) * PATCH_SIZE;
                        let left = (block_col * MERGE_SIZE + inner_col) * PATCH_SIZE;
                        fill_patch(patch, image.rgb, row_len, top, left, &table);
                    }
                }
            }
        });
}

/// Writes all `PATCH_VALUES` of one patch.
fn fill_patch(
    patch: &mut [std::mem::MaybeUninit<f32>],
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
                first[y * PATCH_SIZE + x] =
                    std::mem::MaybeUninit::new(table[row[x * CHANNELS + c] as usize]);
            }
        }
        // Later frames repeat the first.
        for frame in rest[..(TEMPORAL_PATCH_SIZE - 1) * frame_len].chunks_exact_mut(frame_len) {
            frame.copy_from_slice(first);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_the_references_fused_normalization() {
        let table = normalization_table();
        assert_eq!(table[0], -1.0);
        assert_eq!(table[255], 1.0);
        // 127.5 is between levels: no level maps to 0, the two nearest straddle it.
        assert_eq!(table[127], -0.5 / 127.5);
        assert_eq!(table[128], 0.5 / 127.5);
        // A division, not a product with the reciprocal: they differ in the last bit for some
        // levels, and the reference divides.
        let by_reciprocal = (0..=255u8)
            .filter(|&v| (v as f32 - 127.5) * (1.0 / 127.5f32) != table[v as usize])
            .count();
        assert!(by_reciprocal > 0);
    }

    #[test]
    fn parts_that_cannot_be_packed_are_refused() {
        let rgb = vec![0u8; 64 * 32 * 3];
        let image = PatchImage::new(&rgb, 64, 32);
        let at = |first_row| PatchRows { image, first_row };
        assert_eq!(
            check_patch_rows("t", &[at(0), at(8)], 16 * PATCH_VALUES).unwrap(),
            16
        );
        // Row 8 on: the first image's rows 0..8 and the second's 7..15 overlap.
        let e = check_patch_rows("t", &[at(0), at(7)], 16 * PATCH_VALUES).unwrap_err();
        assert!(e.to_string().contains("overlap"), "{e}");
        let e = check_patch_rows("t", &[at(9)], 16 * PATCH_VALUES).unwrap_err();
        assert!(e.to_string().contains("ends at row 17"), "{e}");
        let short = PatchImage::new(&rgb[1..], 64, 32);
        assert!(short.check("t").is_err());
        let odd = vec![0u8; 48 * 32 * 3];
        let e = PatchImage::new(&odd, 48, 32).check("t").unwrap_err();
        assert!(e.to_string().contains("multiples of 32"), "{e}");
    }
}
