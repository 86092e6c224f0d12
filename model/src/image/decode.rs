//! Decoding to interleaved RGB8 the way Pillow's `Image.open(..).convert("RGB")` does it:
//! alpha is dropped (not composited), gray is copied to R=G=B, palette transparency is ignored,
//! 16-bit colour keeps the high byte, and 16-bit gray (Pillow mode `I;16`) is clamped to 255.

use std::io::Cursor;

use ::image::{DynamicImage, ImageReader};

use super::{ImageError, ImageFormat, ImageInfo, ImageLimits};

mod fast_png;

/// An RGB8 image, rows top to bottom, pixels interleaved R, G, B.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RgbImage {
    pub width: u32,
    pub height: u32,
    pub pixels: Vec<u8>,
}

/// Decodes `bytes` (already inspected as `info`) to RGB8, with the decoder's own size and
/// allocation limits set as a second line of defence. The common PNGs take a faster exact path
/// (`fast_png`); everything else, and whatever that path declines, goes through `image`.
pub fn decode_rgb(
    bytes: &[u8],
    info: &ImageInfo,
    limits: &ImageLimits,
) -> Result<RgbImage, ImageError> {
    if info.format == ImageFormat::Png {
        // A panic there would be a bug of that path: the file then goes the usual way.
        let fast = std::panic::catch_unwind(|| fast_png::decode(bytes, limits))
            .ok()
            .flatten();
        if let Some(rgb) = fast {
            if (rgb.width, rgb.height) == (info.width, info.height) {
                return Ok(rgb);
            }
        }
    }
    decode_with_image(bytes, info, limits)
}

/// Decoding through the `image` crate (the `png` crate for PNG, `zune-jpeg` for JPEG).
fn decode_with_image(
    bytes: &[u8],
    info: &ImageInfo,
    limits: &ImageLimits,
) -> Result<RgbImage, ImageError> {
    let format = match info.format {
        ImageFormat::Png => ::image::ImageFormat::Png,
        ImageFormat::Jpeg => ::image::ImageFormat::Jpeg,
    };
    let mut reader = ImageReader::with_format(Cursor::new(bytes), format);
    let mut decoder_limits = ::image::Limits::default();
    decoder_limits.max_image_width = Some(limits.max_side);
    decoder_limits.max_image_height = Some(limits.max_side);
    decoder_limits.max_alloc = Some(limits.max_decoder_alloc);
    reader.limits(decoder_limits);
    // A decoder bug (png 0.18.1 panicked on a short palette, found by fuzzing) must make a bad
    // image a client error, never a failed request worker: a panic here is refused as undecodable.
    let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| reader.decode()))
        .map_err(|_| ImageError::Decode("the decoder failed on this image".into()))?
        .map_err(|err| ImageError::Decode(err.to_string()))?;
    if (decoded.width(), decoded.height()) != (info.width, info.height) {
        return Err(ImageError::Decode(format!(
            "decoded size {}x{} differs from the header's {}x{}",
            decoded.width(),
            decoded.height(),
            info.width,
            info.height
        )));
    }
    let gray16_clamps = info.png_color.is_some_and(|color| color.is_gray16());
    let pixels = to_rgb8(decoded, gray16_clamps)?;
    Ok(RgbImage {
        width: info.width,
        height: info.height,
        pixels,
    })
}

fn high_byte(value: u16) -> u8 {
    (value >> 8) as u8
}

fn clamp_to_u8(value: u16) -> u8 {
    value.min(255) as u8
}

fn gray_to_rgb<T: Copy>(values: &[T], stride: usize, to_u8: impl Fn(T) -> u8) -> Vec<u8> {
    values
        .chunks_exact(stride)
        .flat_map(|pixel| [to_u8(pixel[0]); 3])
        .collect()
}

fn color_to_rgb<T: Copy>(values: &[T], stride: usize, to_u8: impl Fn(T) -> u8) -> Vec<u8> {
    values
        .chunks_exact(stride)
        .flat_map(|pixel| [to_u8(pixel[0]), to_u8(pixel[1]), to_u8(pixel[2])])
        .collect()
}

/// `gray16_clamps`: the file is 16-bit gray (PNG colour type 0). The decoder may still hand back
/// gray+alpha when a `tRNS` chunk is present; Pillow ignores that transparency and clamps.
fn to_rgb8(image: DynamicImage, gray16_clamps: bool) -> Result<Vec<u8>, ImageError> {
    let gray16 = if gray16_clamps {
        clamp_to_u8
    } else {
        high_byte
    };
    Ok(match image {
        DynamicImage::ImageRgb8(buffer) => buffer.into_raw(),
        DynamicImage::ImageRgba8(buffer) => color_to_rgb(buffer.as_raw(), 4, |v| v),
        DynamicImage::ImageLuma8(buffer) => gray_to_rgb(buffer.as_raw(), 1, |v| v),
        DynamicImage::ImageLumaA8(buffer) => gray_to_rgb(buffer.as_raw(), 2, |v| v),
        DynamicImage::ImageRgb16(buffer) => color_to_rgb(buffer.as_raw(), 3, high_byte),
        DynamicImage::ImageRgba16(buffer) => color_to_rgb(buffer.as_raw(), 4, high_byte),
        DynamicImage::ImageLuma16(buffer) => gray_to_rgb(buffer.as_raw(), 1, gray16),
        DynamicImage::ImageLumaA16(buffer) => gray_to_rgb(buffer.as_raw(), 2, gray16),
        other => {
            return Err(ImageError::UnsupportedLayout(format!(
                "{:?}",
                other.color()
            )))
        }
    })
}
