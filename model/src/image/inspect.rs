//! Header-only inspection: format, size and frame count read from the first bytes of the file, so
//! that limits are enforced before a single pixel is decoded (a decompression bomb costs nothing).

use std::fmt;

use super::ImageError;

/// The two accepted container formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFormat {
    Png,
    Jpeg,
}

impl ImageFormat {
    /// The MIME type a data URL must declare for this format.
    pub fn mime(self) -> &'static str {
        match self {
            ImageFormat::Png => "image/png",
            ImageFormat::Jpeg => "image/jpeg",
        }
    }

    /// The format a declared MIME type names, if it is one we accept.
    pub fn from_mime(mime: &str) -> Option<Self> {
        match mime {
            "image/png" => Some(ImageFormat::Png),
            "image/jpeg" => Some(ImageFormat::Jpeg),
            _ => None,
        }
    }

    /// The format the magic bytes announce.
    pub fn detect(bytes: &[u8]) -> Option<Self> {
        if bytes.starts_with(PNG_SIGNATURE) {
            Some(ImageFormat::Png)
        } else if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
            Some(ImageFormat::Jpeg)
        } else {
            None
        }
    }
}

impl fmt::Display for ImageFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ImageFormat::Png => "PNG",
            ImageFormat::Jpeg => "JPEG",
        })
    }
}

/// What the header says, before any pixel is decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageInfo {
    pub format: ImageFormat,
    pub width: u32,
    pub height: u32,
    /// Frames announced by an APNG `acTL` chunk; 1 for a still PNG or a JPEG.
    pub frames: u32,
    /// True when the PNG carries an `acTL` chunk (APNG), whatever its frame count.
    pub animated: bool,
    /// PNG colour type and bit depth from `IHDR` (the RGB conversion depends on them); `None` for JPEG.
    pub png_color: Option<PngColor>,
}

/// `IHDR` colour type and bit depth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PngColor {
    pub color_type: u8,
    pub bit_depth: u8,
}

impl PngColor {
    /// 16-bit grayscale without an alpha channel: Pillow opens it as `I;16` and clamps to 255.
    pub fn is_gray16(self) -> bool {
        self.color_type == 0 && self.bit_depth == 16
    }
}

const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";

/// Reads format, size and frame count from the header without decoding pixels.
pub fn inspect(bytes: &[u8]) -> Result<ImageInfo, ImageError> {
    match ImageFormat::detect(bytes) {
        Some(ImageFormat::Png) => inspect_png(bytes),
        Some(ImageFormat::Jpeg) => inspect_jpeg(bytes),
        None => Err(ImageError::UnknownFormat),
    }
}

fn png_error(reason: &'static str) -> ImageError {
    ImageError::MalformedHeader {
        format: ImageFormat::Png,
        reason,
    }
}

fn jpeg_error(reason: &'static str) -> ImageError {
    ImageError::MalformedHeader {
        format: ImageFormat::Jpeg,
        reason,
    }
}

