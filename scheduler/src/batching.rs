//! Which queued questions form the next batch.
//!
//! Policy: FIFO with first-fit backfill. Queued questions are looked at oldest first; each one
//! joins the batch if the batch, with it, still fits some bucket; one that does not fit is
//! skipped and younger (shorter) ones may fill the space it left. Consequences:
//! - the oldest queued question is always in the next batch (it meets an empty batch, and
//!   admission refuses any question larger than the largest bucket), so nothing starves: a
//!   question waits at most for the batches of the questions queued before it;
//! - a younger question only ever takes space that no older question could use, so short
//!   questions never delay a long one that arrived before them, and they do not wait behind a long
//!   one that did not fit the rest of the batch.

use crate::config::Bucket;

/// The chosen questions (positions in the queue, ascending) and the batch's shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    pub picked: Vec<usize>,
    pub tokens: usize,
    /// Smallest bucket holding the batch.
    pub bucket: Bucket,
    /// True when the batch is limited by its capacity rather than by what is queued (a queued
    /// question was left out): waiting would not make it fuller.
    pub full: bool,
}

fn fits(buckets: &[Bucket], tokens: usize, seqs: usize) -> bool {
    buckets.iter().any(|b| b.holds(tokens, seqs))
}

/// Plans a batch over the queued questions' token counts (oldest first; `None` for one this
/// engine cannot run: a chunk whose state another engine holds). `buckets` is sorted smallest
/// first. Returns `None` if nothing this engine can run is queued.
pub(crate) fn plan(
    lengths: impl ExactSizeIterator<Item = Option<usize>>,
    buckets: &[Bucket],
    max_seqs: usize,
    max_scan: usize,
) -> Option<Plan> {
    let queued = lengths.len();
    let mut picked = Vec::new();
    let mut tokens = 0usize;
    let mut full = queued > max_scan;
    for (i, len) in lengths.take(max_scan).enumerate() {
        let Some(len) = len else {
            continue;
        };
        if picked.len() == max_seqs {
            full = true;
            break;
        }
        if fits(buckets, tokens + len, picked.len() + 1) {
            picked.push(i);
            tokens += len;
        } else {
            full = true;
        }
    }
    let bucket = *buckets.iter().find(|b| b.holds(tokens, picked.len()))?;
    (!picked.is_empty()).then_some(Plan {
        picked,
        tokens,
        bucket,
        full,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_of(lengths: &[usize], buckets: &[Bucket], max_seqs: usize) -> Option<Plan> {
        plan(lengths.iter().copied().map(Some), buckets, max_seqs, 1024)
    }

    #[test]
    fn skips_what_another_engine_must_run() {
        let b = [Bucket::new(100, 4)];
        let p = plan([None, Some(30), None, Some(20)].into_iter(), &b, 4, 1024).unwrap();
        assert_eq!(p.picked, vec![1, 3]);
        assert_eq!(p.tokens, 50);
        assert!(!p.full, "waiting could still fill it");
        assert_eq!(plan([None, None].into_iter(), &b, 4, 1024), None);
    }

    #[test]
    fn nothing_queued_gives_no_plan() {
        assert_eq!(plan_of(&[], &[Bucket::new(100, 4)], 4), None);
    }

    #[test]
    fn takes_everything_that_fits_and_is_not_full() {
        let b = [Bucket::new(100, 4)];
        let p = plan_of(&[10, 20, 30], &b, 4).unwrap();
        assert_eq!(p.picked, vec![0, 1, 2]);
        assert_eq!(p.tokens, 60);
        assert!(!p.full);
    }

    #[test]
    fn backfills_around_a_question_that_does_not_fit() {
        let b = [Bucket::new(100, 8)];
        let p = plan_of(&[60, 50, 30, 10, 5], &b, 8).unwrap();
        assert_eq!(p.picked, vec![0, 2, 3]);
        assert_eq!(p.tokens, 100);
        assert!(p.full);
    }

    #[test]
    fn oldest_is_always_picked_even_when_long() {
        let b = [Bucket::new(100, 8)];
        let p = plan_of(&[100, 1, 1], &b, 8).unwrap();
        assert_eq!(p.picked, vec![0]);
        assert!(p.full);
    }

    #[test]
    fn sequence_cap_makes_the_batch_full() {
        let b = [Bucket::new(1000, 2)];
        let p = plan_of(&[1, 1, 1], &b, 2).unwrap();
        assert_eq!(p.picked, vec![0, 1]);
        assert!(p.full);
        let exact = plan_of(&[1, 1], &b, 2).unwrap();
        assert!(!exact.full);
    }

    #[test]
    fn smallest_holding_bucket_is_chosen_and_shapes_combine() {
        // Many short sequences or few long ones.
        let b = [Bucket::new(256, 8), Bucket::new(1024, 2)];
        let short = plan_of(&[30, 30, 30], &b, 8).unwrap();
        assert_eq!(short.bucket, Bucket::new(256, 8));
        let long = plan_of(&[600, 300, 30], &b, 8).unwrap();
        assert_eq!(long.picked, vec![0, 1]);
        assert_eq!(long.bucket, Bucket::new(1024, 2));
        assert!(long.full);
    }

    /// The engine relies on this: it never gets a batch over the bucket the batch is labelled
    /// with, and the label is the smallest configured bucket that holds it.
    #[test]
    fn every_plan_fits_the_smallest_bucket_holding_it() {
        let bucket_sets: [&[Bucket]; 3] = [
            &[Bucket::new(64, 4)],
            &[Bucket::new(32, 8), Bucket::new(128, 2)],
            &[Bucket::new(16, 1), Bucket::new(48, 3), Bucket::new(96, 6)],
        ];
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = |n: u64| {
            // xorshift64*: deterministic, no dependency.
            seed ^= seed >> 12;
            seed ^= seed << 25;
            seed ^= seed >> 27;
            seed.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
        };
        for buckets in bucket_sets {
            let longest = buckets.iter().map(|b| b.tokens).max().unwrap();
            let max_seqs = buckets.iter().map(|b| b.seqs).max().unwrap();
            for _ in 0..500 {
                let lengths: Vec<usize> = (0..next(20))
                    .map(|_| 1 + next(longest as u64) as usize)
                    .collect();
                let Some(p) = plan_of(&lengths, buckets, max_seqs) else {
                    assert!(lengths.is_empty());
                    continue;
                };
                let tokens: usize = p.picked.iter().map(|&i| lengths[i]).sum();
                assert_eq!(p.tokens, tokens);
                assert!(buckets.contains(&p.bucket));
                assert!(
                    p.bucket.holds(tokens, p.picked.len()),
                    "{lengths:?}: {p:?} is over its bucket"
                );
                let smallest = buckets.iter().find(|b| b.holds(tokens, p.picked.len()));
                assert_eq!(smallest, Some(&p.bucket));
            }
        }
    }

    #[test]
    fn scan_limit_bounds_the_work_and_counts_as_full() {
        let b = [Bucket::new(1000, 100)];
        let lengths = [1usize; 10];
        let p = plan(lengths.iter().copied().map(Some), &b, 100, 4).unwrap();
        assert_eq!(p.picked, vec![0, 1, 2, 3]);
        assert!(p.full);
    }
}
