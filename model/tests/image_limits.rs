//! Header-first request limits, decoding quirks and smart_resize edge cases.

use std::path::Path;

use instinct_model::image::{
    decode_rgb, inspect, preprocess, smart_resize, ImageError, ImageFormat, ImageInfo, ImageLimits,
    MAX_PIXELS, MIN_PIXELS,
};

fn data(name: &str) -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/images")
            .join(name),
    )
    .unwrap()
}

fn chunk(kind: &[u8; 4], body: &[u8]) -> Vec<u8> {
    // The header walk does not verify CRCs; the decoder does, so tests that decode use real files.
    let mut out = (body.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(kind);
    out.extend_from_slice(body);
    out.extend_from_slice(&[0, 0, 0, 0]);
    out
}

/// A PNG header declaring `width` x `height` RGB8, with `extra` chunks before a tiny IDAT.
fn png_header(width: u32, height: u32, extra: &[Vec<u8>]) -> Vec<u8> {
    let mut ihdr = width.to_be_bytes().to_vec();
    ihdr.extend_from_slice(&height.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    out.extend(chunk(b"IHDR", &ihdr));
    for c in extra {
        out.extend_from_slice(c);
    }
    out.extend(chunk(b"IDAT", &[0x78, 0x9c, 0x03, 0x00]));
    out.extend(chunk(b"IEND", &[]));
    out
}

/// Inserts an `acTL` chunk right after IHDR of a real PNG.
fn make_apng(png: &[u8], frames: u32) -> Vec<u8> {
    let ihdr_end = 8 + 8 + 13 + 4;
    let mut body = frames.to_be_bytes().to_vec();
    body.extend_from_slice(&0u32.to_be_bytes());
    let mut out = png[..ihdr_end].to_vec();
    out.extend(chunk(b"acTL", &body));
    out.extend_from_slice(&png[ihdr_end..]);
    out
}

#[test]
fn inspect_reads_size_and_format_from_headers() {
    let png = inspect(&data("png_rgb_1040x736.png")).unwrap();
    assert_eq!(
        (png.format, png.width, png.height, png.frames),
        (ImageFormat::Png, 1040, 736, 1)
    );
    assert!(!png.animated);
    let jpeg = inspect(&data("jpeg_rgb_640x480.jpg")).unwrap();
    assert_eq!(
        (jpeg.format, jpeg.width, jpeg.height),
        (ImageFormat::Jpeg, 640, 480)
    );
    let gray16 = inspect(&data("png_gray16_320x240.png")).unwrap();
    assert!(gray16.png_color.unwrap().is_gray16());
}

#[test]
fn serving_limits_refuse_before_decoding() {
    // 1920x1080 = 2,073,600 px: preprocessing handles it, the request limit refuses it.
    let big = data("png_rgb_1920x1080.png");
    assert!(matches!(
        preprocess(&big, "image/png"),
        Err(ImageError::TooManyPixels {
            pixels: 2_073_600,
            limit: 1_048_576,
            ..
        })
    ));
    // A decompression bomb: the header claims 2048x2048 with almost no data. Refused on the header.
    let bomb = png_header(2048, 2048, &[]);
    assert!(matches!(
        preprocess(&bomb, "image/png"),
        Err(ImageError::TooManyPixels { .. })
    ));
    assert!(matches!(
        preprocess(&png_header(2049, 10, &[]), "image/png"),
        Err(ImageError::SideTooLong { limit: 2048, .. })
    ));
    assert!(matches!(
        preprocess(&png_header(2010, 10, &[]), "image/png"),
        Err(ImageError::AspectRatio { limit: 200, .. })
    ));
    assert!(matches!(
        preprocess(&png_header(0, 10, &[]), "image/png"),
        Err(ImageError::Empty { .. })
    ));
    let mut huge = data("png_rgb_320x240.png");
    huge.resize(4 * 1024 * 1024 + 1, 0);
    assert!(matches!(
        preprocess(&huge, "image/png"),
        Err(ImageError::TooManyBytes {
            limit: 4_194_304,
            ..
        })
    ));
}

#[test]
fn aspect_200_to_1_is_allowed_and_preprocessed() {
    let out = preprocess(&data("png_rgb_200x1.png"), "image/png").unwrap();
    assert_eq!(out.resized, (3648, 32));
    assert_eq!(out.grid_thw, [1, 2, 228]);
}

#[test]
fn animated_png_is_refused() {
    let still = data("png_rgb_33x47.png");
    for frames in [1, 3] {
        let apng = make_apng(&still, frames);
        let info = inspect(&apng).unwrap();
        assert!(info.animated);
        assert_eq!(info.frames, frames);
        assert_eq!(
            preprocess(&apng, "image/png"),
            Err(ImageError::Animated { frames })
        );
    }
}

#[test]
fn mime_must_be_supported_and_match() {
    let png = data("png_rgb_33x47.png");
    let jpeg = data("jpeg_rgb_33x47.jpg");
    assert!(matches!(
        preprocess(&png, "image/jpeg"),
        Err(ImageError::MimeMismatch {
            detected: "image/png",
            ..
        })
    ));
    assert!(matches!(
        preprocess(&jpeg, "image/png"),
        Err(ImageError::MimeMismatch {
            detected: "image/jpeg",
            ..
        })
    ));
    assert!(matches!(
        preprocess(&png, "image/gif"),
        Err(ImageError::UnsupportedMime(_))
    ));
    assert_eq!(
        preprocess(b"GIF89a....", "image/png"),
        Err(ImageError::UnknownFormat)
    );
    assert!(preprocess(&png, "image/png").is_ok());
    assert!(preprocess(&jpeg, "image/jpeg").is_ok());
}

#[test]
fn truncated_or_corrupt_files_give_errors_not_panics() {
    for name in ["png_rgb_320x240.png", "jpeg_rgb_320x240.jpg"] {
        let bytes = data(name);
        let mime = if name.ends_with("png") {
            "image/png"
        } else {
            "image/jpeg"
        };
        // Pillow also refuses a JPEG that only lacks its end-of-image marker.
        let last = if mime == "image/jpeg" {
            bytes.len() - 2
        } else {
            bytes.len() / 2
        };
        for cut in [3, 9, 20, 40, 100, 1000, bytes.len() / 2, last] {
            assert!(
                preprocess(&bytes[..cut], mime).is_err(),
                "{name} cut at {cut}"
            );
        }
        let mut flipped = bytes.clone();
        for b in flipped[200..260].iter_mut() {
            *b ^= 0x5a;
        }
        let _ = preprocess(&flipped, mime);
    }
    // Bytes after the end-of-image marker are ignored, as in Pillow.
    let mut trailing = data("jpeg_rgb_33x47.jpg");
    trailing.extend_from_slice(b"garbage");
    assert!(preprocess(&trailing, "image/jpeg").is_ok());
    // A header the limits accept, with image data that does not inflate to the declared size.
    assert!(matches!(
        preprocess(&png_header(1000, 1000, &[]), "image/png"),
        Err(ImageError::Decode(_))
    ));
}

/// Found by fuzzing (docs/validation/fuzzing.md): a PLTE of 49 or 50 bytes (not whole RGB entries)
/// made the `png` decoder panic while building its palette; the header check refuses it first.
#[test]
fn palette_that_is_not_whole_rgb_entries_is_refused_before_decoding() {
    for name in [
        "png_palette4_plte_49_bytes_33x47.png",
        "png_palette4_plte_50_bytes_33x47.png",
    ] {
        let refused = preprocess(&data(name), "image/png");
        assert!(
            matches!(
                refused,
                Err(ImageError::MalformedHeader {
                    reason: "PLTE is not 1 to 256 RGB entries",
                    ..
                })
            ),
            "{name}: {refused:?}"
        );
    }
    // Past the header check (as with any decoder bug it does not know of), the decoder's panic on
    // such a file is caught and refused as undecodable.
    let bytes = data("png_palette4_plte_50_bytes_33x47.png");
    let info = ImageInfo {
        format: ImageFormat::Png,
        width: 33,
        height: 47,
        frames: 1,
        animated: false,
        png_color: inspect(&data("png_palette4_33x47.png")).unwrap().png_color,
    };
    let decoded = decode_rgb(&bytes, &info, &ImageLimits::SERVING);
    assert!(matches!(decoded, Err(ImageError::Decode(_))), "{decoded:?}");
    // The same file with its 48-byte (16-entry) palette is fine.
    assert!(preprocess(&data("png_palette4_33x47.png"), "image/png").is_ok());
    for length in [0, 3 * 256 + 3] {
        let plte = chunk(b"PLTE", &vec![0; length]);
        assert!(matches!(
            inspect(&png_header(4, 4, &[plte])),
            Err(ImageError::MalformedHeader { .. })
        ));
    }
    assert!(inspect(&png_header(4, 4, &[chunk(b"PLTE", &[0; 768])])).is_ok());
}

#[test]
fn smart_resize_follows_python_rounding_and_bounds() {
    let f = 32;
    // 1040 / 32 = 32.5 rounds half to even: 1024, not 1056.
    assert_eq!(
        smart_resize(736, 1040, f, MIN_PIXELS, MAX_PIXELS).unwrap(),
        (736, 1024)
    );
    assert_eq!(
        smart_resize(1080, 1920, f, MIN_PIXELS, MAX_PIXELS).unwrap(),
        (1088, 1920)
    );
    assert_eq!(
        smart_resize(1, 1, f, MIN_PIXELS, MAX_PIXELS).unwrap(),
        (256, 256)
    );
    assert_eq!(
        smart_resize(48, 48, f, MIN_PIXELS, MAX_PIXELS).unwrap(),
        (256, 256)
    );
    // 3 * 32 + 16 = 112: 3.5 rounds to 4; 5.5 rounds to 6.
    assert_eq!(
        smart_resize(112 * 4, 176 * 2, f, 0, MAX_PIXELS).unwrap(),
        (448, 352)
    );
    assert_eq!(
        smart_resize(112, 176, f, 0, MAX_PIXELS).unwrap(),
        (128, 192)
    );
    // Over max_pixels: floor, at least one factor per side.
    assert_eq!(
        smart_resize(8000, 8000, f, MIN_PIXELS, MAX_PIXELS).unwrap(),
        (4096, 4096)
    );
    assert!(matches!(
        smart_resize(1, 201, f, MIN_PIXELS, MAX_PIXELS),
        Err(ImageError::AspectRatio { .. })
    ));
    assert!(smart_resize(0, 5, f, MIN_PIXELS, MAX_PIXELS).is_err());
}

#[test]
fn one_image_gives_a_quarter_as_many_tokens_as_patches() {
    let out = preprocess(&data("png_rgb_1040x736.png"), "image/png").unwrap();
    assert_eq!(out.resized, (1024, 736));
    assert_eq!(out.grid_thw, [1, 46, 64]);
    assert_eq!(out.patch_count(), 2944);
    assert_eq!(out.image_tokens(), 736);
    assert_eq!(out.image.pixels.len(), 1024 * 736 * 3);
    let values = out.pixel_values();
    assert_eq!(values.len(), 2944 * 1536);
    assert!(values.iter().all(|v| (-1.0..=1.0).contains(v)));
}

#[test]
fn limits_constants_are_the_contract() {
    let l = ImageLimits::SERVING;
    assert_eq!(
        (l.max_bytes, l.max_side, l.max_pixels, l.max_aspect_ratio),
        (4 << 20, 2048, 1 << 20, 200)
    );
}

/// Timing, not a check: `cargo test --release -p instinct-model --test image_limits -- --ignored --nocapture`.
#[test]
#[ignore = "timing only; run in release"]
fn time_preprocessing_1920x1080_png() {
    let bytes = data("png_rgb_1920x1080.png");
    let limits = ImageLimits::PREPROCESSOR_ONLY;
    let info = limits.check(&bytes, "image/png").unwrap();
    let (mut decodes, mut rests, mut totals) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..9 {
        let start = std::time::Instant::now();
        let rgb = instinct_model::image::decode_rgb(&bytes, &info, &limits).unwrap();
        let decoded = start.elapsed();
        let out = instinct_model::image::preprocess_rgb(rgb).unwrap();
        let total = start.elapsed();
        assert_eq!(out.grid_thw, [1, 68, 120]);
        decodes.push(decoded);
        rests.push(total - decoded);
        totals.push(total);
    }
    for v in [&mut decodes, &mut rests, &mut totals] {
        v.sort();
    }
    eprintln!(
        "1920x1080 PNG, median of 9: total {:?}, decode {:?}, resize+normalize+patches {:?}",
        totals[4], decodes[4], rests[4]
    );
}
