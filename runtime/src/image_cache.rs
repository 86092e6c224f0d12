//! Encoded screenshots, kept by a hash of the image bytes within a byte budget (least recently
//! used out first), so the same screen is decoded, preprocessed and encoded once across requests.

use std::collections::HashMap;
use std::sync::Arc;

use instinct_model::values::Values;
use metrics::{counter, gauge};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};

/// Counter: lookups that found the image.
pub const HITS_TOTAL: &str = "instinct_image_cache_hits_total";
/// Counter: lookups that had to encode the image.
pub const MISSES_TOTAL: &str = "instinct_image_cache_misses_total";
/// Gauge: bytes of features held.
pub const BYTES: &str = "instinct_image_cache_bytes";

/// An encoded image: its features (`[image tokens, hidden]`, where the tower left them: device
/// memory on a GPU) and its patch grid.
#[derive(Debug)]
pub struct EncodedImage {
    pub features: Values,
    pub grid_thw: [u32; 3],
}

impl EncodedImage {
    fn bytes(&self) -> usize {
        self.features.len() * 4
    }
}

/// The key of an image: SHA-256 of its bytes as sent (not of decoded pixels: hashing the raw
/// bytes is cheap and identifies the image exactly).
pub type ImageKey = [u8; 32];

pub fn key_of(bytes: &[u8]) -> ImageKey {
    Sha256::digest(bytes).into()
}

struct Entry {
    image: Arc<EncodedImage>,
    last_use: u64,
}

/// A byte-budgeted LRU of encoded images.
pub struct ImageCache {
    budget: usize,
    inner: Mutex<Inner>,
}

struct Inner {
    entries: HashMap<ImageKey, Entry>,
    bytes: usize,
    clock: u64,
}

impl ImageCache {
    /// A cache holding at most `budget` bytes of features (0 disables it).
    pub fn new(budget: usize) -> Self {
        Self {
            budget,
            inner: Mutex::new(Inner {
                entries: HashMap::new(),
                bytes: 0,
                clock: 0,
            }),
        }
    }

    /// The cached image for `key`, or the one `encode` makes (then kept, if it fits the budget).
    /// Encoding runs outside the lock; two requests racing on a new image may both encode it.
    pub fn get_or_encode<E>(
        &self,
        key: ImageKey,
        encode: impl FnOnce() -> Result<EncodedImage, E>,
    ) -> Result<Arc<EncodedImage>, E> {
        {
            let mut inner = self.inner.lock();
            inner.clock += 1;
            let now = inner.clock;
            if let Some(entry) = inner.entries.get_mut(&key) {
                entry.last_use = now;
                counter!(HITS_TOTAL).increment(1);
                return Ok(entry.image.clone());
            }
        }
        counter!(MISSES_TOTAL).increment(1);
        let image = Arc::new(encode()?);
        let size = image.bytes();
        if size <= self.budget {
            let mut inner = self.inner.lock();
            inner.clock += 1;
            let now = inner.clock;
            if let Some(old) = inner.entries.insert(
                key,
                Entry {
                    image: image.clone(),
                    last_use: now,
                },
            ) {
                inner.bytes -= old.image.bytes();
            }
            inner.bytes += size;
            while inner.bytes > self.budget {
                let oldest = inner
                    .entries
                    .iter()
                    .min_by_key(|(_, e)| e.last_use)
                    .map(|(k, _)| *k)
                    .expect("over budget means not empty");
                let removed = inner.entries.remove(&oldest).expect("just found");
                inner.bytes -= removed.image.bytes();
            }
            gauge!(BYTES).set(inner.bytes as f64);
        }
        Ok(image)
    }

    /// Images held now.
    pub fn len(&self) -> usize {
        self.inner.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(values: usize) -> EncodedImage {
        EncodedImage {
            features: Values::host(vec![0.5; values]),
            grid_thw: [1, 2, 2],
        }
    }

    #[test]
    fn hits_reuse_and_the_budget_evicts_the_least_recently_used() {
        let cache = ImageCache::new(3 * 400); // room for three images of 100 values
        let mut encodes = 0;
        let mut get = |k: u8| {
            cache
                .get_or_encode::<()>([k; 32], || {
                    encodes += 1;
                    Ok(image(100))
                })
                .unwrap()
        };
        let a = get(1);
        let a2 = get(1);
        assert!(Arc::ptr_eq(&a, &a2), "a hit returns the same features");
        get(2);
        get(3);
        get(1); // 1 is now the most recent; 2 the least
        get(4); // evicts 2
        get(1);
        get(3);
        get(2); // encoded again
        assert_eq!(encodes, 5);
        assert_eq!(cache.len(), 3);
    }

    #[test]
    fn an_image_larger_than_the_budget_is_served_but_not_kept() {
        let cache = ImageCache::new(100);
        let img = cache
            .get_or_encode::<()>([9; 32], || Ok(image(1000)))
            .unwrap();
        assert_eq!(img.features.len(), 1000);
        assert!(cache.is_empty());
    }

    #[test]
    fn keys_are_content_hashes() {
        assert_eq!(key_of(b"abc"), key_of(b"abc"));
        assert_ne!(key_of(b"abc"), key_of(b"abd"));
    }
}
