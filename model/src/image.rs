//! Screenshot preprocessing for the vision tower, identical to the reference (transformers 5.17.0
//! `Qwen2VLImageProcessor`, torchvision backend, with the Qwen3.5 settings): header-first limits,
//! decoding to RGB as Pillow does, `smart_resize` to multiples of 32, torch's uint8 antialiased
//! bicubic resize, fused rescale+normalize in f32, and patches in spatial-merge-block order. The
//! last two steps are the vision tower's backend's (`VisionBackend::write_patch_rows`): a
//! screenshot is held as its resized u8 image (an eighth of the bytes of its f32 rows) until the
//! tower packs it.

mod decode;
mod error;
mod inspect;
mod limits;
mod patches;
mod resize;
mod smart_resize;

pub use decode::{decode_rgb, RgbImage};
pub use error::ImageError;
pub use inspect::{inspect, ImageFormat, ImageInfo, PngColor};
pub use limits::ImageLimits;
pub use patches::{patchify, MERGE_SIZE, PATCH_SIZE, PATCH_VALUES, TEMPORAL_PATCH_SIZE};
pub use resize::resize_bicubic_antialias;
pub use smart_resize::smart_resize;

use crate::vision::ImageInput;

/// `size.shortest_edge` of Qwen3.5's preprocessor config (256²).
pub const MIN_PIXELS: u64 = 65_536;
/// `size.longest_edge` (4096²).
pub const MAX_PIXELS: u64 = 16_777_216;
/// Each resized side is a multiple of this (patch 16 x merge 2).
pub const RESIZE_FACTOR: u32 = (PATCH_SIZE * MERGE_SIZE) as u32;

/// The vision tower's input for one screenshot.
#[derive(Debug, Clone, PartialEq)]
pub struct Preprocessed {
    /// The resized image (`resized`, sides multiples of 32), which the tower packs into its patch
    /// rows.
    pub image: RgbImage,
    /// `[1, resized_height / 16, resized_width / 16]`.
    pub grid_thw: [u32; 3],
    /// `(width, height)` after `smart_resize`.
    pub resized: (u32, u32),
}

impl Preprocessed {
    pub fn patch_count(&self) -> usize {
        self.grid_thw.iter().map(|&v| v as usize).product()
    }

    /// Image tokens in the prompt after the 2x2 merge.
    pub fn image_tokens(&self) -> usize {
        self.patch_count() / (MERGE_SIZE * MERGE_SIZE)
    }

    /// The reference processor's `pixel_values` (`[patches, PATCH_VALUES]`, row-major): the rows
    /// the tower's backend packs, on the host (for checks against the reference).
    pub fn pixel_values(&self) -> Vec<f32> {
        patchify(&self.image).0
    }

    /// The image as the vision tower takes it.
    pub fn tower_input(&self) -> ImageInput<'_> {
        ImageInput {
            rgb: &self.image.pixels,
            grid_thw: self.grid_thw,
        }
    }
}

/// Preprocesses a screenshot under the serving limits (`ImageLimits::SERVING`).
pub fn preprocess(bytes: &[u8], declared_mime: &str) -> Result<Preprocessed, ImageError> {
    preprocess_with_limits(bytes, declared_mime, &ImageLimits::SERVING)
}

/// Preprocesses a screenshot under the given limits: header checks, decode, resize.
pub fn preprocess_with_limits(
    bytes: &[u8],
    declared_mime: &str,
    limits: &ImageLimits,
) -> Result<Preprocessed, ImageError> {
    let info = limits.check(bytes, declared_mime)?;
    let rgb = decode_rgb(bytes, &info, limits)?;
    preprocess_rgb(rgb)
}

/// The steps after decoding: `smart_resize` and the resize (the tower's backend normalizes and
/// packs the patches).
pub fn preprocess_rgb(rgb: RgbImage) -> Result<Preprocessed, ImageError> {
    let (height, width) =
        smart_resize(rgb.height, rgb.width, RESIZE_FACTOR, MIN_PIXELS, MAX_PIXELS)?;
    let image = resize_bicubic_antialias(rgb, width, height);
    let patch = PATCH_SIZE as u32;
    Ok(Preprocessed {
        image,
        grid_thw: [1, height / patch, width / patch],
        resized: (width, height),
    })
}
