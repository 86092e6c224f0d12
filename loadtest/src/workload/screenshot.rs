//! Screenshot requests for the synthetic workload: the server's image limits, its image-token
//! count, and seeded screen-like PNGs.
//!
//! The limits mirror the server's (`ImageLimits::SERVING` in `model/src/image/limits.rs`,
//! `runtime/src/screenshot.rs`); a test checks they still agree.

use std::fmt;
use std::str::FromStr;

use anyhow::{bail, Context, Result};
use base64::Engine as _;
use image::codecs::png::PngEncoder;
use image::{ExtendedColorType, ImageEncoder};

/// Longest image side the server accepts, in pixels.
pub const MAX_SIDE: u32 = 2048;
/// Most pixels of one image.
pub const MAX_PIXELS: u64 = 1_048_576;
/// Largest `long side / short side`.
pub const MAX_ASPECT_RATIO: u32 = 200;
/// Largest image file (after base64 decoding).
pub const MAX_IMAGE_BYTES: usize = 4 * 1024 * 1024;
/// Largest screenshot request body (the server's default `--max-screenshot-body-bytes`).
pub const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;
/// Most questions of a screenshot request.
pub const MAX_QUESTIONS: usize = 8;

/// Qwen3.5's preprocessing: sides resized to multiples of 32 (patch 16 × merge 2) with the
/// pixel count kept within these bounds; one prompt token per 32×32 block.
const RESIZE_FACTOR: u32 = 32;
const RESIZE_MIN_PIXELS: u64 = 65_536;
const RESIZE_MAX_PIXELS: u64 = 16_777_216;

/// A screenshot's size, written `WxH`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScreenshotSize {
    pub width: u32,
    pub height: u32,
}

impl ScreenshotSize {
    /// Refuses what the server would refuse (side, pixel count, aspect ratio).
    pub fn check(self) -> Result<Self> {
        let (w, h) = (self.width, self.height);
        if w == 0 || h == 0 {
            bail!("screenshot size {self} is empty");
        }
        if w > MAX_SIDE || h > MAX_SIDE {
            bail!("screenshot size {self}: the server takes at most {MAX_SIDE} px per side");
        }
        if u64::from(w) * u64::from(h) > MAX_PIXELS {
            bail!(
                "screenshot size {self} has {} px: the server takes at most {MAX_PIXELS}",
                u64::from(w) * u64::from(h)
            );
        }
        if u64::from(w.max(h)) > u64::from(w.min(h)) * u64::from(MAX_ASPECT_RATIO) {
            bail!("screenshot size {self}: the server takes an aspect ratio of at most {MAX_ASPECT_RATIO}:1");
        }
        Ok(self)
    }

    /// Image tokens in each question's prompt: one per 32×32 block after the server's resize.
    pub fn image_tokens(self) -> usize {
        let (h, w) = smart_resize(self.height, self.width);
        (h / RESIZE_FACTOR) as usize * (w / RESIZE_FACTOR) as usize
    }
}

impl Default for ScreenshotSize {
    fn default() -> Self {
        Self {
            width: 1024,
            height: 1024,
        }
    }
}

impl fmt::Display for ScreenshotSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}", self.width, self.height)
    }
}

impl FromStr for ScreenshotSize {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        let (w, h) = s.split_once(['x', 'X']).with_context(|| {
            format!("screenshot size {s:?} is not WIDTHxHEIGHT (e.g. 1024x768)")
        })?;
        let side = |v: &str| {
            v.trim().parse::<u32>().with_context(|| {
                format!("screenshot size {s:?} is not WIDTHxHEIGHT (e.g. 1024x768)")
            })
        };
        ScreenshotSize {
            width: side(w)?,
            height: side(h)?,
        }
        .check()
    }
}

/// Questions per screenshot request: `N` or `MIN-MAX` (inclusive), within 1 to 8.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuestionRange {
    pub min: usize,
    pub max: usize,
}

impl QuestionRange {
    pub fn check(self) -> Result<Self> {
        if self.min == 0 || self.max > MAX_QUESTIONS || self.min > self.max {
            bail!(
                "screenshot questions {self}: the server takes 1 to {MAX_QUESTIONS} per screenshot request"
            );
        }
        Ok(self)
    }
}

