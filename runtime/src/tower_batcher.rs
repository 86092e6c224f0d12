//! Several screenshots per vision-tower pass. A screenshot request encodes its image on its
//! preparer thread; when the tower is busy with another request's image, the caller waits, and the
//! next pass takes every image that waited (oldest first, up to [`MAX_PASS_PATCHES`] patches), so
//! concurrent requests share passes instead of queueing one pass each. The tower's results do not
//! depend on what shares a pass ([`VisionTower::forward`]).

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};

use instinct_kernels::backend::VisionBackend;
use instinct_model::values::Values;
use instinct_model::vision::{ImageInput, VisionTower};
use parking_lot::{Condvar, Mutex};

/// The most patches one pass takes (four 1024×1024 screenshots): bounds the pass's activations
/// (about 50 KB of buffers a patch on the real tower, so ~0.8 GB here; the images' bytes staged
/// for it are 768 B a patch). An image larger than this still runs, alone.
pub const MAX_PASS_PATCHES: usize = 16_384;

/// What a tower pass needs: features of each image, in order (see [`VisionTower::forward`]), left
/// where the tower computed them (device memory on a GPU) or, with `to_host`, on the host.
pub trait Tower: Send {
    fn encode_all(&self, images: &[ImageInput<'_>], to_host: bool) -> anyhow::Result<Vec<Values>>;
}

impl<B: VisionBackend> Tower for VisionTower<B>
where
    VisionTower<B>: Send,
{
    fn encode_all(&self, images: &[ImageInput<'_>], to_host: bool) -> anyhow::Result<Vec<Values>> {
        if to_host {
            Ok(self
                .forward(images)?
                .into_iter()
                .map(Values::host)
                .collect())
        } else {
            self.forward_kept(images)
        }
    }
}

/// One image waiting for a pass: its resized RGB bytes (768 a patch) and its grid.
struct Waiting {
    id: u64,
    rgb: Vec<u8>,
    grid_thw: [u32; 3],
}

impl Waiting {
    fn patches(&self) -> usize {
        self.grid_thw.iter().map(|&v| v as usize).product()
    }
}

#[derive(Default)]
struct State {
    /// A pass is running (its caller runs it, the others wait).
    running: bool,
    waiting: Vec<Waiting>,
    /// Results not yet collected by their callers (an error's message for each image of a
    /// failed pass).
    done: HashMap<u64, Result<Values, String>>,
    next_id: u64,
    /// Passes run and images encoded, for tests and logs.
    passes: u64,
    images: u64,
}

/// Encodes images on one tower, several per pass (see the module docs).
pub struct TowerBatcher<T: Tower> {
    /// Locked by the caller running a pass: one pass at a time (a GPU tower's ops share their
    /// scratch buffers on one stream).
    tower: Mutex<T>,
    state: Mutex<State>,
    finished: Condvar,
    max_patches: usize,
    /// Features go back to the host (for language copies on other devices than the tower's).
    to_host: AtomicBool,
}

impl<T: Tower> TowerBatcher<T> {
    pub fn new(tower: T) -> Self {
        Self::with_max_patches(tower, MAX_PASS_PATCHES)
    }

    /// A batcher whose passes take at most `max_patches` patches (one image always).
    pub fn with_max_patches(tower: T, max_patches: usize) -> Self {
        Self {
            tower: Mutex::new(tower),
            state: Mutex::new(State::default()),
            finished: Condvar::new(),
            max_patches,
            to_host: AtomicBool::new(false),
        }
    }

    /// From now on, every image's features are read back to the host after its pass.
    pub fn features_to_host(&self) {
        self.to_host.store(true, Ordering::Relaxed);
    }

    /// (passes run, images encoded) so far.
    pub fn counts(&self) -> (u64, u64) {
        let state = self.state.lock();
        (state.passes, state.images)
    }

    /// The features of one image (its resized RGB bytes and grid, as [`ImageInput`] takes them),
    /// from the first pass that takes it: run by this caller when no pass is running, else by
    /// whichever caller starts the next one.
    pub fn encode(&self, rgb: Vec<u8>, grid_thw: [u32; 3]) -> anyhow::Result<Values> {
        let mut state = self.state.lock();
        let id = state.next_id;
        state.next_id += 1;
        state.waiting.push(Waiting { id, rgb, grid_thw });
        loop {
            if let Some(result) = state.done.remove(&id) {
                return result.map_err(anyhow::Error::msg);
            }
            if state.running {
                self.finished.wait(&mut state);
                continue;
            }
            let batch = self.take(&mut state.waiting);
            state.running = true;
            let results = parking_lot::MutexGuard::unlocked(&mut state, || self.run(&batch));
            state.running = false;
            state.passes += 1;
            state.images += batch.len() as u64;
            for (image, result) in batch.iter().zip(results) {
                state.done.insert(image.id, result);
            }
            self.finished.notify_all();
        }
    }

    /// The oldest waiting images that fit one pass (at least one).
    fn take(&self, waiting: &mut Vec<Waiting>) -> Vec<Waiting> {
        let mut patches = 0;
        let count = waiting
            .iter()
            .take_while(|w| {
                patches += w.patches();
                patches <= self.max_patches
            })
            .count()
            .max(1);
        waiting.drain(..count).collect()
    }

    /// One pass over `batch`: each image's features, or the pass's error (a panic included) for
    /// every image of it.
    fn run(&self, batch: &[Waiting]) -> Vec<Result<Values, String>> {
        let inputs: Vec<ImageInput> = batch
            .iter()
            .map(|w| ImageInput {
                rgb: &w.rgb,
                grid_thw: w.grid_thw,
            })
            .collect();
        let tower = self.tower.lock();
        let to_host = self.to_host.load(Ordering::Relaxed);
        let outcome = catch_unwind(AssertUnwindSafe(|| tower.encode_all(&inputs, to_host)));
        match outcome {
            Ok(Ok(features)) if features.len() == batch.len() => {
                features.into_iter().map(Ok).collect()
            }
            Ok(Ok(features)) => {
                let why = format!(
                    "the tower returned {} results for {} images",
                    features.len(),
                    batch.len()
                );
                vec![Err(why); batch.len()]
            }
            Ok(Err(e)) => vec![Err(format!("{e:#}")); batch.len()],
            Err(_) => vec![Err("the vision tower panicked".to_string()); batch.len()],
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    /// A tower whose features are each image's byte sum, one pass at a time, each pass slow
    /// enough that images sent meanwhile wait for the next. An image summing to `fail_on` fails
    /// its pass; one summing to twice that panics in it.
    struct Summing {
        pass: Duration,
        fail_on: Option<f32>,
    }

    impl Tower for Summing {
        fn encode_all(&self, images: &[ImageInput<'_>], _: bool) -> anyhow::Result<Vec<Values>> {
            std::thread::sleep(self.pass);
            let sums: Vec<f32> = images
                .iter()
                .map(|i| i.rgb.iter().map(|&b| f32::from(b)).sum())
                .collect();
            if let Some(bad) = self.fail_on {
                anyhow::ensure!(!sums.contains(&bad), "an image summing to {bad}");
                assert!(!sums.contains(&(2.0 * bad)), "a panicking image");
            }
            Ok(sums.into_iter().map(|s| Values::host(vec![s])).collect())
        }
    }

    fn send(
        batcher: &Arc<TowerBatcher<Summing>>,
        values: Vec<Vec<u8>>,
    ) -> Vec<anyhow::Result<Values>> {
        let handles: Vec<_> = values
            .into_iter()
            .map(|v| {
                let batcher = batcher.clone();
                let patches = v.len() as u32;
                std::thread::spawn(move || batcher.encode(v, [1, 1, patches]))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn images_sent_while_a_pass_runs_share_the_next_one() {
        let tower = Summing {
            pass: Duration::from_millis(400),
            fail_on: None,
        };
        let batcher = Arc::new(TowerBatcher::with_max_patches(tower, 64));
        let first = {
            let batcher = batcher.clone();
            std::thread::spawn(move || batcher.encode(vec![1; 4], [1, 1, 4]))
        };
        std::thread::sleep(Duration::from_millis(50));
        // Six images of 16 patches while the first pass runs: the next pass takes four (64
        // patches), the one after the other two.
        let values: Vec<Vec<u8>> = (0..6).map(|k| vec![k; 16]).collect();
        let results = send(&batcher, values);
        assert_eq!(first.join().unwrap().unwrap(), Values::host(vec![4.0]));
        for (k, r) in results.into_iter().enumerate() {
            assert_eq!(r.unwrap(), Values::host(vec![16.0 * k as f32]), "image {k}");
        }
        assert_eq!(batcher.counts(), (3, 7));
    }

    #[test]
    fn a_failed_or_panicking_pass_fails_its_images_and_the_batcher_goes_on() {
        let tower = Summing {
            pass: Duration::from_millis(300),
            fail_on: Some(3.0),
        };
        let batcher = Arc::new(TowerBatcher::new(tower));
        let blocker = {
            let batcher = batcher.clone();
            std::thread::spawn(move || batcher.encode(vec![1], [1, 1, 1]))
        };
        std::thread::sleep(Duration::from_millis(30));
        let results = send(&batcher, vec![vec![3], vec![5]]);
        assert_eq!(blocker.join().unwrap().unwrap(), Values::host(vec![1.0]));
        for r in results {
            let e = r.unwrap_err().to_string();
            assert!(e.contains("an image summing to 3"), "{e}");
        }
        let results = send(&batcher, vec![vec![6]]);
        let e = results.into_iter().next().unwrap().unwrap_err().to_string();
        assert!(e.contains("panicked"), "{e}");
        // Still serving.
        assert_eq!(
            batcher.encode(vec![2, 2], [1, 1, 2]).unwrap(),
            Values::host(vec![4.0])
        );
    }

    /// A tower that answers whether its features were asked for on the host.
    struct Placing;

    impl Tower for Placing {
        fn encode_all(
            &self,
            images: &[ImageInput<'_>],
            to_host: bool,
        ) -> anyhow::Result<Vec<Values>> {
            let placed = if to_host { 1.0 } else { 0.0 };
            Ok(images.iter().map(|_| Values::host(vec![placed])).collect())
        }
    }

    #[test]
    fn features_stay_with_the_tower_until_asked_for_on_the_host() {
        let batcher = TowerBatcher::new(Placing);
        assert_eq!(
            batcher.encode(vec![1], [1, 1, 1]).unwrap(),
            Values::host(vec![0.0])
        );
        batcher.features_to_host();
        assert_eq!(
            batcher.encode(vec![1], [1, 1, 1]).unwrap(),
            Values::host(vec![1.0])
        );
    }

    #[test]
    fn an_image_larger_than_a_pass_runs_alone() {
        let tower = Summing {
            pass: Duration::ZERO,
            fail_on: None,
        };
        let batcher = TowerBatcher::with_max_patches(tower, 8);
        assert_eq!(
            batcher.encode(vec![1; 20], [1, 4, 5]).unwrap(),
            Values::host(vec![20.0])
        );
        assert_eq!(batcher.counts(), (1, 1));
    }
}
