//! A faster exact decoder for the PNGs screenshots usually are: 8-bit gray, gray+alpha, RGB or
//! RGBA, not interlaced, without a palette or transparency chunk.
//!
//! Most rows of a screenshot PNG use the Paeth filter, and unfiltering it was most of the `png`
//! crate's decode time: each pixel depends on the one to its left, so the crate goes one pixel
//! after another. Here a group of rows is unfiltered together as a wavefront: SSE2 byte lanes hold
//! row `k` of the group at pixel `t - k`, so a row's pixel above (and above left) is the previous
//! step's lanes of the row above, and one step does a pixel of every row in the group. Inflating
//! uses the `fdeflate` decompressor the `png` crate uses, on one thread while another unfilters
//! the rows already inflated; the unfiltered samples are written straight as RGB8 (alpha dropped,
//! gray repeated), which is what `decode::to_rgb8` makes of the same samples from `image`.
//!
//! This path only accepts what it knows the `png` crate (through `image`) accepts with the same
//! samples: anything else, from an unusual chunk to a bad CRC or a stream of the wrong length,
//! declines (`None`) and the file goes through `image` as before, which decodes it or gives its
//! error. The tests below decode every committed PNG and generated ones both ways.

use std::sync::mpsc;

use crate::image::{ImageLimits, RgbImage};

const SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";

/// Ancillary chunks the `png` crate interprets in ways that change the samples or the frame
/// (transparency, animation): their presence sends the file through `image`.
const DECLINED_ANCILLARY: [&[u8; 4]; 4] = [b"tRNS", b"acTL", b"fcTL", b"fdAT"];

/// Ancillary chunk bytes (and inflated ICC profile bytes), together, beyond which this path
/// declines: the `png` crate buffers the chunks it knows against the decoder's allocation limit,
/// and there a decode can fail on that limit.
const MAX_ANCILLARY_BYTES: usize = 1 << 20;

/// Deflate's window: inflated bytes further back than this are never referenced again.
const HISTORY: usize = 32 * 1024;
/// Inflated bytes per decompressor call, so that finished rows are handed on as they come.
const INFLATE_STEP: usize = 64 * 1024;
/// Below this many inflated bytes, one thread inflates and then unfilters.
const PARALLEL_MIN_BYTES: usize = 256 * 1024;

fn be_u32(bytes: &[u8]) -> u32 {
    u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

/// Decodes `bytes` to RGB8 if it is a PNG this path handles; `None` sends it through `image`.
pub(super) fn decode(bytes: &[u8], limits: &ImageLimits) -> Option<RgbImage> {
    if !cfg!(target_arch = "x86_64") {
        return None;
    }
    let rest = bytes.strip_prefix(SIGNATURE)?;
    let mut chunks = Chunks { rest };
    let (kind, ihdr) = chunks.next()?;
    if kind != b"IHDR" || ihdr.len() != 13 {
        return None;
    }
    let (width, height) = (be_u32(&ihdr[0..4]), be_u32(&ihdr[4..8]));
    let (bit_depth, color_type) = (ihdr[8], ihdr[9]);
    let (compression, filter_method, interlace) = (ihdr[10], ihdr[11], ihdr[12]);
    let channels: usize = match color_type {
        0 => 1,
        2 => 3,
        4 => 2,
        6 => 4,
        _ => return None,
    };
    if bit_depth != 8 || compression != 0 || filter_method != 0 || interlace != 0 {
        return None;
    }
    if width == 0 || height == 0 || width > limits.max_side || height > limits.max_side {
        return None;
    }
    let (w, h) = (width as usize, height as usize);
    let row_len = w * channels;
    // What `image` allocates for the samples must fit the decoder limit, as it checks there.
    if (h * row_len) as u64 > limits.max_decoder_alloc {
        return None;
    }

    let mut idat: Vec<&[u8]> = Vec::new();
    let mut idat_done = false;
    let mut ancillary_bytes = 0usize;
    loop {
        let (kind, data) = chunks.next()?;
        match kind {
            b"IDAT" => {
                if idat_done {
                    return None;
                }
                idat.push(data);
            }
            b"IEND" => {
                if !data.is_empty() || idat.is_empty() {
                    return None;
                }
                break;
            }
            _ => {
                idat_done |= !idat.is_empty();
                let critical = kind[0] & 0x20 == 0;
                if critical || DECLINED_ANCILLARY.contains(&kind) {
                    return None;
                }
                ancillary_bytes += data.len();
                if kind == b"iCCP" {
                    ancillary_bytes += icc_profile_len(data)?;
                }
                if ancillary_bytes > MAX_ANCILLARY_BYTES {
                    return None;
                }
            }
        }
    }
    // What the `png` crate reserves against the limit: its chunk buffer (grown by doubling), text
    // chunks and the ICC profile once more, the rows being decoded; with room to spare.
    let png_internal = 3 * ancillary_bytes as u64 + 8 * (row_len as u64 + 1) + (1 << 20);
    if png_internal > limits.max_decoder_alloc {
        return None;
    }

    let inflated_len = h * (1 + row_len);
    // Slack past the end, so that a stream that runs long shows.
    let mut inflated = vec![0u8; inflated_len + 64];
    let mut pixels = vec![0u8; w * h * 3];
    let rows_per_group = 16 / channels;
    let (sender, receiver) = mpsc::channel();
    let inflate = || {
        inflate_rows(
            &idat,
            &mut inflated,
            inflated_len,
            rows_per_group * (1 + row_len),
            sender,
        )
    };
    let unfilter = || unfilter_rows(receiver, &mut pixels, w, h, channels);
    // The inflating side never waits, so it runs first: if no other thread takes the unfiltering,
    // it runs after on this one with every row already sent.
    let (inflated_ok, unfiltered_ok) = if inflated_len >= PARALLEL_MIN_BYTES {
        rayon::join(inflate, unfilter)
    } else {
        (inflate(), unfilter())
    };
    inflated_ok?;
    unfiltered_ok?;
    Some(RgbImage {
        width,
        height,
        pixels,
    })
}

/// The inflated size of an `iCCP` chunk's profile (the `png` crate inflates it and reserves that
/// much); `None` when it does not inflate within the ancillary budget.
fn icc_profile_len(data: &[u8]) -> Option<usize> {
    let name_end = data.iter().position(|&b| b == 0)?;
    // After the name's NUL: the compression method byte, then the zlib stream.
    let compressed = data.get(name_end + 2..)?;
    fdeflate::decompress_to_vec_bounded(compressed, MAX_ANCILLARY_BYTES)
        .ok()
        .map(|profile| profile.len())
}

/// Chunk walker that checks each chunk's CRC (as the `png` crate does) and stops at anything
/// malformed.
struct Chunks<'a> {
    rest: &'a [u8],
}