impl Default for QuestionRange {
    fn default() -> Self {
        Self { min: 1, max: 1 }
    }
}

impl fmt::Display for QuestionRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.min == self.max {
            write!(f, "{}", self.min)
        } else {
            write!(f, "{}-{}", self.min, self.max)
        }
    }
}

impl FromStr for QuestionRange {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        let number = |v: &str| {
            v.trim()
                .parse::<usize>()
                .with_context(|| format!("screenshot questions {s:?} is not N or MIN-MAX"))
        };
        let (min, max) = match s.split_once('-') {
            Some((a, b)) => (number(a)?, number(b)?),
            None => {
                let n = number(s)?;
                (n, n)
            }
        };
        QuestionRange { min, max }.check()
    }
}

/// `smart_resize(height, width)` with Qwen3.5's factor and bounds: `(height, width)`, each a
/// multiple of 32 (Python's round-half-to-even, as the reference).
pub fn smart_resize(height: u32, width: u32) -> (u32, u32) {
    let (h, w, f) = (
        f64::from(height),
        f64::from(width),
        f64::from(RESIZE_FACTOR),
    );
    let mut h_bar = (h / f).round_ties_even() * f;
    let mut w_bar = (w / f).round_ties_even() * f;
    if h_bar * w_bar > RESIZE_MAX_PIXELS as f64 {
        let beta = ((h * w) / RESIZE_MAX_PIXELS as f64).sqrt();
        h_bar = f.max((h / beta / f).floor() * f);
        w_bar = f.max((w / beta / f).floor() * f);
    } else if h_bar * w_bar < RESIZE_MIN_PIXELS as f64 {
        let beta = (RESIZE_MIN_PIXELS as f64 / (h * w)).sqrt();
        h_bar = (h * beta / f).ceil() * f;
        w_bar = (w * beta / f).ceil() * f;
    }
    (h_bar as u32, w_bar as u32)
}

/// `data:image/png;base64,…` of a PNG.
pub fn data_url(png: &[u8]) -> String {
    const PREFIX: &str = "data:image/png;base64,";
    let mut url = String::with_capacity(PREFIX.len() + png.len().div_ceil(3) * 4);
    url.push_str(PREFIX);
    base64::engine::general_purpose::STANDARD.encode_string(png, &mut url);
    url
}

/// A seeded screen-like PNG (RGB): title bar, sidebar list, toolbar, cards with text, inputs and
/// buttons, and one picture panel. Text is drawn from a per-image set of antialiased glyph
/// bitmaps, so it repeats (and compresses) like real text; the picture adds the entropy of a
/// photo or chart. A 1024×1024 comes out at a few hundred KB, like a real screenshot.
pub fn render_png(size: ScreenshotSize, seed: u64) -> Result<Vec<u8>> {
    let mut canvas = Canvas::new(size.width as usize, size.height as usize, seed);
    canvas.draw_screen();
    let mut png = Vec::with_capacity(canvas.px.len() / 4);
    PngEncoder::new(&mut png)
        .write_image(&canvas.px, size.width, size.height, ExtendedColorType::Rgb8)
        .context("encoding a screenshot PNG")?;
    if png.len() > MAX_IMAGE_BYTES {
        bail!(
            "a {size} screenshot encoded to {} bytes, over the server's {MAX_IMAGE_BYTES}",
            png.len()
        );
    }
    Ok(png)
}

/// SplitMix64: a fast seeded generator for pixels (the request-level draws use `StdRng`).
struct Pixels(u64);

