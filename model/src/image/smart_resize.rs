//! The Qwen2-VL `smart_resize`: the target size, a multiple of `factor` on each side, within
//! `[min_pixels, max_pixels]`, keeping the aspect ratio as well as it can.

use super::ImageError;

/// Returns `(height, width)` as the reference computes it, in f64 with Python's
/// round-half-to-even (1040 / 32 = 32.5 rounds to 32, not 33).
pub fn smart_resize(
    height: u32,
    width: u32,
    factor: u32,
    min_pixels: u64,
    max_pixels: u64,
) -> Result<(u32, u32), ImageError> {
    if height == 0 || width == 0 {
        return Err(ImageError::Empty { width, height });
    }
    let (h, w, f) = (f64::from(height), f64::from(width), f64::from(factor));
    if h.max(w) / h.min(w) > 200.0 {
        return Err(ImageError::AspectRatio {
            width,
            height,
            limit: 200,
        });
    }
    let mut h_bar = (h / f).round_ties_even() * f;
    let mut w_bar = (w / f).round_ties_even() * f;
    if h_bar * w_bar > max_pixels as f64 {
        let beta = ((h * w) / max_pixels as f64).sqrt();
        h_bar = f.max((h / beta / f).floor() * f);
        w_bar = f.max((w / beta / f).floor() * f);
    } else if h_bar * w_bar < min_pixels as f64 {
        let beta = (min_pixels as f64 / (h * w)).sqrt();
        h_bar = (h * beta / f).ceil() * f;
        w_bar = (w * beta / f).ceil() * f;
    }
    Ok((h_bar as u32, w_bar as u32))
}
