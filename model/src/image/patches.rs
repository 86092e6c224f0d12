//! Normalization and patch packing: the flat `pixel_values` the vision tower's patch embedding reads,
//! packed by the kernels crate (where a backend packs them too, from the same u8 image).

use instinct_kernels::patches::PatchImage;
pub use instinct_kernels::patches::{MERGE_SIZE, PATCH_SIZE, PATCH_VALUES, TEMPORAL_PATCH_SIZE};

use super::decode::RgbImage;

/// Packs an image whose sides are multiples of `PATCH_SIZE * MERGE_SIZE` into
/// `[grid_h * grid_w, PATCH_VALUES]`, patches in spatial-merge-block order (2x2 blocks row-major,
/// inside a block r0c0, r0c1, r1c0, r1c1), the one frame repeated to `TEMPORAL_PATCH_SIZE`.
/// Returns the values, `grid_h` and `grid_w`. Panics on other sides (`preprocess` never makes
/// them).
pub fn patchify(image: &RgbImage) -> (Vec<f32>, usize, usize) {
    let image = patch_image(image);
    let (grid_h, grid_w) = image.grid();
    (instinct_kernels::patches::patchify(image), grid_h, grid_w)
}

/// `image` as the kernels crate packs it.
fn patch_image(image: &RgbImage) -> PatchImage<'_> {
    PatchImage::new(&image.pixels, image.width as usize, image.height as usize)
}
