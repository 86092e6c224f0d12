//! The GEMM algorithms picked by timing are kept in the cache directory, so a later start runs the
//! same ones without timing them: the same bits, start after start. Needs a GPU (`#[ignore]`d in
//! CI): `cargo test --release -p instinct-kernels --test cuda_gemm_tuning -- --ignored`.

mod common;
use common::{activation, rand_vec};

use std::fs;
use std::path::PathBuf;

use instinct_kernels::cuda::{CudaBackend, CudaOptions};
use instinct_kernels::Backend;
use instinct_kernels::GemmShape;
use rand::rngs::StdRng;
use rand::SeedableRng;

fn start(cache_dir: Option<PathBuf>, no_cache: bool) -> CudaBackend {
    CudaBackend::new(CudaOptions {
        cache_dir,
        no_cache,
        ..CudaOptions::default()
    })
    .unwrap_or_else(|e| panic!("CUDA start-up: {e}"))
}

/// y = x Wᵀ at `rows` × 2560 × 4096 (a real projection shape), on fixed operands.
fn gemm_bits(gpu: &CudaBackend, rows: usize) -> Vec<u32> {
    let (in_dim, out_dim) = (2560, 4096);
    let mut rng = StdRng::seed_from_u64(7);
    let x = rand_vec(&mut rng, rows * in_dim, 1.0);
    let w = rand_vec(&mut rng, out_dim * in_dim, 0.05);
    let x_d = activation(gpu, &x, 0);
    let w_d = gpu.upload(&w).unwrap();
    let mut y = gpu.alloc(rows * out_dim).unwrap();
    gpu.gemm(&x_d, &w_d, GemmShape::new(rows, in_dim, out_dim), &mut y)
        .unwrap();
    let y = gpu.read(&y, rows * out_dim).unwrap();
    y.iter().map(|v| v.to_bits()).collect()
}

#[test]
#[ignore = "needs a GPU"]
fn gemm_winners_are_kept_across_starts_and_give_the_same_bits() {
    let dir = std::env::temp_dir().join(format!("instinct-gemm-tuning-gpu-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);

    // First start: the shape is timed and its winner written down.
    let first = start(Some(dir.clone()), false);
    let bits = gemm_bits(&first, 700);
    assert_eq!(first.gemm_tunings(), 1, "a new shape is timed once");
    let file = first
        .gemm_tuning_file()
        .expect("a cache dir keeps a tuning file")
        .to_path_buf();
    assert!(
        file.starts_with(&dir),
        "{} is not in the cache dir",
        file.display()
    );
    let text = fs::read_to_string(&file).unwrap();
    assert!(text.lines().count() >= 2, "header and one winner:\n{text}");
    // Another row count of the same bucket (up to 2,048 rows, each multiple of 8 is one) takes
    // the bucket's winner without timing.
    gemm_bits(&first, 697);
    assert_eq!(first.gemm_tunings(), 1);
    drop(first);

    // Second start: the stored winner is used as is, with the same bits.
    let second = start(Some(dir.clone()), false);
    assert_eq!(
        gemm_bits(&second, 700),
        bits,
        "the same algorithm gives the same bits"
    );
    assert_eq!(
        second.gemm_tunings(),
        0,
        "the stored winner needs no timing"
    );
    drop(second);

    // A damaged file is ignored (the shape is timed again) and rewritten whole.
    fs::write(&file, "not a tuning file\n1 2 3\n").unwrap();
    let third = start(Some(dir.clone()), false);
    gemm_bits(&third, 700);
    assert_eq!(third.gemm_tunings(), 1);
    assert_eq!(
        fs::read_to_string(&file).unwrap().lines().count(),
        text.lines().count()
    );
    drop(third);

    // Without the cache, every shape is timed and nothing is written.
    let uncached_dir = dir.join("unused");
    let uncached = start(Some(uncached_dir.clone()), true);
    assert!(uncached.gemm_tuning_file().is_none());
    gemm_bits(&uncached, 700);
    assert_eq!(uncached.gemm_tunings(), 1);
    assert!(!uncached_dir.exists());
    drop(uncached);

    fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[ignore = "needs a GPU"]
fn a_second_copy_takes_up_what_the_first_stored_after_both_started() {
    let dir = std::env::temp_dir().join(format!(
        "instinct-gemm-tuning-reload-{}",
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&dir);
    // Both start on an empty cache, as the text and screenshot copies of one server do.
    let text = start(Some(dir.clone()), false);
    let screenshots = start(Some(dir.clone()), false);
    let bits = gemm_bits(&text, 700);
    assert_eq!(text.gemm_tunings(), 1);

    // Before its warm-up the second copy re-reads the file: the shape needs no timing, and the
    // stored winner gives the same bits.
    screenshots.reload_warm_state();
    assert_eq!(gemm_bits(&screenshots, 700), bits);
    assert_eq!(
        screenshots.gemm_tunings(),
        0,
        "the first copy's winner is taken up"
    );
    drop((text, screenshots));
    fs::remove_dir_all(&dir).unwrap();
}