impl<'a> Chunks<'a> {
    fn next(&mut self) -> Option<(&'a [u8; 4], &'a [u8])> {
        let length = be_u32(self.rest.get(..4)?) as usize;
        if length > i32::MAX as usize {
            return None;
        }
        let body = self.rest.get(4..8 + length)?;
        let crc = be_u32(self.rest.get(8 + length..12 + length)?);
        if crc32fast::hash(body) != crc {
            return None;
        }
        self.rest = &self.rest[12 + length..];
        let kind: &[u8; 4] = body[..4].try_into().ok()?;
        Some((kind, &body[4..]))
    }
}

/// Inflates the zlib stream split over `idat` into `out`, which must come to exactly `expected`
/// bytes: a stream that ends early or runs long declines. As in the `png` crate (the same
/// decompressor), the Adler-32 check is skipped and data after the stream's end is ignored. Whole
/// groups of rows (`group_bytes`) go to `rows` once the decompressor no longer needs them.
fn inflate_rows<'a>(
    idat: &[&[u8]],
    out: &'a mut [u8],
    expected: usize,
    group_bytes: usize,
    rows: mpsc::Sender<&'a [u8]>,
) -> Option<()> {
    let mut decompressor = fdeflate::Decompressor::new();
    decompressor.ignore_adler32();
    // `window` is `out` from `sent` on: the decompressor sees the last HISTORY bytes and more.
    let mut window = out;
    let (mut sent, mut filled) = (0, 0);
    for (i, chunk) in idat.iter().enumerate() {
        let last = i + 1 == idat.len();
        let mut input = *chunk;
        while !input.is_empty() && !decompressor.is_done() {
            let position = filled - sent;
            let end = (position + INFLATE_STEP).min(window.len());
            let (consumed, produced) = decompressor
                .read(input, &mut window[..end], position, last)
                .ok()?;
            if consumed == 0 && produced == 0 {
                return None;
            }
            input = &input[consumed..];
            filled += produced;
            let unneeded = filled.min(expected).saturating_sub(HISTORY);
            let groups = unneeded.saturating_sub(sent) / group_bytes;
            if groups > 0 {
                let (done, rest) = std::mem::take(&mut window).split_at_mut(groups * group_bytes);
                window = rest;
                sent += done.len();
                rows.send(done).ok()?;
            }
        }
    }
    if !decompressor.is_done() || filled != expected {
        return None;
    }
    let tail: &'a [u8] = window;
    rows.send(&tail[..expected - sent]).ok()
}

