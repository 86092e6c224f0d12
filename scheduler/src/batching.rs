//! Which queued questions form the next batch.
//!
//! Policy: whole questions first, oldest first, with first-fit backfill; then chunks of long
//! questions (chunked prefill) in the room left, the question with the least left to run first,
//! at most `chunk_budget` chunk tokens a batch. A candidate that does not fit is skipped and
//! the ones after it may fill the space it left. Consequences:
//! - the oldest queued whole question is in the next batch (admission refuses any piece larger
//!   than the largest bucket) unless an overdue chunk took its room, so no whole question
//!   starves, and short questions never wait behind a long one that did not fit;
//! - a long question's chunks take only what the whole questions leave, so they do not make the
//!   short questions' batches longer than one chunk's worth of tokens, however many long
//!   questions are in flight (each of them would otherwise add a chunk to every batch);
//! - a chunk left out of [`OVERDUE_AFTER`] batches in a row goes first, ahead of the whole
//!   questions and of the budget, so a long question still moves under any load of short ones.

use crate::config::Bucket;

/// Batches a chunk may be left out of in a row before it goes first.
pub(crate) const OVERDUE_AFTER: u32 = 8;

/// One queued entry as batch formation sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// Tokens it adds to the batch.
    pub tokens: usize,
    /// For a chunk: its question's tokens from this chunk on. `None` for a whole question.
    pub remaining: Option<usize>,
    /// For a chunk: the batches in a row it was left out of.
    pub passed_over: u32,
}

impl Candidate {
    pub fn whole(tokens: usize) -> Self {
        Self {
            tokens,
            remaining: None,
            passed_over: 0,
        }
    }

    fn overdue(&self) -> bool {
        self.remaining.is_some() && self.passed_over >= OVERDUE_AFTER
    }

    /// The order candidates are considered in (smaller first; ties by queue position).
    fn rank(&self) -> (u8, usize) {
        match self.remaining {
            Some(_) if self.overdue() => (0, 0),
            None => (1, 0),
            Some(left) => (2, left),
        }
    }
}

/// The chosen questions (positions in the queue, ascending) and the batch's shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    pub picked: Vec<usize>,
    pub tokens: usize,
    /// Smallest bucket holding the batch.
    pub bucket: Bucket,
    /// True when the batch is limited by its capacity rather than by what is queued (a queued
    /// question was left out for want of room): waiting would not make it fuller.
    pub full: bool,
    /// Chunks this engine could have run that were left out (positions in the queue).
    pub passed_over: Vec<usize>,
}

fn fits(buckets: &[Bucket], tokens: usize, seqs: usize) -> bool {
    buckets.iter().any(|b| b.holds(tokens, seqs))
}

