//! Antialiased bicubic resize of RGB8, reproducing torch's CPU uint8 path
//! (`interpolate(mode="bicubic", antialias=True)` on a uint8 tensor, as torchvision calls it):
//! per-axis weights in f64 (Keys cubic with a = -0.5, support widened by the downscale factor,
//! normalized to sum 1), converted to i16 fixed point with the largest precision that keeps the
//! biggest weight below 2^15, then a separable integer convolution (width first, then height),
//! each pass rounding (+half, arithmetic shift) and clamping to uint8. An axis whose size does
//! not change is skipped.

use rayon::prelude::*;

use super::decode::RgbImage;

const CHANNELS: usize = 3;

/// Keys' cubic convolution kernel with a = -0.5 (the antialias filter).
fn cubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A
    } else {
        0.0
    }
}

/// Fixed-point taps for one axis: output `i` reads inputs `starts[i] .. starts[i] + counts[i]`
/// with weights `weights[i * taps ..]`.
struct AxisTaps {
    starts: Vec<usize>,
    counts: Vec<usize>,
    taps: usize,
    weights: Vec<i16>,
    precision: u32,
}

impl AxisTaps {
    fn new(input_size: usize, output_size: usize) -> Self {
        let scale = input_size as f64 / output_size as f64;
        let (support, invscale) = if scale >= 1.0 {
            (2.0 * scale, 1.0 / scale)
        } else {
            (2.0, 1.0)
        };
        let taps = support.ceil() as usize * 2 + 1;
        let mut starts = Vec::with_capacity(output_size);
        let mut counts = Vec::with_capacity(output_size);
        let mut float_weights = vec![0f64; output_size * taps];
        let mut largest = 0f64;
        for (i, row) in float_weights.chunks_exact_mut(taps).enumerate() {
            let center = scale * (i as f64 + 0.5);
            // Truncation toward zero, as the C++ casts do.
            let start = ((center - support + 0.5) as i64).max(0);
            let end = ((center + support + 0.5) as i64).min(input_size as i64);
            let count = (end - start).clamp(0, taps as i64) as usize;
            let mut total = 0f64;
            for (j, weight) in row.iter_mut().take(count).enumerate() {
                *weight = cubic((j as f64 + start as f64 - center + 0.5) * invscale);
                total += *weight;
            }
            if total != 0.0 {
                for weight in row.iter_mut().take(count) {
                    *weight /= total;
                    largest = largest.max(*weight);
                }
            }
            starts.push(start as usize);
            counts.push(count);
        }
        let mut precision = 0u32;
        while precision < 22 {
            let next = (0.5 + largest * f64::from(1u32 << (precision + 1))) as i32;
            if next >= 1 << 15 {
                break;
            }
            precision += 1;
        }
        let unit = f64::from(1u32 << precision);
        let weights = float_weights
            .iter()
            .map(|&w| {
                let v = w * unit;
                // Round half away from zero, truncating like the C++ `(int)` cast.
                (if v < 0.0 {
                    (v - 0.5) as i32
                } else {
                    (v + 0.5) as i32
                }) as i16
            })
            .collect();
        AxisTaps {
            starts,
            counts,
            taps,
            weights,
            precision,
        }
    }
}

/// Rows one parallel task takes at least (a row is a few microseconds of work).
const ROWS_PER_TASK: usize = 16;

fn resize_width(image: &RgbImage, new_width: usize) -> RgbImage {
    let (width, height) = (image.width as usize, image.height as usize);
    let taps = AxisTaps::new(width, new_width);
    let mut pixels = vec![0u8; new_width * height * CHANNELS];
    // Rows are independent: they run in parallel, each with the same integer sums.
    image
        .pixels
        .par_chunks_exact(width * CHANNELS)
        .zip(pixels.par_chunks_exact_mut(new_width * CHANNELS))
        .with_min_len(ROWS_PER_TASK)
        .for_each(|(in_row, out_row)| {
            // The tap counts smart_resize's scales give (5 up, 7 and 9 down to half) take an
            // unrolled loop; others the general one. Same integer sums either way.
            match taps.taps {
                5 => resize_row::<5>(&taps, in_row, out_row),
                7 => resize_row::<7>(&taps, in_row, out_row),
                9 => resize_row::<9>(&taps, in_row, out_row),
                _ => resize_row::<0>(&taps, in_row, out_row),
            }
        });
    RgbImage {
        width: new_width as u32,
        height: height as u32,
        pixels,
    }
}