/// Unfilters the inflated rows as they arrive into `pixels` (RGB8); `None` on a filter type
/// past 4 or when rows are missing.
fn unfilter_rows(
    rows: mpsc::Receiver<&[u8]>,
    pixels: &mut [u8],
    width: usize,
    height: usize,
    channels: usize,
) -> Option<()> {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE2 is part of the x86_64 baseline, so the functions' one target feature is there.
    unsafe {
        match channels {
            1 => wavefront::unfilter::<1, 16>(rows, pixels, width, height),
            2 => wavefront::unfilter::<2, 8>(rows, pixels, width, height),
            3 => wavefront::unfilter::<3, 5>(rows, pixels, width, height),
            _ => wavefront::unfilter::<4, 4>(rows, pixels, width, height),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (rows, pixels, width, height, channels);
        None
    }
}

/// The filters as the PNG specification writes them, one byte at a time: the tests' reference.
#[cfg(all(test, target_arch = "x86_64"))]
mod reference {
    pub fn paeth(a: u8, b: u8, c: u8) -> u8 {
        let p = i16::from(a) + i16::from(b) - i16::from(c);
        let pa = (p - i16::from(a)).abs();
        let pb = (p - i16::from(b)).abs();
        let pc = (p - i16::from(c)).abs();
        if pa <= pb && pa <= pc {
            a
        } else if pb <= pc {
            b
        } else {
            c
        }
    }

    /// Rows of `1 + width * bpp` bytes, filter type first, to rows of `width * bpp` samples.
    pub fn unfilter(raw: &[u8], width: usize, height: usize, bpp: usize) -> Vec<u8> {
        let row_len = width * bpp;
        let mut out = vec![0u8; row_len * height];
        let zeros = vec![0u8; row_len];
        for y in 0..height {
            let (done, rest) = out.split_at_mut(y * row_len);
            let above = if y == 0 {
                &zeros[..]
            } else {
                &done[(y - 1) * row_len..]
            };
            let line = &raw[y * (1 + row_len)..][..1 + row_len];
            let current = &mut rest[..row_len];
            for i in 0..row_len {
                let a = if i >= bpp { current[i - bpp] } else { 0 };
                let b = above[i];
                let c = if i >= bpp { above[i - bpp] } else { 0 };
                let predicted = match line[0] {
                    0 => 0,
                    1 => a,
                    2 => b,
                    3 => ((u16::from(a) + u16::from(b)) / 2) as u8,
                    _ => paeth(a, b, c),
                };
                current[i] = line[1 + i].wrapping_add(predicted);
            }
        }
        out
    }
}

#[cfg(target_arch = "x86_64")]
mod wavefront {
    use std::arch::x86_64::*;
    use std::sync::mpsc;

    /// `x <= y` per unsigned byte.
    #[inline]
    #[target_feature(enable = "sse2")]
    fn le(x: __m128i, y: __m128i) -> __m128i {
        _mm_cmpeq_epi8(_mm_min_epu8(x, y), x)
    }

    #[inline]
    #[target_feature(enable = "sse2")]
    fn abs_diff(x: __m128i, y: __m128i) -> __m128i {
        _mm_or_si128(_mm_subs_epu8(x, y), _mm_subs_epu8(y, x))
    }

    /// `mask ? x : y` per byte.
    #[inline]
    #[target_feature(enable = "sse2")]
    fn select(mask: __m128i, x: __m128i, y: __m128i) -> __m128i {
        _mm_or_si128(_mm_and_si128(mask, x), _mm_andnot_si128(mask, y))
    }

    /// The Paeth predictor on unsigned bytes, in the form the `png` crate also uses (from FPNGE):
    /// `pa = |b - c|`, `pb = |a - c|`, and `pc = |pa - pb|` when c lies between a and b, otherwise
    /// larger than both (255 does). The tests check it on all 2^24 inputs.
    #[inline]
    #[target_feature(enable = "sse2")]
    pub(super) fn paeth(a: __m128i, b: __m128i, c: __m128i) -> __m128i {
        let pa = abs_diff(b, c);
        let pb = abs_diff(a, c);
        let outside = _mm_xor_si128(le(c, a), le(b, c));
        let pc = _mm_or_si128(abs_diff(pa, pb), outside);
        let pick_a = _mm_and_si128(le(pa, pb), le(pa, pc));
        select(pick_a, a, select(le(pb, pc), b, c))
    }

    /// Lanes of the rows using each filter (None predicts 0, so it needs no mask).
    struct Masks {
        sub: __m128i,
        up: __m128i,
        avg: __m128i,
        paeth: __m128i,
    }

    #[inline]
    #[target_feature(enable = "sse2")]
    fn predict<const ALL_PAETH: bool>(a: __m128i, b: __m128i, c: __m128i, m: &Masks) -> __m128i {
        if ALL_PAETH {
            return paeth(a, b, c);
        }
        // The average rounds up; the filter takes the floor.
        let carry = _mm_and_si128(_mm_xor_si128(a, b), _mm_set1_epi8(1));
        let avg = _mm_sub_epi8(_mm_avg_epu8(a, b), carry);
        _mm_or_si128(
            _mm_or_si128(_mm_and_si128(m.sub, a), _mm_and_si128(m.up, b)),
            _mm_or_si128(
                _mm_and_si128(m.avg, avg),
                _mm_and_si128(m.paeth, paeth(a, b, c)),
            ),
        )
    }

    /// One wavefront step: the group's filtered pixels (`filtered`, row k in lane group k) plus
    /// their prediction from the previous step's lanes (left), those lanes moved down a row with
    /// the pixel above the group (above), and the same one step back (above left).
    #[inline]
    #[target_feature(enable = "sse2")]
    fn step<const BPP: usize, const ALL_PAETH: bool>(
        filtered: u128,
        (previous, previous2): (__m128i, __m128i),
        (above_now, above_last): (u32, u32),
        masks: &Masks,
    ) -> __m128i {
        let b = _mm_or_si128(
            next_row::<BPP>(previous),
            _mm_cvtsi32_si128(above_now as i32),
        );
        let c = _mm_or_si128(
            next_row::<BPP>(previous2),
            _mm_cvtsi32_si128(above_last as i32),
        );
        let predicted = predict::<ALL_PAETH>(previous, b, c, masks);
        _mm_add_epi8(to_vector(filtered), predicted)
    }

    /// Moves every lane up by one pixel: the row above's lanes become this row's.
    #[inline]
    #[target_feature(enable = "sse2")]
    fn next_row<const BPP: usize>(x: __m128i) -> __m128i {
        match BPP {
            1 => _mm_bslli_si128::<1>(x),
            2 => _mm_bslli_si128::<2>(x),
            3 => _mm_bslli_si128::<3>(x),
            _ => _mm_bslli_si128::<4>(x),
        }
    }

    #[inline]
    #[target_feature(enable = "sse2")]
    fn to_vector(v: u128) -> __m128i {
        _mm_set_epi64x((v >> 64) as i64, v as i64)
    }

    #[inline]
    #[target_feature(enable = "sse2")]
    fn from_vector(v: __m128i) -> u128 {
        let low = _mm_cvtsi128_si64(v) as u64;
        let high = _mm_cvtsi128_si64(_mm_unpackhi_epi64(v, v)) as u64;
        (u128::from(high) << 64) | u128::from(low)
    }

    fn load4(bytes: &[u8], at: usize) -> u32 {
        // One bounds check for the four bytes (indexing each byte made the loop far slower).
        u32::from_le_bytes(bytes[at..at + 4].try_into().expect("four bytes"))
    }

    fn load_pixel<const BPP: usize>(bytes: &[u8], at: usize) -> u32 {
        let mut word = [0u8; 4];
        word[..BPP].copy_from_slice(&bytes[at..at + BPP]);
        u32::from_le_bytes(word)
    }

    /// A pixel's samples (low `BPP` bytes of `samples`) as RGB in the low 3 bytes: gray repeated,
    /// alpha dropped. The top byte is left over; a 4-byte store puts it on the next pixel, which a
    /// later step writes.
    #[inline]
    fn rgb<const BPP: usize>(samples: u32) -> u32 {
        if BPP < 3 {
            (samples & 0xFF) * 0x01_01_01
        } else {
            samples
        }
    }

    /// `K` rows at a time (`K * BPP` <= 16 lanes), `BPP` 1 to 4, from whole rows of
    /// `1 + width * BPP` bytes as they arrive; `pixels` gets RGB8 rows.
    #[target_feature(enable = "sse2")]
    pub(super) fn unfilter<const BPP: usize, const K: usize>(
        rows: mpsc::Receiver<&[u8]>,
        pixels: &mut [u8],
        width: usize,
        height: usize,
    ) -> Option<()> {
        let raw_stride = 1 + width * BPP;
        let rgb_len = width * 3;
        // For RGB the row above is in `pixels`; otherwise its samples are kept here, one buffer
        // read and the other written per group (4 bytes over for whole-word stores).
        let mut above = vec![0u8; if BPP == 3 { 0 } else { width * BPP + 4 }];
        let mut last = above.clone();
        let mut top = 0;
        for run in rows {
            if !run.len().is_multiple_of(raw_stride) || top + run.len() / raw_stride > height {
                return None;
            }
            for group in run.chunks(K * raw_stride) {
                let count = group.len() / raw_stride;
                let filters: [u8; K] =
                    std::array::from_fn(|k| if k < count { group[k * raw_stride] } else { 0 });
                if filters[..count].iter().any(|&f| f > 4) {
                    return None;
                }
                let (done, rest) = pixels.split_at_mut(top * rgb_len);
                let out = &mut rest[..count * rgb_len];
                let above_samples: &[u8] = match (top, BPP) {
                    (0, _) => &[],
                    (_, 3) => &done[(top - 1) * rgb_len..],
                    _ => &above,
                };
                let last_samples = if BPP == 3 { None } else { Some(&mut last[..]) };
                let input = Rows {
                    raw: group,
                    count,
                    filters: &filters,
                    above: above_samples,
                    width,
                };
                if filters.iter().all(|&f| f == 4) {
                    group_steps::<BPP, K, true>(&input, out, last_samples);
                } else {
                    group_steps::<BPP, K, false>(&input, out, last_samples);
                }
                std::mem::swap(&mut above, &mut last);
                top += count;
            }
        }
        (top == height).then_some(())
    }

    /// One group's input: `count` rows (at most `K`) of filtered bytes, their filter types, and
    /// the samples of the finished row over them (empty for the image's first row: zeros).
    struct Rows<'a, const K: usize> {
        raw: &'a [u8],
        count: usize,
        filters: &'a [u8; K],
        above: &'a [u8],
        width: usize,
    }

    /// At step `t`, lanes `k * BPP..(k + 1) * BPP` hold row `k` at pixel `t - k`: its left
    /// neighbour is the same lanes one step back, the pixel above is the row above's lanes one
    /// step back and the one above left two steps back; the first row's come from `rows.above`.
    /// Lanes before their row's start stay zero (what the filters take left of the image); lanes
    /// past its end hold values nothing reads or stores. `out` gets the rows as RGB8, `last` (when
    /// given) the last row's samples.
    #[inline]
    #[target_feature(enable = "sse2")]
    fn group_steps<const BPP: usize, const K: usize, const ALL_PAETH: bool>(
        rows: &Rows<'_, K>,
        out: &mut [u8],
        mut last: Option<&mut [u8]>,
    ) {
        let width = rows.width;
        let raw_stride = 1 + width * BPP;
        let rgb_len = width * 3;
        let pixel_mask = if BPP == 4 {
            u32::MAX
        } else {
            (1u32 << (8 * BPP)) - 1
        };
        let mask_of = |filter: u8| {
            let mut lanes = [0u8; 16];
            for k in (0..rows.count).filter(|&k| rows.filters[k] == filter) {
                lanes[k * BPP..(k + 1) * BPP].fill(0xFF);
            }
            to_vector(u128::from_le_bytes(lanes))
        };
        let masks = Masks {
            sub: mask_of(1),
            up: mask_of(2),
            avg: mask_of(3),
            paeth: mask_of(4),
        };
        let (mut previous, mut previous2) = (_mm_setzero_si128(), _mm_setzero_si128());
        // The first row's pixel above, one step back (its above-left).
        let mut above_last = 0u32;
        // Steps where every row is inside its row with room for 4-byte loads and stores, the
        // stores' bytes past the pixel landing on the next pixel of the same row (which a later
        // step writes): 4 bytes of samples on from the pixel, and of RGB after its own 3.
        let room = 4usize.div_ceil(BPP).max(2);
        let steady = if rows.count == K && width + 1 >= K + room {
            K - 1..width + 1 - room
        } else {
            0..0
        };
        let mut t = 0;
        while t < width + K - 1 {
            if t == steady.start && !steady.is_empty() {
                let steps = steady.len();
                let span = (steps - 1) * BPP + 4;
                let raws: [&[u8]; K] = std::array::from_fn(|k| {
                    &rows.raw[k * raw_stride + 1 + (t - k) * BPP..][..span]
                });
                let rgb_span = (steps - 1) * 3 + 4;
                let mut outs: [&mut [u8]; K] = {
                    let mut lines = out.chunks_exact_mut(rgb_len);
                    std::array::from_fn(|k| {
                        &mut lines.next().expect("K rows")[(t - k) * 3..][..rgb_span]
                    })
                };
                let mut last_run = last
                    .as_deref_mut()
                    .map(|samples| &mut samples[(t + 1 - K) * BPP..][..span]);
                let above_run: &[u8] = if rows.above.is_empty() {
                    &[]
                } else {
                    &rows.above[t * BPP..][..span]
                };
                for i in 0..steps {
                    let at = i * BPP;
                    let above_now = if above_run.is_empty() {
                        0
                    } else {
                        load4(above_run, at) & pixel_mask
                    };
                    let mut filtered = 0u128;
                    for (k, line) in raws.iter().enumerate() {
                        filtered |= u128::from(load4(line, at) & pixel_mask) << (8 * BPP * k);
                    }
                    let current = step::<BPP, ALL_PAETH>(
                        filtered,
                        (previous, previous2),
                        (above_now, above_last),
                        &masks,
                    );
                    let lanes = from_vector(current);
                    for (k, line) in outs.iter_mut().enumerate() {
                        let pixel = rgb::<BPP>((lanes >> (8 * BPP * k)) as u32);
                        line[i * 3..i * 3 + 4].copy_from_slice(&pixel.to_le_bytes());
                    }
                    if let Some(samples) = last_run.as_deref_mut() {
                        let pixel = (lanes >> (8 * BPP * (K - 1))) as u32;
                        samples[at..at + 4].copy_from_slice(&pixel.to_le_bytes());
                    }
                    previous2 = previous;
                    previous = current;
                    above_last = above_now;
                }
                t += steps;
                continue;
            }
            // Ramping up or down (or a short group): exact loads and stores of the rows in range.
            let above_now = if rows.above.is_empty() || t >= width {
                0
            } else {
                load_pixel::<BPP>(rows.above, t * BPP)
            };
            let in_row = |k: usize| t >= k && t - k < width;
            let mut filtered = 0u128;
            for k in (0..rows.count).filter(|&k| in_row(k)) {
                let pixel = load_pixel::<BPP>(rows.raw, k * raw_stride + 1 + (t - k) * BPP);
                filtered |= u128::from(pixel) << (8 * BPP * k);
            }
            let current = step::<BPP, ALL_PAETH>(
                filtered,
                (previous, previous2),
                (above_now, above_last),
                &masks,
            );
            let lanes = from_vector(current);
            for k in (0..rows.count).filter(|&k| in_row(k)) {
                let samples = (lanes >> (8 * BPP * k)) as u32;
                let at = k * rgb_len + (t - k) * 3;
                out[at..at + 3].copy_from_slice(&rgb::<BPP>(samples).to_le_bytes()[..3]);
                if k == rows.count - 1 {
                    if let Some(last) = last.as_deref_mut() {
                        let at = (t - k) * BPP;
                        last[at..at + BPP].copy_from_slice(&samples.to_le_bytes()[..BPP]);
                    }
                }
            }
            previous2 = previous;
            previous = current;
            above_last = above_now;
            t += 1;
        }
    }
}