/// Plans a batch over the queued entries (oldest first; `None` for one this engine cannot run:
/// a chunk whose state another engine holds). `buckets` is sorted smallest first. Returns `None`
/// if nothing this engine can run is queued.
pub(crate) fn plan(
    candidates: impl ExactSizeIterator<Item = Option<Candidate>>,
    buckets: &[Bucket],
    max_seqs: usize,
    max_scan: usize,
    chunk_budget: usize,
) -> Option<Plan> {
    let queued = candidates.len();
    let mut order: Vec<(usize, Candidate)> = candidates
        .take(max_scan)
        .enumerate()
        .filter_map(|(i, c)| c.map(|c| (i, c)))
        .collect();
    // Stable: equal ranks keep their queue order.
    order.sort_by_key(|(_, c)| c.rank());
    let mut picked = Vec::new();
    let mut passed_over = Vec::new();
    let mut tokens = 0usize;
    let mut chunk_tokens = 0usize;
    let mut full = queued > max_scan;
    for (at, (i, c)) in order.iter().enumerate() {
        if picked.len() == max_seqs {
            full = true;
            passed_over.extend(
                order[at..]
                    .iter()
                    .filter(|(_, c)| c.remaining.is_some())
                    .map(|(i, _)| *i),
            );
            break;
        }
        let is_chunk = c.remaining.is_some();
        let within_budget = !is_chunk || c.overdue() || chunk_tokens + c.tokens <= chunk_budget;
        if within_budget && fits(buckets, tokens + c.tokens, picked.len() + 1) {
            picked.push(*i);
            tokens += c.tokens;
            if is_chunk {
                chunk_tokens += c.tokens;
            }
            continue;
        }
        // Left out for room (a chunk over the budget could still run beside more whole
        // questions, so only room makes the batch full).
        full |= within_budget;
        if is_chunk {
            passed_over.push(*i);
        }
    }
    picked.sort_unstable();
    passed_over.sort_unstable();
    let bucket = *buckets.iter().find(|b| b.holds(tokens, picked.len()))?;
    (!picked.is_empty()).then_some(Plan {
        picked,
        tokens,
        bucket,
        full,
        passed_over,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wholes(lengths: &[usize]) -> impl ExactSizeIterator<Item = Option<Candidate>> + '_ {
        lengths.iter().map(|&l| Some(Candidate::whole(l)))
    }

    fn plan_of(lengths: &[usize], buckets: &[Bucket], max_seqs: usize) -> Option<Plan> {
        plan(wholes(lengths), buckets, max_seqs, 1024, usize::MAX)
    }

    fn chunk(tokens: usize, remaining: usize, passed_over: u32) -> Option<Candidate> {
        Some(Candidate {
            tokens,
            remaining: Some(remaining),
            passed_over,
        })
    }

    #[test]
    fn chunks_take_the_room_whole_questions_leave_within_the_budget() {
        let b = [Bucket::new(100, 8)];
        // Two long questions' chunks (the oldest entries), then short whole questions.
        let queue = [
            chunk(20, 200, 0),
            chunk(20, 150, 0),
            Some(Candidate::whole(30)),
            Some(Candidate::whole(30)),
        ];
        let p = plan(queue.into_iter(), &b, 8, 1024, 20).unwrap();
        // Both short ones, then one chunk: the one with less left, within the budget of 20.
        assert_eq!(p.picked, vec![1, 2, 3]);
        assert_eq!(p.tokens, 80);
        assert_eq!(p.passed_over, vec![0]);
        assert!(
            !p.full,
            "a chunk over the budget does not make the batch full"
        );
        // Without short ones, still one chunk's worth.
        let p = plan(
            [chunk(20, 200, 0), chunk(20, 150, 0)].into_iter(),
            &b,
            8,
            1024,
            20,
        )
        .unwrap();
        assert_eq!(p.picked, vec![1]);
        // A budget of two chunks takes both.
        let p = plan(
            [chunk(20, 200, 0), chunk(20, 150, 0)].into_iter(),
            &b,
            8,
            1024,
            40,
        )
        .unwrap();
        assert_eq!(p.picked, vec![0, 1]);
        assert!(p.passed_over.is_empty());
    }

    #[test]
    fn whole_questions_fill_the_batch_before_any_chunk() {
        let b = [Bucket::new(64, 8)];
        let queue = [
            chunk(32, 100, 0),
            Some(Candidate::whole(40)),
            Some(Candidate::whole(24)),
        ];
        let p = plan(queue.into_iter(), &b, 8, 1024, 32).unwrap();
        assert_eq!(p.picked, vec![1, 2]);
        assert_eq!(p.passed_over, vec![0]);
        assert!(p.full, "the chunk was left out for room");
    }

    #[test]
    fn an_overdue_chunk_goes_first_whatever_the_budget() {
        let b = [Bucket::new(64, 8)];
        // A whole question, a chunk passed over `passed` times, a chunk with little left, another
        // whole question.
        let queue = |passed| {
            [
                Some(Candidate::whole(40)),
                chunk(32, 100, passed),
                chunk(16, 20, 0),
                Some(Candidate::whole(8)),
            ]
        };
        let p = plan(queue(OVERDUE_AFTER).into_iter(), &b, 8, 1024, 16).unwrap();
        // The overdue chunk, then the whole questions that fit (40 does not), then the other
        // chunk: over the budget the overdue one used.
        assert_eq!(p.picked, vec![1, 3]);
        assert_eq!(p.passed_over, vec![2]);
        assert!(p.full);
        let p = plan(queue(OVERDUE_AFTER - 1).into_iter(), &b, 8, 1024, 16).unwrap();
        assert_eq!(p.picked, vec![0, 2, 3]);
        assert_eq!(p.passed_over, vec![1]);
    }

    #[test]
    fn the_sequence_cap_passes_over_the_chunks_it_leaves_out() {
        let b = [Bucket::new(100, 2)];
        let queue = [
            chunk(8, 40, 0),
            Some(Candidate::whole(5)),
            Some(Candidate::whole(5)),
        ];
        let p = plan(queue.into_iter(), &b, 2, 1024, 8).unwrap();
        assert_eq!(p.picked, vec![1, 2]);
        assert_eq!(p.passed_over, vec![0]);
        assert!(p.full);
    }

    #[test]
    fn skips_what_another_engine_must_run() {
        let b = [Bucket::new(100, 4)];
        let queue = [
            None,
            Some(Candidate::whole(30)),
            None,
            Some(Candidate::whole(20)),
        ];
        let p = plan(queue.into_iter(), &b, 4, 1024, usize::MAX).unwrap();
        assert_eq!(p.picked, vec![1, 3]);
        assert_eq!(p.tokens, 50);
        assert!(!p.full, "waiting could still fill it");
        assert_eq!(
            plan([None, None].into_iter(), &b, 4, 1024, usize::MAX),
            None
        );
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
        let p = plan(wholes(&lengths), &b, 100, 4, usize::MAX).unwrap();
        assert_eq!(p.picked, vec![0, 1, 2, 3]);
        assert!(p.full);
    }
}
