//! Screenshot preprocessing for the vision tower, identical to the reference (transformers 5.17.0
//! `Qwen2VLImageProcessor`, torchvision backend, with the Qwen3.5 settings): header-first limits,
//! decoding to RGB as Pillow does, `smart_resize` to multiples of 32, torch's uint8 antialiased
//! bicubic resize, fused rescale+normalize in f32, and patches in spatial-merge-block order.

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

/// `size.shortest_edge` of Qwen3.5's preprocessor config (256²).
pub const MIN_PIXELS: u64 = 65_536;
/// `size.longest_edge` (4096²).
pub const MAX_PIXELS: u64 = 16_777_216;
/// Each resized side is a multiple of this (patch 16 x merge 2).
pub const RESIZE_FACTOR: u32 = (PATCH_SIZE * MERGE_SIZE) as u32;

/// The vision tower's input for one screenshot.
#[derive(Debug, Clone, PartialEq)]
pub struct Preprocessed {
    /// `[patches, PATCH_VALUES]`, row-major.
    pub pixel_values: Vec<f32>,
    /// `[1, resized_height / 16, resized_width / 16]`.
    pub grid_thw: [u32; 3],
    /// `(width, height)` after `smart_resize`.
    pub resized: (u32, u32),
}

impl Preprocessed {
    pub fn patch_count(&self) -> usize {
        self.pixel_values.len() / PATCH_VALUES
    }

    /// Image tokens in the prompt after the 2x2 merge.
    pub fn image_tokens(&self) -> usize {
        self.patch_count() / (MERGE_SIZE * MERGE_SIZE)
    }
}

/// Preprocesses a screenshot under the serving limits (`ImageLimits::SERVING`).
pub fn preprocess(bytes: &[u8], declared_mime: &str) -> Result<Preprocessed, ImageError> {
    preprocess_with_limits(bytes, declared_mime, &ImageLimits::SERVING)
}

/// Preprocesses a screenshot under the given limits: header checks, decode, resize, patches.
pub fn preprocess_with_limits(
    bytes: &[u8],
    declared_mime: &str,
    limits: &ImageLimits,
) -> Result<Preprocessed, ImageError> {
    let info = limits.check(bytes, declared_mime)?;
    let rgb = decode_rgb(bytes, &info, limits)?;
    preprocess_rgb(rgb)
}

/// The steps after decoding: `smart_resize`, resize, normalize, patches.
pub fn preprocess_rgb(rgb: RgbImage) -> Result<Preprocessed, ImageError> {
    let (height, width) =
        smart_resize(rgb.height, rgb.width, RESIZE_FACTOR, MIN_PIXELS, MAX_PIXELS)?;
    let resized = resize_bicubic_antialias(rgb, width, height);
    let (pixel_values, grid_h, grid_w) = patchify(&resized);
    Ok(Preprocessed {
        pixel_values,
        grid_thw: [1, grid_h as u32, grid_w as u32],
        resized: (width, height),
    })
}