// The path runs on x86_64 only (elsewhere every PNG goes through `image`).
#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::super::decode_with_image;
    use super::*;
    use crate::image::inspect;

    const LIMITS: ImageLimits = ImageLimits::PREPROCESSOR_ONLY;
    const ROUNDS: usize = 400;

    /// Both paths on one file: whatever this path accepts, `image` decodes to the same pixels.
    /// Returns whether this path accepted it.
    fn same_as_image(name: &str, bytes: &[u8]) -> bool {
        let fast = decode(bytes, &LIMITS);
        let Some(fast) = fast else {
            return false;
        };
        let info = inspect(bytes).unwrap_or_else(|e| panic!("{name}: accepted, but {e}"));
        let slow = decode_with_image(bytes, &info, &LIMITS)
            .unwrap_or_else(|e| panic!("{name}: accepted, but image says {e}"));
        assert_eq!(
            (fast.width, fast.height),
            (slow.width, slow.height),
            "{name}"
        );
        if let Some(i) = (0..fast.pixels.len()).find(|&i| fast.pixels[i] != slow.pixels[i]) {
            panic!(
                "{name}: pixel byte {i} differs: {} vs {}",
                fast.pixels[i], slow.pixels[i]
            );
        }
        true
    }

    fn channels(color_type: u8) -> usize {
        match color_type {
            0 => 1,
            2 => 3,
            4 => 2,
            _ => 4,
        }
    }

    fn chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
        let mut out = (data.len() as u32).to_be_bytes().to_vec();
        out.extend_from_slice(kind);
        out.extend_from_slice(data);
        let crc = crc32fast::hash(&out[4..]);
        out.extend_from_slice(&crc.to_be_bytes());
        out
    }

    fn ihdr(width: u32, height: u32, color_type: u8, interlace: u8) -> Vec<u8> {
        let mut data = width.to_be_bytes().to_vec();
        data.extend_from_slice(&height.to_be_bytes());
        data.extend_from_slice(&[8, color_type, 0, 0, interlace]);
        chunk(b"IHDR", &data)
    }

    /// Screenshot-like samples: flat areas, gradients, edges and some noise.
    fn samples(rng: &mut StdRng, width: usize, height: usize, bpp: usize) -> Vec<u8> {
        let mut out = vec![0u8; width * height * bpp];
        for y in 0..height {
            for x in 0..width {
                for ch in 0..bpp {
                    let i = (y * width + x) * bpp + ch;
                    out[i] = match (x / 7 + y / 5 + ch) % 4 {
                        0 => 240,
                        1 => (x * 3 + y * 2 + ch * 50) as u8,
                        2 => rng.gen(),
                        _ => {
                            if x > 0 {
                                out[i - bpp] ^ 1
                            } else {
                                9
                            }
                        }
                    };
                }
            }
        }
        out
    }

    /// Filters rows (spec, forward) with the given filter type per row.
    fn filter(samples: &[u8], width: usize, bpp: usize, types: &[u8]) -> Vec<u8> {
        let row_len = width * bpp;
        let mut out = Vec::new();
        for (y, &kind) in types.iter().enumerate() {
            let row = &samples[y * row_len..][..row_len];
            out.push(kind);
            for i in 0..row_len {
                let a = if i >= bpp { row[i - bpp] } else { 0 };
                let b = if y > 0 {
                    samples[(y - 1) * row_len + i]
                } else {
                    0
                };
                let c = if y > 0 && i >= bpp {
                    samples[(y - 1) * row_len + i - bpp]
                } else {
                    0
                };
                let predicted = match kind {
                    0 => 0,
                    1 => a,
                    2 => b,
                    3 => ((u16::from(a) + u16::from(b)) / 2) as u8,
                    _ => reference::paeth(a, b, c),
                };
                out.push(row[i].wrapping_sub(predicted));
            }
        }
        out
    }

    /// A PNG from filtered rows: the zlib stream split into IDAT chunks of `split` bytes, with
    /// `before` and `after` chunks around them.
    fn png(
        head: Vec<u8>,
        filtered: &[u8],
        split: usize,
        before: &[Vec<u8>],
        after: &[Vec<u8>],
    ) -> Vec<u8> {
        let mut out = SIGNATURE.to_vec();
        out.extend(head);
        before.iter().for_each(|c| out.extend_from_slice(c));
        for part in fdeflate::compress_to_vec(filtered).chunks(split.max(1)) {
            out.extend(chunk(b"IDAT", part));
        }
        after.iter().for_each(|c| out.extend_from_slice(c));
        out.extend(chunk(b"IEND", &[]));
        out
    }

    fn random_filters(rng: &mut StdRng, height: usize) -> Vec<u8> {
        (0..height)
            .map(|_| {
                if rng.gen_bool(0.6) {
                    4
                } else {
                    rng.gen_range(0..=4)
                }
            })
            .collect()
    }

    #[test]
    fn simd_paeth_matches_the_spec_on_every_input() {
        use std::arch::x86_64::*;
        let lanes: [u8; 16] = std::array::from_fn(|i| i as u8);
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                for c0 in (0..=255u8).step_by(16) {
                    // SAFETY: SSE2 is part of the x86_64 baseline.
                    let got = unsafe {
                        let c = _mm_add_epi8(
                            _mm_set1_epi8(c0 as i8),
                            _mm_loadu_si128(lanes.as_ptr().cast()),
                        );
                        let mut got = [0u8; 16];
                        _mm_storeu_si128(
                            got.as_mut_ptr().cast(),
                            wavefront::paeth(_mm_set1_epi8(a as i8), _mm_set1_epi8(b as i8), c),
                        );
                        got
                    };
                    for (i, &g) in got.iter().enumerate() {
                        let c = c0 + i as u8;
                        assert_eq!(g, reference::paeth(a, b, c), "a {a} b {b} c {c}");
                    }
                }
            }
        }
    }

    /// The wavefront against the spec's filters on random bytes, every filter mix, small and odd
    /// sizes (groups cut short, rows shorter than a group's ramp), rows arriving in runs.
    #[test]
    fn wavefront_unfilters_as_the_spec_does() {
        let mut rng = StdRng::seed_from_u64(7);
        for bpp in 1..=4 {
            let k = 16 / bpp;
            for (width, height) in [
                (1, 1),
                (1, 40),
                (2, 3),
                (5, 17),
                (17, 5),
                (16, 16),
                (33, 47),
                (100, 21),
                (257, 9),
            ] {
                for _ in 0..4 {
                    let stride = 1 + width * bpp;
                    let mut raw: Vec<u8> = (0..height * stride).map(|_| rng.gen()).collect();
                    for (y, kind) in random_filters(&mut rng, height).into_iter().enumerate() {
                        raw[y * stride] = kind;
                    }
                    let want = reference::unfilter(&raw, width, height, bpp);
                    let want_rgb: Vec<u8> = want
                        .chunks_exact(bpp)
                        .flat_map(|p| {
                            if bpp < 3 {
                                [p[0]; 3]
                            } else {
                                [p[0], p[1], p[2]]
                            }
                        })
                        .collect();
                    let (sender, receiver) = mpsc::channel();
                    let mut rest = &raw[..];
                    while !rest.is_empty() {
                        let groups = rng.gen_range(1..=3);
                        let (run, more) = rest.split_at((groups * k * stride).min(rest.len()));
                        sender.send(run).unwrap();
                        rest = more;
                    }
                    drop(sender);
                    let mut pixels = vec![0u8; width * height * 3];
                    unfilter_rows(receiver, &mut pixels, width, height, bpp).expect("unfiltered");
                    assert_eq!(pixels, want_rgb, "bpp {bpp} {width}x{height}");
                }
            }
        }
    }

    fn committed_pngs() -> Vec<(String, Vec<u8>)> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/images");
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .expect("test images")
            .map(|entry| entry.expect("entry").path())
            .filter(|path| path.extension().is_some_and(|e| e == "png"))
            .collect();
        files.sort();
        files
            .into_iter()
            .map(|path| {
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                (name, std::fs::read(&path).expect("read"))
            })
            .collect()
    }

    /// Every committed PNG: where this path accepts it, the pixels are `image`'s; and it takes
    /// all the 8-bit gray, gray+alpha, RGB and RGBA ones without transparency.
    #[test]
    fn committed_pngs_decode_as_image_decodes_them() {
        let mut taken = Vec::new();
        for (name, bytes) in committed_pngs() {
            if same_as_image(&name, &bytes) {
                taken.push(name.clone());
            }
            // IHDR's bit depth and colour type.
            let (bit_depth, color_type) = (bytes[24], bytes[25]);
            let expected = bit_depth == 8 && color_type != 3 && !name.contains("trns");
            assert_eq!(taken.last() == Some(&name), expected, "{name}");
        }
        assert!(taken.len() >= 25, "{taken:?}");
    }

    /// PNGs written by the `png` crate's encoder (its zlib streams and filter choices) in every
    /// colour type this path takes.
    #[test]
    fn encoder_written_pngs_decode_as_image_decodes_them() {
        use ::image::codecs::png::{CompressionType, FilterType, PngEncoder};
        use ::image::{ExtendedColorType, ImageEncoder};
        let mut rng = StdRng::seed_from_u64(11);
        let kinds = [
            (0, ExtendedColorType::L8),
            (2, ExtendedColorType::Rgb8),
            (4, ExtendedColorType::La8),
            (6, ExtendedColorType::Rgba8),
        ];
        let filters = [
            FilterType::Adaptive,
            FilterType::Paeth,
            FilterType::Sub,
            FilterType::Avg,
        ];
        for (color_type, layout) in kinds {
            for (width, height) in [(1, 1), (3, 2), (61, 33), (640, 300)] {
                let data = samples(&mut rng, width, height, channels(color_type));
                for (i, filter) in filters.into_iter().enumerate() {
                    let compression = if i % 2 == 0 {
                        CompressionType::Best
                    } else {
                        CompressionType::Fast
                    };
                    let mut bytes = Vec::new();
                    PngEncoder::new_with_quality(&mut bytes, compression, filter)
                        .write_image(&data, width as u32, height as u32, layout)
                        .expect("encode");
                    let name = format!("type {color_type} {width}x{height} {filter:?}");
                    assert!(same_as_image(&name, &bytes), "{name} declined");
                }
            }
        }
    }

    /// Mixed filter types per row, IDAT split anywhere, and ancillary chunks the `png` crate
    /// skips or only records: taken, and decoded as `image` does.
    #[test]
    fn generated_pngs_with_mixed_filters_and_chunks_decode_as_image_does() {
        let mut rng = StdRng::seed_from_u64(13);
        let icc = {
            let mut data = b"profile\0\0".to_vec();
            data.extend(fdeflate::compress_to_vec(&[7u8; 3000]));
            chunk(b"iCCP", &data)
        };
        let ancillary = [
            chunk(b"pHYs", &[0, 0, 11, 19, 0, 0, 11, 19, 1]),
            chunk(b"sRGB", &[0]),
            chunk(b"gAMA", &[0, 0, 177, 143]),
            chunk(b"tEXt", b"Software\0test"),
            chunk(b"ruSt", b"unknown but safe to copy"),
            chunk(b"eXIf", b"MM\0*\0\0\0\x08\0\0"),
            icc,
        ];
        for color_type in [0, 2, 4, 6] {
            let bpp = channels(color_type);
            for (width, height) in [(1, 7), (4, 4), (29, 31), (1040, 96), (300, 301)] {
                let data = samples(&mut rng, width, height, bpp);
                let filtered = filter(&data, width, bpp, &random_filters(&mut rng, height));
                let split = rng.gen_range(1..5000);
                let before = &ancillary[..rng.gen_range(0..=ancillary.len())];
                let after = &ancillary[..rng.gen_range(0..=4)];
                let bytes = png(
                    ihdr(width as u32, height as u32, color_type, 0),
                    &filtered,
                    split,
                    before,
                    after,
                );
                let name = format!("type {color_type} {width}x{height} split {split}");
                assert!(same_as_image(&name, &bytes), "{name} declined");
            }
        }
    }

    /// What this path must leave to `image`: each variant of a valid file is declined.
    #[test]
    fn unusual_or_broken_files_are_declined() {
        let mut rng = StdRng::seed_from_u64(17);
        let (width, height, color_type) = (40, 30, 2);
        let data = samples(&mut rng, width, height, 3);
        let types = random_filters(&mut rng, height);
        let filtered = filter(&data, width, 3, &types);
        let head = || ihdr(width as u32, height as u32, color_type, 0);
        let valid = png(head(), &filtered, 100, &[], &[]);
        assert!(same_as_image("valid", &valid));

        let mut variants: Vec<(&str, Vec<u8>)> = vec![
            (
                "interlaced",
                png(ihdr(40, 30, 2, 1), &filtered, 100, &[], &[]),
            ),
            (
                "palette",
                png(
                    ihdr(40, 30, 3, 0),
                    &filtered,
                    100,
                    &[chunk(b"PLTE", &[0; 30])],
                    &[],
                ),
            ),
            (
                "tRNS",
                png(
                    head(),
                    &filtered,
                    100,
                    &[chunk(b"tRNS", &[0, 1, 0, 2, 0, 3])],
                    &[],
                ),
            ),
            (
                "unknown critical chunk",
                png(head(), &filtered, 100, &[chunk(b"CRIT", &[1])], &[]),
            ),
            (
                "PLTE in RGB",
                png(head(), &filtered, 100, &[chunk(b"PLTE", &[0; 30])], &[]),
            ),
            ("IDAT after another chunk", {
                let mut b = png(head(), &filtered, 100, &[], &[chunk(b"tEXt", b"a\0b")]);
                let end = b.len() - 12;
                b.splice(end..end, chunk(b"IDAT", &[]));
                b
            }),
            (
                "rows missing",
                png(head(), &filtered[..filtered.len() - 121], 100, &[], &[]),
            ),
            (
                "rows over",
                png(
                    head(),
                    &[&filtered[..], &filtered[..121]].concat(),
                    100,
                    &[],
                    &[],
                ),
            ),
            ("filter type 5", {
                let mut f = filtered.clone();
                f[121 * 3] = 5;
                png(head(), &f, 100, &[], &[])
            }),
            ("no IEND", valid[..valid.len() - 12].to_vec()),
            ("truncated", valid[..valid.len() / 2].to_vec()),
            ("ancillary chunks over the budget", {
                let big = chunk(b"ruSt", &vec![0; MAX_ANCILLARY_BYTES + 1]);
                png(head(), &filtered, 100, &[big], &[])
            }),
        ];
        // Data after the zlib stream's end, in its chunk or in more: the `png` crate ignores it
        // (as libpng does), and so does this path.
        let mut trailing = SIGNATURE.to_vec();
        trailing.extend(head());
        let mut stream = fdeflate::compress_to_vec(&filtered);
        stream.extend_from_slice(&[0, 0, 0]);
        trailing.extend(chunk(b"IDAT", &stream));
        trailing.extend(chunk(b"IDAT", &[1, 2, 3]));
        trailing.extend(chunk(b"IEND", &[]));
        assert!(same_as_image("data after the zlib stream", &trailing));
        // A corrupted byte anywhere past the signature breaks a CRC.
        for _ in 0..200 {
            let mut b = valid.clone();
            let at = rng.gen_range(8..b.len());
            b[at] ^= rng.gen_range(1..=255);
            variants.push(("flipped byte", b));
        }
        for (what, bytes) in variants {
            assert!(decode(&bytes, &LIMITS).is_none(), "{what} was taken");
        }
    }

    /// Corrupted zlib streams in chunks with valid CRCs: whatever this path still takes, `image`
    /// takes too, with the same pixels.
    #[test]
    fn corrupt_streams_are_taken_only_as_image_takes_them() {
        let mut rng = StdRng::seed_from_u64(19);
        for round in 0..ROUNDS {
            let color_type = [0, 2, 4, 6][round % 4];
            let bpp = channels(color_type);
            let (width, height) = (rng.gen_range(1..40), rng.gen_range(1..40));
            let data = samples(&mut rng, width, height, bpp);
            let filtered = filter(&data, width, bpp, &random_filters(&mut rng, height));
            let mut stream = fdeflate::compress_to_vec(&filtered);
            for _ in 0..rng.gen_range(1..4) {
                let at = rng.gen_range(0..stream.len());
                stream[at] ^= 1 << rng.gen_range(0..8);
            }
            let mut bytes = SIGNATURE.to_vec();
            bytes.extend(ihdr(width as u32, height as u32, color_type, 0));
            bytes.extend(chunk(b"IDAT", &stream));
            bytes.extend(chunk(b"IEND", &[]));
            same_as_image(&format!("round {round}"), &bytes);
        }
    }

    /// Limits as `image` applies them: a side over the limit, or samples over the allocation cap.
    #[test]
    fn limits_send_the_file_through_image() {
        let filtered = vec![0u8; 30 * (1 + 40 * 4)];
        let bytes = png(ihdr(40, 30, 6, 0), &filtered, 1000, &[], &[]);
        assert!(decode(&bytes, &LIMITS).is_some());
        let narrow = ImageLimits {
            max_side: 39,
            ..LIMITS
        };
        assert!(decode(&bytes, &narrow).is_none());
        let small = ImageLimits {
            max_decoder_alloc: 40 * 30 * 4 - 1,
            ..LIMITS
        };
        assert!(decode(&bytes, &small).is_none());
    }
}
