use std::time::Instant;
fn main() {
    for path in std::env::args().skip(1) {
        let bytes = std::fs::read(&path).unwrap();
        let mime = if path.ends_with(".png") {
            "image/png"
        } else {
            "image/jpeg"
        };
        let mut times = Vec::new();
        let mut dec = Vec::new();
        for _ in 0..30 {
            let t = Instant::now();
            let info = instinct_model::image::ImageLimits::SERVING
                .check(&bytes, mime)
                .unwrap();
            let rgb = instinct_model::image::decode_rgb(
                &bytes,
                &info,
                &instinct_model::image::ImageLimits::SERVING,
            )
            .unwrap();
            dec.push(t.elapsed().as_secs_f64() * 1e3);
            let p = instinct_model::image::preprocess_rgb(rgb).unwrap();
            std::hint::black_box(&p);
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(|a, b| a.partial_cmp(b).unwrap());
        dec.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!(
            "{path}: {} bytes, median total {:.2} ms, decode {:.2} ms",
            bytes.len(),
            times[15],
            dec[15]
        );
    }
}
