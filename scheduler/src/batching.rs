//! Which queued questions form the next batch.
//!
//! Policy: whole questions first, oldest first, with first-fit backfill; then chunks of long
//! questions (chunked prefill) in the room left, the question with the least left first. A batch
//! that carries a chunk holds at most the chunk budget in tokens, whole questions included: a
//! chunk is cut (on the resume grid) to the room the whole questions leave, and gets none when
//! they fill the budget. A candidate that does not fit is skipped and the ones after it may fill
//! the space it left. Consequences:
//! - the oldest queued whole question is in the next batch (admission refuses any piece larger
//!   than the largest bucket) unless an overdue chunk took its room, so no whole question
//!   starves, and short questions never wait behind a long one that did not fit;
//! - a long question's chunks never make a short question's batch longer than the budget (or
//!   than the whole questions alone, when they pass it), however many long questions are in
//!   flight: the long ones move in the room the short ones leave, and at the full budget when
//!   nothing else is queued;
//! - a chunk left out of [`OVERDUE_AFTER`] batches in a row goes first, whole, ahead of the whole
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
    /// A question's first chunk: never cut, since it resumes from the longest cached prefix of
    /// its own ids, which a cut would shorten.
    pub first: bool,
}

impl Candidate {
    pub fn whole(tokens: usize) -> Self {
        Self {
            tokens,
            remaining: None,
            passed_over: 0,
            first: false,
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
    /// Chunks picked but cut to the room left: (position in the queue, tokens it runs).
    pub cuts: Vec<(usize, usize)>,
    /// Chunks picked because they were overdue.
    pub overdue: usize,
}

/// How chunks share a batch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ChunkRoom {
    /// Tokens a batch carrying a chunk (not an overdue one) holds at most, whole questions
    /// included.
    pub budget: usize,
    /// A chunk cut to the room left runs a multiple of this many tokens (its question's chunks
    /// then start on the backend's resume grid).
    pub grid: usize,
}

impl ChunkRoom {
    /// What `chunk` may run in a batch already holding `held` tokens: all of it, a cut on the
    /// grid (not a first chunk), or nothing.
    fn grant(&self, chunk: &Candidate, held: usize) -> Option<usize> {
        let room = self.budget.saturating_sub(held);
        if chunk.tokens <= room {
            return Some(chunk.tokens);
        }
        let cut = room / self.grid * self.grid;
        (cut > 0 && !chunk.first).then_some(cut)
    }
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
    chunks: ChunkRoom,
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
    let mut cuts = Vec::new();
    let mut overdue = 0;
    let mut tokens = 0usize;
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
        let granted = if is_chunk && !c.overdue() {
            chunks.grant(c, tokens)
        } else {
            Some(c.tokens)
        };
        if let Some(run) = granted.filter(|&run| fits(buckets, tokens + run, picked.len() + 1)) {
            picked.push(*i);
            tokens += run;
            overdue += usize::from(c.overdue());
            if run < c.tokens {
                // The budget is spent: waiting would not add to this batch.
                cuts.push((*i, run));
                full = true;
            }
            continue;
        }
        // Left out for room (a chunk without room in the budget could still run beside fewer
        // whole questions, so only room makes the batch full).
        full |= granted.is_some();
        if is_chunk {
            passed_over.push(*i);
        }
    }
    picked.sort_unstable();
    passed_over.sort_unstable();
    cuts.sort_unstable();
    let bucket = *buckets.iter().find(|b| b.holds(tokens, picked.len()))?;
    (!picked.is_empty()).then_some(Plan {
        picked,
        tokens,
        bucket,
        full,
        passed_over,
        cuts,
        overdue,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wholes(lengths: &[usize]) -> impl ExactSizeIterator<Item = Option<Candidate>> + '_ {
        lengths.iter().map(|&l| Some(Candidate::whole(l)))
    }

    /// No chunks queued: no budget.
    const NO_CHUNKS: ChunkRoom = ChunkRoom {
        budget: usize::MAX,
        grid: 1,
    };

    fn plan_of(lengths: &[usize], buckets: &[Bucket], max_seqs: usize) -> Option<Plan> {
        plan(wholes(lengths), buckets, max_seqs, 1024, NO_CHUNKS)
    }

    /// A chunk budget of `budget` tokens, cuts on a grid of 4.
    fn room(budget: usize) -> ChunkRoom {
        ChunkRoom { budget, grid: 4 }
    }

    /// A chunk after its question's first.
    fn chunk(tokens: usize, remaining: usize, passed_over: u32) -> Option<Candidate> {
        Some(Candidate {
            tokens,
            remaining: Some(remaining),
            passed_over,
            first: false,
        })
    }

    #[test]
    fn a_chunk_takes_the_room_whole_questions_leave_up_to_the_budget() {
        let b = [Bucket::new(200, 8)];
        // Two long questions' chunks (the oldest entries), then two short whole questions.
        let queue = [
            chunk(40, 200, 0),
            chunk(40, 150, 0),
            Some(Candidate::whole(30)),
            Some(Candidate::whole(30)),
        ];
        let with = |budget| plan(queue.into_iter(), &b, 8, 1024, room(budget)).unwrap();
        // Room for one chunk beside the short ones: the one with less left.
        let p = with(100);
        assert_eq!(p.picked, vec![1, 2, 3]);
        assert_eq!(p.tokens, 100);
        assert_eq!(p.passed_over, vec![0]);
        assert!(p.cuts.is_empty());
        assert!(!p.full, "a chunk without room does not make the batch full");
        // Less room: the chunk is cut to it, on the grid, and the budget is spent.
        let p = with(90);
        assert_eq!(p.picked, vec![1, 2, 3]);
        assert_eq!(p.cuts, vec![(1, 28)]);
        assert_eq!(p.tokens, 88);
        assert_eq!(p.passed_over, vec![0]);
        assert!(p.full);
        // Room under one grid step, or none: the short ones run alone.
        for budget in [63, 60, 20] {
            let p = with(budget);
            assert_eq!(p.picked, vec![2, 3], "budget {budget}");
            assert_eq!(p.passed_over, vec![0, 1]);
            assert!(p.cuts.is_empty());
        }
        // Without short ones the chunks take the whole budget.
        let chunks = [chunk(40, 200, 0), chunk(40, 150, 0)];
        let alone = |budget| plan(chunks.into_iter(), &b, 8, 1024, room(budget)).unwrap();
        let p = alone(40);
        assert_eq!(p.picked, vec![1]);
        assert_eq!(p.passed_over, vec![0]);
        let p = alone(60);
        assert_eq!(p.picked, vec![0, 1]);
        assert_eq!(p.cuts, vec![(0, 20)]);
        let p = alone(80);
        assert_eq!(p.picked, vec![0, 1]);
        assert!(p.passed_over.is_empty() && p.cuts.is_empty());
    }

    #[test]
    fn a_first_chunk_runs_whole_or_waits() {
        let b = [Bucket::new(200, 8)];
        let first = Some(Candidate {
            first: true,
            ..chunk(40, 200, 0).unwrap()
        });
        let queue = [first, Some(Candidate::whole(30))];
        let with = |budget| plan(queue.into_iter(), &b, 8, 1024, room(budget)).unwrap();
        let p = with(70);
        assert_eq!(p.picked, vec![0, 1]);
        assert!(p.cuts.is_empty());
        // Room for 36 of its 40 tokens: not cut, left for a later batch.
        let p = with(66);
        assert_eq!(p.picked, vec![1]);
        assert_eq!(p.passed_over, vec![0]);
        assert!(!p.full);
    }

    #[test]
    fn whole_questions_fill_the_batch_before_any_chunk() {
        let b = [Bucket::new(64, 8)];
        let queue = [
            chunk(32, 100, 0),
            Some(Candidate::whole(40)),
            Some(Candidate::whole(24)),
        ];
        let p = plan(queue.into_iter(), &b, 8, 1024, room(100)).unwrap();
        assert_eq!(p.picked, vec![1, 2]);
        assert_eq!(p.passed_over, vec![0]);
        assert!(p.full, "the chunk was left out for room");
    }

    #[test]
    fn an_overdue_chunk_goes_first_whole_whatever_the_budget() {
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
        let p = plan(queue(OVERDUE_AFTER).into_iter(), &b, 8, 1024, room(24)).unwrap();
        // The overdue chunk, uncut over the budget of 24; then the whole questions that fit (40
        // does not); the other chunk has no room left in the budget.
        assert_eq!(p.picked, vec![1, 3]);
        assert_eq!(p.tokens, 40);
        assert_eq!(p.passed_over, vec![2]);
        assert!(p.cuts.is_empty());
        assert_eq!(p.overdue, 1);
        assert!(p.full);
        let p = plan(queue(OVERDUE_AFTER - 1).into_iter(), &b, 8, 1024, room(24)).unwrap();
        assert_eq!(p.picked, vec![0, 3]);
        assert_eq!(p.passed_over, vec![1, 2]);
        assert_eq!(p.overdue, 0);
    }

    #[test]
    fn the_sequence_cap_passes_over_the_chunks_it_leaves_out() {
        let b = [Bucket::new(100, 2)];
        let queue = [
            chunk(8, 40, 0),
            Some(Candidate::whole(5)),
            Some(Candidate::whole(5)),
        ];
        let p = plan(queue.into_iter(), &b, 2, 1024, room(100)).unwrap();
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
        let p = plan(queue.into_iter(), &b, 4, 1024, NO_CHUNKS).unwrap();
        assert_eq!(p.picked, vec![1, 3]);
        assert_eq!(p.tokens, 50);
        assert!(!p.full, "waiting could still fill it");
        assert_eq!(plan([None, None].into_iter(), &b, 4, 1024, NO_CHUNKS), None);
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
        let p = plan(wholes(&lengths), &b, 100, 4, NO_CHUNKS).unwrap();
        assert_eq!(p.picked, vec![0, 1, 2, 3]);
        assert!(p.full);
    }
}
