//! Times screenshot preprocessing per stage (header check + decode, resize, normalize + patches)
//! on the images given, fastest of `RUNS` runs each (tools/reference/preprocess_bench.sh runs it on
//! the committed test images):
//!
//! `cargo run --release -p instinct-model --example preprocess_time -- IMAGE...`

use std::time::Instant;

use instinct_model::image::{
    decode_rgb, patchify, resize_bicubic_antialias, smart_resize, ImageLimits, MAX_PIXELS,
    MIN_PIXELS, RESIZE_FACTOR,
};

const RUNS: usize = 41;

/// The fastest run: on a shared machine the least disturbed by other work.
fn min(v: Vec<f64>) -> f64 {
    v.into_iter().fold(f64::INFINITY, f64::min)
}

fn main() {
    let limits = ImageLimits::SERVING;
    println!("image\tbytes\tsize\tresized\tdecode_ms\tresize_ms\tpatchify_ms\ttotal_ms");
    for path in std::env::args().skip(1) {
        let bytes = std::fs::read(&path).expect("reading the image");
        let mime = if path.ends_with(".png") {
            "image/png"
        } else {
            "image/jpeg"
        };
        let (mut decode, mut resize, mut patch) = (Vec::new(), Vec::new(), Vec::new());
        let mut shape = String::new();
        for _ in 0..RUNS {
            let t0 = Instant::now();
            let info = limits.check(&bytes, mime).expect("a valid image");
            let rgb = decode_rgb(&bytes, &info, &limits).expect("a decodable image");
            let t1 = Instant::now();
            let (w, h) = (rgb.width, rgb.height);
            let (rh, rw) = smart_resize(h, w, RESIZE_FACTOR, MIN_PIXELS, MAX_PIXELS).unwrap();
            let resized = resize_bicubic_antialias(rgb, rw, rh);
            let t2 = Instant::now();
            let values = patchify(&resized);
            let t3 = Instant::now();
            std::hint::black_box(&values);
            shape = format!("{w}x{h}\t{rw}x{rh}");
            decode.push((t1 - t0).as_secs_f64() * 1e3);
            resize.push((t2 - t1).as_secs_f64() * 1e3);
            patch.push((t3 - t2).as_secs_f64() * 1e3);
        }
        let total: Vec<f64> = (0..RUNS)
            .map(|i| decode[i] + resize[i] + patch[i])
            .collect();
        let name = path.rsplit('/').next().unwrap_or(&path);
        println!(
            "{name}\t{}\t{shape}\t{:.2}\t{:.2}\t{:.2}\t{:.2}",
            bytes.len(),
            min(decode),
            min(resize),
            min(patch),
            min(total)
        );
    }
}