fn be_u32(bytes: &[u8]) -> u32 {
    u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

fn be_u16(bytes: &[u8]) -> u16 {
    u16::from_be_bytes([bytes[0], bytes[1]])
}

/// Walks the chunk list up to the first `IDAT`: `IHDR` must come first, and an `acTL` (APNG) and
/// the `PLTE` must come before the image data, so nothing after it needs reading.
fn inspect_png(bytes: &[u8]) -> Result<ImageInfo, ImageError> {
    let mut pos = PNG_SIGNATURE.len();
    let mut header: Option<(u32, u32, PngColor)> = None;
    let mut frames = 1;
    let mut animated = false;
    loop {
        let chunk_header = bytes
            .get(pos..pos + 8)
            .ok_or_else(|| png_error("file ends before the image data"))?;
        let length = be_u32(&chunk_header[..4]) as usize;
        let kind = &chunk_header[4..8];
        let data_start = pos + 8;
        let data = bytes
            .get(data_start..data_start.saturating_add(length))
            .ok_or_else(|| png_error("chunk runs past the end of the file"))?;
        if header.is_none() && kind != b"IHDR" {
            return Err(png_error("first chunk is not IHDR"));
        }
        match kind {
            b"IHDR" => {
                if header.is_some() {
                    return Err(png_error("IHDR appears twice"));
                }
                if length != 13 {
                    return Err(png_error("IHDR is not 13 bytes"));
                }
                let color = PngColor {
                    bit_depth: data[8],
                    color_type: data[9],
                };
                header = Some((be_u32(&data[0..4]), be_u32(&data[4..8]), color));
            }
            b"acTL" => {
                if length < 8 {
                    return Err(png_error("acTL is shorter than 8 bytes"));
                }
                animated = true;
                frames = be_u32(&data[0..4]);
            }
            // The spec makes a length that is not whole RGB entries an error; the `png` decoder
            // (0.18.1) panics on one instead of refusing it.
            b"PLTE" if length == 0 || !length.is_multiple_of(3) || length > 256 * 3 => {
                return Err(png_error("PLTE is not 1 to 256 RGB entries"));
            }
            b"IDAT" | b"IEND" => break,
            _ => {}
        }
        // Data plus the 4-byte CRC.
        pos = data_start + length + 4;
    }
    let (width, height, color) = header.ok_or_else(|| png_error("no IHDR chunk"))?;
    Ok(ImageInfo {
        format: ImageFormat::Png,
        width,
        height,
        frames,
        animated,
        png_color: Some(color),
    })
}

/// Walks the marker segments up to the first start-of-frame (SOFn) and reads its size.
fn inspect_jpeg(bytes: &[u8]) -> Result<ImageInfo, ImageError> {
    let mut pos = 2;
    loop {
        // Markers are 0xFF followed by a code; extra 0xFF bytes are fill.
        if bytes.get(pos) != Some(&0xFF) {
            return Err(jpeg_error("expected a marker"));
        }
        while bytes.get(pos) == Some(&0xFF) {
            pos += 1;
        }
        let marker = *bytes
            .get(pos)
            .ok_or_else(|| jpeg_error("file ends before the frame header"))?;
        pos += 1;
        // Standalone markers carry no length.
        if marker == 0x01 || (0xD0..=0xD7).contains(&marker) {
            continue;
        }
        if marker == 0xD9 || marker == 0xDA {
            return Err(jpeg_error("no frame header before the scan data"));
        }
        let length = bytes
            .get(pos..pos + 2)
            .map(be_u16)
            .ok_or_else(|| jpeg_error("segment length runs past the end of the file"))?
            as usize;
        if length < 2 {
            return Err(jpeg_error("segment length below 2"));
        }
        let segment = bytes
            .get(pos + 2..pos + length)
            .ok_or_else(|| jpeg_error("segment runs past the end of the file"))?;
        let is_start_of_frame =
            (0xC0..=0xCF).contains(&marker) && !matches!(marker, 0xC4 | 0xC8 | 0xCC);
        if is_start_of_frame {
            if segment.len() < 6 {
                return Err(jpeg_error("frame header shorter than 6 bytes"));
            }
            // Pillow refuses a truncated JPEG ("image file is truncated"); the Rust decoder would
            // fill the missing rows, so require the end-of-image marker after the frame header.
            // 0xFF inside entropy-coded data is always stuffed, so this pair is only ever EOI.
            let rest = &bytes[pos + length..];
            if !rest.windows(2).any(|pair| pair == [0xFF, 0xD9]) {
                return Err(jpeg_error("no end-of-image marker: the file is truncated"));
            }
            let height = u32::from(be_u16(&segment[1..3]));
            let width = u32::from(be_u16(&segment[3..5]));
            return Ok(ImageInfo {
                format: ImageFormat::Jpeg,
                width,
                height,
                frames: 1,
                animated: false,
                png_color: None,
            });
        }
        pos += length;
    }
}
