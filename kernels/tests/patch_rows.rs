//! The patch rows of u8 images (`write_patch_rows` on the CPU backend, and `patchify`) against the
//! layout written out value by value: sizes square and not, one merge block, grid widths that are
//! not multiples of 4, several images at row offsets of one buffer with rows between them.

use instinct_kernels::backend::VisionBackend;
use instinct_kernels::patches::{
    normalize, patchify, PatchImage, PatchRows, MERGE_SIZE, PATCH_SIZE, PATCH_VALUES,
    TEMPORAL_PATCH_SIZE,
};
use instinct_kernels::{Backend, CpuBackend};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// `(width, height)`: one merge block, non-square both ways, grid widths of 2, 6 and 10 patches
/// (not multiples of 4), and a 1024x1024 screenshot.
const SIZES: [(usize, usize); 7] = [
    (32, 32),
    (64, 32),
    (32, 96),
    (96, 64),
    (160, 224),
    (480, 224),
    (1024, 1024),
];
/// What the rows no image covers hold before and after a write.
const UNTOUCHED: f32 = 7.0;

fn random_rgb(rng: &mut StdRng, width: usize, height: usize) -> Vec<u8> {
    (0..width * height * 3).map(|_| rng.gen()).collect()
}

/// The rows the reference's processor makes, one value at a time: patch `q` is patch `q % 4` of
/// merge block `q / 4` (blocks row-major, inside one r0c0, r0c1, r1c0, r1c1), its value
/// `(c, t, y, x)` the level of channel `c` at pixel `(top + y, left + x)` for every frame `t`.
fn by_formula(image: PatchImage<'_>) -> Vec<f32> {
    let (_, grid_w) = image.grid();
    let blocks_w = grid_w / MERGE_SIZE;
    let mut rows = Vec::with_capacity(image.patches() * PATCH_VALUES);
    for q in 0..image.patches() {
        let (block, inner) = (q / 4, q % 4);
        let top = ((block / blocks_w) * MERGE_SIZE + inner / 2) * PATCH_SIZE;
        let left = ((block % blocks_w) * MERGE_SIZE + inner % 2) * PATCH_SIZE;
        for c in 0..3 {
            for _t in 0..TEMPORAL_PATCH_SIZE {
                for y in 0..PATCH_SIZE {
                    for x in 0..PATCH_SIZE {
                        let at = ((top + y) * image.width + left + x) * 3 + c;
                        rows.push(normalize(image.rgb[at]));
                    }
                }
            }
        }
    }
    rows
}

#[test]
fn patchify_is_the_layout_written_out() {
    let mut rng = StdRng::seed_from_u64(1);
    for (w, h) in SIZES {
        let rgb = random_rgb(&mut rng, w, h);
        let image = PatchImage::new(&rgb, w, h);
        assert_eq!(image.patches(), w * h / 256);
        let rows = patchify(image);
        assert_eq!(rows, by_formula(image), "{w}x{h}");
        // Every level's value appears, and nothing else.
        if w * h >= 1024 * 1024 {
            let mut levels: Vec<u32> = rows.iter().map(|v| v.to_bits()).collect();
            levels.sort_unstable();
            levels.dedup();
            assert_eq!(levels.len(), 256);
        }
    }
}

#[test]
fn write_patch_rows_on_the_cpu_is_patchify_at_each_images_rows() {
    let be = CpuBackend::new();
    let mut rng = StdRng::seed_from_u64(2);
    for (w, h) in SIZES {
        let rgb = random_rgb(&mut rng, w, h);
        let image = PatchImage::new(&rgb, w, h);
        let mut dst = be.alloc_gemm_input(image.patches() * PATCH_VALUES).unwrap();
        be.write_patch_rows(
            &mut dst,
            &[PatchRows {
                image,
                first_row: 0,
            }],
        )
        .unwrap();
        assert_eq!(dst, patchify(image), "{w}x{h}");
    }

    // Three images in one buffer: a row before the first, two between the second and third, one
    // after the last; the images given out of row order.
    let sizes = [(96, 64), (32, 32), (480, 224)];
    let rgbs: Vec<Vec<u8>> = sizes
        .iter()
        .map(|&(w, h)| random_rgb(&mut rng, w, h))
        .collect();
    let images: Vec<PatchImage> = rgbs
        .iter()
        .zip(sizes)
        .map(|(rgb, (w, h))| PatchImage::new(rgb, w, h))
        .collect();
    let firsts = [1, 1 + images[0].patches(), 3 + images[0].patches() + 4];
    let rows = firsts[2] + images[2].patches() + 1;
    let mut dst = vec![UNTOUCHED; rows * PATCH_VALUES];
    let parts: Vec<PatchRows> = [2, 0, 1]
        .iter()
        .map(|&i| PatchRows {
            image: images[i],
            first_row: firsts[i],
        })
        .collect();
    be.write_patch_rows(&mut dst, &parts).unwrap();
    let mut want = vec![UNTOUCHED; PATCH_VALUES];
    for i in 0..3 {
        want.extend(patchify(images[i]));
        let next = firsts.get(i + 1).copied().unwrap_or(rows);
        let gap = next - firsts[i] - images[i].patches();
        want.extend(vec![UNTOUCHED; gap * PATCH_VALUES]);
    }
    assert_eq!(dst.len(), want.len());
    assert!(dst == want, "three images at their rows");
}

#[test]
fn write_patch_rows_refuses_what_does_not_fit() {
    let be = CpuBackend::new();
    let rgb = vec![9u8; 64 * 32 * 3];
    let image = PatchImage::new(&rgb, 64, 32);
    let at = |first_row| PatchRows { image, first_row };
    let mut dst = vec![UNTOUCHED; 15 * PATCH_VALUES];
    let short = be.write_patch_rows(&mut dst, &[at(8)]).unwrap_err();
    assert!(short.to_string().contains("ends at row 16"), "{short}");
    let overlap = be.write_patch_rows(&mut dst, &[at(0), at(7)]).unwrap_err();
    assert!(overlap.to_string().contains("overlap"), "{overlap}");
    let odd = PatchImage::new(&rgb[..48 * 32 * 3], 48, 32);
    let e = be
        .write_patch_rows(
            &mut dst,
            &[PatchRows {
                image: odd,
                first_row: 0,
            }],
        )
        .unwrap_err();
    assert!(e.to_string().contains("image 0"), "{e}");
    // A refused call writes nothing.
    assert!(dst.iter().all(|&v| v == UNTOUCHED));
}