/// One row of the width pass. Output pixel x is `Σ_k weight_k · input[start + k]` over its taps,
/// the three channels together, rounded by the half added first and the shift. With `N` (the
/// axis's tap stride, 0 for none) every pixel whose `N` inputs lie in the row sums all `N`
/// weights (those past its count are 0) in a loop the compiler unrolls.
fn resize_row<const N: usize>(taps: &AxisTaps, in_row: &[u8], out_row: &mut [u8]) {
    let half = 1i32 << (taps.precision - 1);
    let pixels_in = in_row.len() / CHANNELS;
    for (x, out_pixel) in out_row.chunks_exact_mut(CHANNELS).enumerate() {
        let start = taps.starts[x];
        // Slices of a constant length N (the compiler unrolls the loop below), or of the count.
        let (weights, inputs) = if N > 0 && start + N <= pixels_in {
            (
                &taps.weights[x * N..][..N],
                &in_row[start * CHANNELS..][..N * CHANNELS],
            )
        } else {
            let count = taps.counts[x];
            (
                &taps.weights[x * taps.taps..][..count],
                &in_row[start * CHANNELS..][..count * CHANNELS],
            )
        };
        let mut acc = [half; CHANNELS];
        for (&w, pixel) in weights.iter().zip(inputs.chunks_exact(CHANNELS)) {
            for (sum, &v) in acc.iter_mut().zip(pixel) {
                *sum += i32::from(w) * i32::from(v);
            }
        }
        for (out, sum) in out_pixel.iter_mut().zip(acc) {
            *out = (sum >> taps.precision).clamp(0, 255) as u8;
        }
    }
}

fn resize_height(image: &RgbImage, new_height: usize) -> RgbImage {
    let (width, height) = (image.width as usize, image.height as usize);
    let row_len = width * CHANNELS;
    let taps = AxisTaps::new(height, new_height);
    let mut pixels = vec![0u8; row_len * new_height];
    // Whole rows at a time (the width pass's integer sums, in an order that vectorizes), output
    // rows in parallel.
    pixels
        .par_chunks_exact_mut(row_len)
        .enumerate()
        .with_min_len(ROWS_PER_TASK)
        .for_each_init(
            || vec![0i32; row_len],
            |acc, (y, out_row)| {
                acc.fill(1 << (taps.precision - 1));
                let start = taps.starts[y];
                let weights = &taps.weights[y * taps.taps..][..taps.counts[y]];
                for (k, &w) in weights.iter().enumerate() {
                    let in_row = &image.pixels[(start + k) * row_len..][..row_len];
                    for (sum, &v) in acc.iter_mut().zip(in_row) {
                        *sum += i32::from(w) * i32::from(v);
                    }
                }
                for (out, &sum) in out_row.iter_mut().zip(acc.iter()) {
                    *out = (sum >> taps.precision).clamp(0, 255) as u8;
                }
            },
        );
    RgbImage {
        width: width as u32,
        height: new_height as u32,
        pixels,
    }
}

/// Resizes to `new_width` x `new_height`; an unchanged size returns the image as it is.
pub fn resize_bicubic_antialias(image: RgbImage, new_width: u32, new_height: u32) -> RgbImage {
    let image = if new_width != image.width {
        resize_width(&image, new_width as usize)
    } else {
        image
    };
    if new_height != image.height {
        resize_height(&image, new_height as usize)
    } else {
        image
    }
}
