//! Request-level limits, checked on the header before decoding (the System1-Omni multimodal
//! contract: at most 4 MiB of image data, 2048 px per side, 1,048,576 px, aspect 200:1, one frame).

use super::{inspect, ImageError, ImageFormat, ImageInfo};

/// What a screenshot may be. `SERVING` is the contract; `PREPROCESSOR_ONLY` keeps only what the
/// reference processor itself refuses (aspect over 200:1), for testing preprocessing on larger images.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageLimits {
    /// Encoded image bytes (after base64 decoding).
    pub max_bytes: usize,
    pub max_side: u32,
    pub max_pixels: u64,
    /// Largest allowed `max(w, h) / min(w, h)`.
    pub max_aspect_ratio: u32,
    /// Cap on what the decoder may allocate.
    pub max_decoder_alloc: u64,
}

impl ImageLimits {
    pub const SERVING: ImageLimits = ImageLimits {
        max_bytes: 4 * 1024 * 1024,
        max_side: 2048,
        max_pixels: 1_048_576,
        max_aspect_ratio: 200,
        max_decoder_alloc: 32 * 1024 * 1024,
    };

    pub const PREPROCESSOR_ONLY: ImageLimits = ImageLimits {
        max_bytes: 64 * 1024 * 1024,
        max_side: 16_384,
        max_pixels: 64 * 1024 * 1024,
        max_aspect_ratio: 200,
        max_decoder_alloc: 1024 * 1024 * 1024,
    };

    /// Checks the declared MIME type, the byte count and the header against these limits and
    /// returns the header facts; decodes nothing.
    pub fn check(&self, bytes: &[u8], declared_mime: &str) -> Result<ImageInfo, ImageError> {
        let declared = ImageFormat::from_mime(declared_mime)
            .ok_or_else(|| ImageError::UnsupportedMime(declared_mime.to_owned()))?;
        if bytes.len() > self.max_bytes {
            return Err(ImageError::TooManyBytes {
                size: bytes.len(),
                limit: self.max_bytes,
            });
        }
        let info = inspect(bytes)?;
        if info.format != declared {
            return Err(ImageError::MimeMismatch {
                declared: declared_mime.to_owned(),
                detected: info.format.mime(),
            });
        }
        self.check_info(&info)?;
        Ok(info)
    }

    /// The size and frame checks alone.
    pub fn check_info(&self, info: &ImageInfo) -> Result<(), ImageError> {
        let (width, height) = (info.width, info.height);
        if width == 0 || height == 0 {
            return Err(ImageError::Empty { width, height });
        }
        if info.animated || info.frames != 1 {
            return Err(ImageError::Animated {
                frames: info.frames,
            });
        }
        if width > self.max_side || height > self.max_side {
            return Err(ImageError::SideTooLong {
                width,
                height,
                limit: self.max_side,
            });
        }
        let pixels = u64::from(width) * u64::from(height);
        if pixels > self.max_pixels {
            return Err(ImageError::TooManyPixels {
                width,
                height,
                pixels,
                limit: self.max_pixels,
            });
        }
        // Integer form of `max / min > limit`, the reference's float test (exact for these sizes).
        let (long, short) = (width.max(height), width.min(height));
        if u64::from(long) > u64::from(short) * u64::from(self.max_aspect_ratio) {
            return Err(ImageError::AspectRatio {
                width,
                height,
                limit: self.max_aspect_ratio,
            });
        }
        Ok(())
    }
}
