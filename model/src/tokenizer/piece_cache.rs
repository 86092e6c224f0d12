//! The fast encoder's cache of pre-token → ids, bounded in entries and in piece length.
//!
//! Most pieces are short words, so those of up to 15 bytes are keyed by their bytes and length
//! packed in a `u128`: one integer hash and compare per lookup instead of hashing a string and a
//! `memcmp` call (about a third of a warm encode's time before).

use ahash::AHashMap;

/// The cache stops taking pieces at this many (a prompt has a few hundred distinct ones).
pub(super) const PIECE_CACHE_CAPACITY: usize = 200_000;
/// Longer pieces are not cached (long runs of spaces or punctuation rarely repeat).
pub(super) const PIECE_CACHE_MAX_BYTES: usize = 64;
/// Pieces up to this long have an integer key.
const SHORT_MAX_BYTES: usize = 15;

pub(super) struct PieceCache {
    short: AHashMap<u128, Box<[u32]>>,
    long: AHashMap<Box<[u8]>, Box<[u32]>>,
    capacity: usize,
}

impl PieceCache {
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            short: AHashMap::new(),
            long: AHashMap::new(),
            capacity,
        }
    }

    #[inline]
    pub(super) fn get(&self, piece: &[u8]) -> Option<&[u32]> {
        match short_key(piece) {
            Some(key) => self.short.get(&key),
            None => self.long.get(piece),
        }
        .map(|ids| &ids[..])
    }

    /// Whether `piece` is one the cache would take (when not full).
    pub(super) fn takes(piece: &[u8]) -> bool {
        piece.len() <= PIECE_CACHE_MAX_BYTES
    }

    /// Adds `piece` unless the cache is full or the piece too long.
    pub(super) fn insert(&mut self, piece: &[u8], ids: Box<[u32]>) {
        if self.len() >= self.capacity || !Self::takes(piece) {
            return;
        }
        match short_key(piece) {
            Some(key) => self.short.insert(key, ids),
            None => self.long.insert(piece.into(), ids),
        };
    }

    pub(super) fn len(&self) -> usize {
        self.short.len() + self.long.len()
    }
}

/// The length in the low byte, then the bytes; `None` for pieces too long to pack.
#[inline]
fn short_key(piece: &[u8]) -> Option<u128> {
    if piece.len() > SHORT_MAX_BYTES {
        return None;
    }
    let mut key = piece.len() as u128;
    for (i, &b) in piece.iter().enumerate() {
        key |= u128::from(b) << (8 * (i + 1));
    }
    Some(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_differ_by_length_and_bytes() {
        let pieces: [&[u8]; 7] = [
            b"",
            b"\0",
            b"\0\0",
            b"a",
            b"a\0",
            b"\0a",
            b"abcdefghijklmno",
        ];
        let keys: Vec<_> = pieces.iter().map(|p| short_key(p).unwrap()).collect();
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(short_key(b"abcdefghijklmnop"), None);
    }

    #[test]
    fn holds_short_and_long_pieces_up_to_its_capacity() {
        let mut cache = PieceCache::new(3);
        let long = [b'x'; 40];
        let too_long = [b'y'; PIECE_CACHE_MAX_BYTES + 1];
        cache.insert(b"ab", Box::new([1, 2]));
        cache.insert(&long, Box::new([3]));
        cache.insert(&too_long, Box::new([4]));
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.get(b"ab"), Some(&[1, 2][..]));
        assert_eq!(cache.get(&long), Some(&[3][..]));
        assert_eq!(cache.get(&too_long), None);
        assert_eq!(cache.get(b"a"), None);
        cache.insert(b"c", Box::new([5]));
        cache.insert(b"d", Box::new([6]));
        cache.insert(&[b'z'; 20], Box::new([7]));
        assert_eq!(cache.len(), 3);
        assert_eq!(cache.get(b"c"), Some(&[5][..]));
        assert_eq!(cache.get(b"d"), None);
    }
}
