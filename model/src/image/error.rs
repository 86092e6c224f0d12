//! Why a screenshot was refused or could not be preprocessed.

use super::ImageFormat;

/// Every way a screenshot can be refused. Messages are written for the HTTP client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    #[error("unsupported image MIME type {0:?}: expected image/png or image/jpeg")]
    UnsupportedMime(String),
    #[error("image data is neither PNG nor JPEG")]
    UnknownFormat,
    #[error("declared MIME type {declared} does not match the image data, which is {detected}")]
    MimeMismatch {
        declared: String,
        detected: &'static str,
    },
    #[error("image is {size} bytes, over the limit of {limit} bytes")]
    TooManyBytes { size: usize, limit: usize },
    #[error("malformed {format} header: {reason}")]
    MalformedHeader {
        format: ImageFormat,
        reason: &'static str,
    },
    #[error("image has zero width or height ({width}x{height})")]
    Empty { width: u32, height: u32 },
    #[error("image is {width}x{height}, over the limit of {limit} px per side")]
    SideTooLong { width: u32, height: u32, limit: u32 },
    #[error("image is {width}x{height} = {pixels} px, over the limit of {limit} px")]
    TooManyPixels {
        width: u32,
        height: u32,
        pixels: u64,
        limit: u64,
    },
    #[error("image is {width}x{height}: aspect ratio over {limit}:1")]
    AspectRatio { width: u32, height: u32, limit: u32 },
    #[error("animated images are refused (APNG with {frames} frames)")]
    Animated { frames: u32 },
    #[error("image could not be decoded: {0}")]
    Decode(String),
    #[error("decoded image has an unsupported pixel layout: {0}")]
    UnsupportedLayout(String),
}