impl Pixels {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..hi` (`lo` when the range is empty).
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        if hi <= lo {
            return lo;
        }
        lo + (self.next() % (hi - lo) as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

type Rgb = [u8; 3];

/// Glyph cells: small text and headings.
const SMALL: (usize, usize) = (7, 13);
const LARGE: (usize, usize) = (9, 17);
const GLYPHS: usize = 64;

struct Font {
    cell: (usize, usize),
    /// `GLYPHS` bitmaps of `cell.0 × cell.1` coverage values.
    glyphs: Vec<Vec<u8>>,
}

impl Font {
    fn new(cell: (usize, usize), rng: &mut Pixels) -> Self {
        let (cw, ch) = cell;
        let glyphs = (0..GLYPHS)
            .map(|_| {
                // A 4×6 stroke grid, scaled into the cell with a blank column and blank rows
                // (spacing and ascenders), its edges at partial coverage (antialiasing).
                let bits = rng.next();
                let mut g = vec![0u8; cw * ch];
                let (top, bottom) = (ch / 4, ch - ch / 6);
                for y in top..bottom {
                    for x in 0..cw - 1 {
                        let gx = x * 4 / (cw - 1);
                        let gy = (y - top) * 6 / (bottom - top);
                        if bits >> (gy * 4 + gx) & 1 == 1 {
                            let edge = x * 4 % (cw - 1) == 0 || (y - top) * 6 % (bottom - top) == 0;
                            g[y * cw + x] = if edge { 110 } else { 235 };
                        }
                    }
                }
                g
            })
            .collect();
        Self { cell, glyphs }
    }
}

struct Canvas {
    w: usize,
    h: usize,
    px: Vec<u8>,
    rng: Pixels,
    small: Font,
    large: Font,
    ink: Rgb,
    accent: Rgb,
}

fn shade(c: Rgb, delta: i32) -> Rgb {
    c.map(|v| (i32::from(v) + delta).clamp(0, 255) as u8)
}

impl Canvas {
    fn new(w: usize, h: usize, seed: u64) -> Self {
        let mut rng = Pixels(seed ^ 0x5c4e_e2b1_0a7d_3f91);
        let small = Font::new(SMALL, &mut rng);
        let large = Font::new(LARGE, &mut rng);
        let accent = [
            rng.range(20, 90) as u8,
            rng.range(90, 160) as u8,
            rng.range(170, 240) as u8,
        ];
        let ink = [rng.range(20, 50) as u8; 3];
        Self {
            w,
            h,
            px: vec![0; w * h * 3],
            rng,
            small,
            large,
            ink,
            accent,
        }
    }

    fn fill(&mut self, x0: usize, y0: usize, x1: usize, y1: usize, c: Rgb) {
        let (x1, y1) = (x1.min(self.w), y1.min(self.h));
        if x0 >= x1 || y0 >= y1 {
            return;
        }
        for y in y0..y1 {
            let row = &mut self.px[(y * self.w + x0) * 3..(y * self.w + x1) * 3];
            for p in row.chunks_exact_mut(3) {
                p.copy_from_slice(&c);
            }
        }
    }

    fn frame(&mut self, x0: usize, y0: usize, x1: usize, y1: usize, c: Rgb) {
        if x1 <= x0 + 1 || y1 <= y0 + 1 {
            return;
        }
        self.fill(x0, y0, x1, y0 + 1, c);
        self.fill(x0, y1 - 1, x1, y1, c);
        self.fill(x0, y0, x0 + 1, y1, c);
        self.fill(x1 - 1, y0, x1, y1, c);
    }

    /// One line of words from `x0` towards `x1` (stops early at random), glyphs blended over
    /// whatever is below them.
    fn text(&mut self, x0: usize, y0: usize, x1: usize, large: bool, c: Rgb) {
        let x1 = x1.min(self.w);
        let font = if large { &self.large } else { &self.small };
        let (cw, ch) = font.cell;
        if y0 + ch > self.h {
            return;
        }
        let end = x0 + (x1.saturating_sub(x0) * self.rng.range(35, 100) / 100);
        let mut x = x0;
        while x + cw <= end {
            let word = self.rng.range(2, 11);
            for _ in 0..word {
                if x + cw > end {
                    break;
                }
                let g = &font.glyphs[self.rng.range(0, GLYPHS)];
                for gy in 0..ch {
                    let row = (y0 + gy) * self.w;
                    for gx in 0..cw {
                        let a = u32::from(g[gy * cw + gx]);
                        if a == 0 {
                            continue;
                        }
                        let p = &mut self.px[(row + x + gx) * 3..(row + x + gx) * 3 + 3];
                        for (v, c) in p.iter_mut().zip(c) {
                            *v = ((u32::from(*v) * (255 - a) + u32::from(c) * a) / 255) as u8;
                        }
                    }
                }
                x += cw;
            }
            x += cw;
        }
    }

    /// A photo or chart: a smooth gradient with noise (what makes screenshots weigh).
    fn picture(&mut self, x0: usize, y0: usize, x1: usize, y1: usize) {
        let (x1, y1) = (x1.min(self.w), y1.min(self.h));
        if x0 >= x1 || y0 >= y1 {
            return;
        }
        let base = [
            self.rng.range(40, 200) as i32,
            self.rng.range(40, 200) as i32,
            self.rng.range(40, 200) as i32,
        ];
        let (sw, sh) = ((x1 - x0) as i32, (y1 - y0) as i32);
        for y in y0..y1 {
            for x in x0..x1 {
                let n = self.rng.next();
                let (dx, dy) = ((x - x0) as i32 * 60 / sw, (y - y0) as i32 * 60 / sh);
                let p = &mut self.px[(y * self.w + x) * 3..(y * self.w + x) * 3 + 3];
                for (i, v) in p.iter_mut().enumerate() {
                    let noise = ((n >> (i * 8)) & 31) as i32 - 16;
                    *v = (base[i] + dx - dy + noise).clamp(0, 255) as u8;
                }
            }
        }
    }

    fn draw_screen(&mut self) {
        let (w, h) = (self.w, self.h);
        let bg = [self.rng.range(236, 250) as u8; 3];
        self.fill(0, 0, w, h, bg);

        // Title bar.
        let title_h = (h / 28).clamp(18, 36);
        let bar = [self.rng.range(40, 80) as u8; 3];
        self.fill(0, 0, w, title_h, bar);
        let line = (title_h.saturating_sub(SMALL.1)) / 2;
        self.text(title_h, line, w / 2, false, [230, 230, 230]);

        // Sidebar list with one selected row.
        let side_w = w * self.rng.range(15, 26) / 100;
        let side_bg = shade(bg, -14);
        self.fill(0, title_h, side_w, h, side_bg);
        self.fill(side_w, title_h, side_w + 1, h, shade(bg, -40));
        let row_h = SMALL.1 + 10;
        let selected = self.rng.range(0, 12);
        let mut y = title_h + 8;
        let mut row = 0;
        while y + row_h <= h {
            if row == selected {
                self.fill(0, y - 3, side_w, y + row_h - 3, shade(self.accent, 60));
            }
            self.text(12, y + 2, side_w.saturating_sub(8), false, self.ink);
            y += row_h;
            row += 1;
        }

        // Toolbar with buttons.
        let main_x = side_w + 1;
        let tool_h = LARGE.1 + 14;
        self.fill(main_x, title_h, w, title_h + tool_h, shade(bg, 6));
        self.fill(
            main_x,
            title_h + tool_h,
            w,
            title_h + tool_h + 1,
            shade(bg, -30),
        );
        let mut x = main_x + 10;
        while x + 80 < w {
            let bw = self.rng.range(60, 130);
            self.button(x, title_h + 5, x + bw, title_h + tool_h - 5, false);
            x += bw + 8;
        }

        // Cards in a grid; one of them is a picture.
        let top = title_h + tool_h + 12;
        let cols = if w - main_x > 600 { 3 } else { 2 };
        let gap = 12;
        let card_w = (w - main_x).saturating_sub(gap * (cols + 1)) / cols;
        let card_h = self.rng.range(160, 260).min(h.saturating_sub(top).max(40));
        let picture = self.rng.range(0, cols * 2);
        let mut index = 0;
        let mut cy = top;
        while cy + 40 < h {
            for col in 0..cols {
                let cx = main_x + gap + col * (card_w + gap);
                self.card(cx, cy, cx + card_w, cy + card_h, index == picture);
                index += 1;
            }
            cy += card_h + gap;
        }
    }

    fn button(&mut self, x0: usize, y0: usize, x1: usize, y1: usize, primary: bool) {
        let (fill, ink) = if primary {
            (self.accent, [250, 250, 250])
        } else {
            ([252, 252, 252], self.ink)
        };
        self.fill(x0, y0, x1, y1, fill);
        self.frame(x0, y0, x1, y1, shade(fill, -50));
        let ty = y0 + (y1 - y0).saturating_sub(SMALL.1) / 2;
        self.text(x0 + 8, ty, x1.saturating_sub(6), false, ink);
    }

    fn card(&mut self, x0: usize, y0: usize, x1: usize, y1: usize, picture: bool) {
        self.fill(x0, y0, x1, y1, [255, 255, 255]);
        self.frame(x0, y0, x1, y1, [205, 208, 214]);
        let header = LARGE.1 + 12;
        self.text(x0 + 12, y0 + 8, x1.saturating_sub(12), true, self.ink);
        if picture {
            self.picture(x0 + 1, y0 + header, x1 - 1, y1 - 1);
            return;
        }
        let mut y = y0 + header + 4;
        let bottom = y1.min(self.h);
        while y + SMALL.1 + 44 < bottom {
            match self.rng.range(0, 6) {
                // A text field with its placeholder.
                0 => {
                    self.frame(
                        x0 + 12,
                        y,
                        x1.saturating_sub(12),
                        y + SMALL.1 + 10,
                        [170, 175, 185],
                    );
                    self.text(x0 + 18, y + 5, x1 / 2 + x0 / 2, false, [140, 140, 140]);
                    y += SMALL.1 + 18;
                }
                // A progress bar.
                1 => {
                    let done = x0 + 12 + (x1 - x0).saturating_sub(24) * self.rng.range(5, 95) / 100;
                    self.fill(
                        x0 + 12,
                        y + 4,
                        x1.saturating_sub(12),
                        y + 10,
                        [225, 228, 232],
                    );
                    self.fill(x0 + 12, y + 4, done, y + 10, self.accent);
                    y += 18;
                }
                _ => {
                    self.text(x0 + 12, y, x1.saturating_sub(12), false, self.ink);
                    y += SMALL.1 + 5;
                }
            }
        }
        if y + 30 < bottom && self.rng.chance(70) {
            let bw = self.rng.range(70, 120).min((x1 - x0).saturating_sub(24));
            self.button(x0 + 12, y + 2, x0 + 12 + bw, y + 28, true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_the_server_limits_hold() {
        assert_eq!(
            "1280x800".parse::<ScreenshotSize>().unwrap(),
            ScreenshotSize {
                width: 1280,
                height: 800
            }
        );
        assert_eq!(
            "320X240".parse::<ScreenshotSize>().unwrap().to_string(),
            "320x240"
        );
        for bad in [
            "",
            "1024",
            "x",
            "10x",
            "axb",
            "0x10",
            "2049x10",
            "1025x1024",
            "400x1",
            "-1x5",
        ] {
            assert!(bad.parse::<ScreenshotSize>().is_err(), "{bad}");
        }
        // The largest allowed: 1,048,576 px; 2048 per side; 200:1.
        assert!("1024x1024".parse::<ScreenshotSize>().is_ok());
        assert!("2048x512".parse::<ScreenshotSize>().is_ok());
        assert!("200x1".parse::<ScreenshotSize>().is_ok());
        let err = "2048x1024"
            .parse::<ScreenshotSize>()
            .unwrap_err()
            .to_string();
        assert!(err.contains("1048576"), "{err}");
    }

    #[test]
    fn question_ranges_parse() {
        assert_eq!(
            "3".parse::<QuestionRange>().unwrap(),
            QuestionRange { min: 3, max: 3 }
        );
        assert_eq!(
            "1-4".parse::<QuestionRange>().unwrap(),
            QuestionRange { min: 1, max: 4 }
        );
        for bad in ["0", "9", "4-2", "1-9", "a", "1-", ""] {
            assert!(bad.parse::<QuestionRange>().is_err(), "{bad}");
        }
    }

    #[test]
    fn image_tokens_follow_the_resize() {
        let tokens = |w, h| {
            ScreenshotSize {
                width: w,
                height: h,
            }
            .image_tokens()
        };
        assert_eq!(tokens(1024, 1024), 1024);
        // 1040 / 32 = 32.5 rounds to 32 (half to even); 736 = 23 × 32.
        assert_eq!(tokens(1040, 736), 32 * 23);
        // 240 / 32 = 7.5 rounds to 8: 320×256.
        assert_eq!(tokens(320, 240), 10 * 8);
        // Small images are scaled up to 65,536 px: 256×256.
        assert_eq!(tokens(1, 1), 64);
        assert_eq!(tokens(200, 1), 114);
    }

    #[test]
    fn png_is_seeded_screen_like_and_sized_like_a_screenshot() {
        let size = ScreenshotSize::default();
        let a = render_png(size, 1).unwrap();
        assert_eq!(a, render_png(size, 1).unwrap());
        assert_ne!(a, render_png(size, 2).unwrap());
        assert!(
            (150_000..=700_000).contains(&a.len()),
            "a 1024x1024 screenshot of {} bytes",
            a.len()
        );
        let decoded = image::load_from_memory_with_format(&a, image::ImageFormat::Png).unwrap();
        assert_eq!((decoded.width(), decoded.height()), (1024, 1024));
        // Small and lopsided sizes draw too.
        for (w, h) in [(1, 1), (200, 1), (1, 200), (320, 240), (64, 900)] {
            let png = render_png(
                ScreenshotSize {
                    width: w,
                    height: h,
                },
                7,
            )
            .unwrap();
            let d = image::load_from_memory(&png).unwrap();
            assert_eq!((d.width(), d.height()), (w, h));
        }
        let url = data_url(&a);
        assert!(url.starts_with("data:image/png;base64,iVBORw0KGgo"));
        assert_eq!(url.len(), 22 + a.len().div_ceil(3) * 4);
    }

    #[test]
    fn the_limits_and_the_resize_are_the_servers() {
        use instinct_model::image::{self as server, ImageLimits};
        let limits = ImageLimits::SERVING;
        assert_eq!(limits.max_side, MAX_SIDE);
        assert_eq!(limits.max_pixels, MAX_PIXELS);
        assert_eq!(limits.max_aspect_ratio, MAX_ASPECT_RATIO);
        assert_eq!(limits.max_bytes, MAX_IMAGE_BYTES);
        assert_eq!(server::RESIZE_FACTOR, RESIZE_FACTOR);
        assert_eq!(server::MIN_PIXELS, RESIZE_MIN_PIXELS);
        assert_eq!(server::MAX_PIXELS, RESIZE_MAX_PIXELS);
        let mut sides: Vec<u32> = vec![1, 2, 15, 16, 17, 31, 32, 33, 48, 80, 200, 240, 255, 256];
        sides.extend([
            320, 480, 500, 600, 720, 736, 768, 800, 1000, 1023, 1024, 1040, 1080,
        ]);
        sides.extend([1280, 1366, 1440, 1600, 1920, 2048]);
        for &h in &sides {
            for &w in &sides {
                let size = ScreenshotSize {
                    width: w,
                    height: h,
                };
                if size.check().is_err() {
                    continue;
                }
                let expected = server::smart_resize(
                    h,
                    w,
                    server::RESIZE_FACTOR,
                    server::MIN_PIXELS,
                    server::MAX_PIXELS,
                )
                .unwrap();
                assert_eq!(smart_resize(h, w), expected, "{size}");
            }
        }
    }

    #[test]
    fn the_server_takes_the_pngs_and_counts_the_tokens_as_estimated() {
        use instinct_model::image::{preprocess, ImageLimits};
        for (w, h) in [(320, 240), (64, 900), (200, 1), (500, 400)] {
            let size = ScreenshotSize {
                width: w,
                height: h,
            };
            let png = render_png(size, 11).unwrap();
            let info = ImageLimits::SERVING.check(&png, "image/png").unwrap();
            assert_eq!((info.width, info.height), (w, h));
            let pre = preprocess(&png, "image/png").unwrap();
            assert_eq!(pre.image_tokens(), size.image_tokens(), "{size}");
        }
        // The largest screenshot the server takes stays under its byte limit.
        let png = render_png("1024x1024".parse().unwrap(), 3).unwrap();
        ImageLimits::SERVING.check(&png, "image/png").unwrap();
    }
}
