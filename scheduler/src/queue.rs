//! The admission queue and the table of admitted requests: one value behind one lock, shared by
//! the submitters, the engine threads and the deadline thread. Every state change goes through a
//! method here so the counters, the deadline index and the metrics stay consistent.
//!
//! Invariants: a request is in `requests` from admission until it is answered, failed or
//! cancelled, and is replied to exactly once, when it leaves; a queued question's request is
//! always in `requests`; `deadlines` holds exactly the requests that have a deadline and a
//! question not started yet (a chunked question starts with its first chunk).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::Instant;

use metrics::{counter, gauge, histogram};
use tokio::sync::oneshot;

use crate::batching;
use crate::config::{Bucket, Validated};
use crate::drain_rate::DrainRate;
use crate::engine::ChunkCarry;
use crate::outcome::{Answer, Failure, Question, RejectReason, Rejection};
use crate::stats::Stats;
use crate::telemetry as names;

pub(crate) type Reply = oneshot::Sender<Result<Answer, Failure>>;
pub(crate) type ReplyReceiver = oneshot::Receiver<Result<Answer, Failure>>;

/// One queued question (or the next chunk of one): which request it belongs to, its place there,
/// and when it was queued (a question's later chunks keep its first chunk's time).
#[derive(Debug)]
pub(crate) struct QueuedSeq {
    pub request: u64,
    pub index: usize,
    pub question: Question,
    pub enqueued: Instant,
    pub chunk: Option<Chunk>,
}

/// The part of a chunked question an entry stands for: ids `start..end`, and the engine's state
/// between chunks.
#[derive(Debug)]
pub(crate) struct Chunk {
    pub start: usize,
    pub end: usize,
    pub carry: ChunkCarry,
    /// The engine that ran the previous chunk: its state lives on that engine's device, so this
    /// chunk runs there too (`None` for a first chunk).
    pub engine: Option<usize>,
    /// Batches in a row this chunk could have joined and was left out of ([`batching`]).
    pub passed_over: u32,
}

impl QueuedSeq {
    /// The engine that holds this entry's state (a chunk after the first).
    fn held_by(&self) -> Option<usize> {
        self.chunk.as_ref().and_then(|c| c.engine)
    }

    /// Whether `engine` can run this entry: anything but a chunk whose state another engine holds.
    fn runs_on(&self, engine: usize) -> bool {
        self.held_by().is_none_or(|e| e == engine)
    }

    /// The ids this entry runs: the whole question, or its chunk.
    pub fn ids(&self) -> &[u32] {
        match &self.chunk {
            Some(c) => &self.question.ids[c.start..c.end],
            None => &self.question.ids,
        }
    }

    /// How batch formation sees this entry.
    fn candidate(&self) -> batching::Candidate {
        let tokens = self.ids().len();
        match &self.chunk {
            Some(c) => batching::Candidate {
                tokens,
                remaining: Some(self.question.ids.len() - c.start),
                passed_over: c.passed_over,
                first: self.starts_question(),
            },
            None => batching::Candidate::whole(tokens),
        }
    }

    /// Whether taking this entry starts its question (it is whole, or its first chunk).
    fn starts_question(&self) -> bool {
        self.chunk.as_ref().is_none_or(|c| c.start == 0)
    }

    /// Whether running this entry answers the question (it is whole, or its last chunk).
    pub fn answers(&self) -> bool {
        self.chunk
            .as_ref()
            .is_none_or(|c| c.end == self.question.ids.len())
    }

    /// The entry for the chunk after this one (which must not be the last), run by `engine`.
    fn next_chunk(self, max_chunk: usize, engine: usize) -> Self {
        let chunk = self.chunk.expect("only a chunk has a next one");
        let len = self.question.ids.len();
        Self {
            chunk: Some(Chunk {
                start: chunk.end,
                end: len.min(chunk.end + max_chunk),
                carry: chunk.carry,
                engine: Some(engine),
                passed_over: 0,
            }),
            ..self
        }
    }
}

/// Questions taken out of the queue for one engine call.
#[derive(Debug)]
pub(crate) struct TakenBatch {
    pub seqs: Vec<QueuedSeq>,
    pub bucket: Bucket,
    pub tokens: usize,
}

/// What an engine thread should do next.
#[derive(Debug)]
pub(crate) enum Next {
    /// Nothing queued.
    Idle,
    /// Something is queued but the batch is not full yet: wait for more until then.
    WaitUntil(Instant),
    Run(TakenBatch),
}

struct RequestEntry {
    admitted: Instant,
    /// Start of the first batch that held one of its questions.
    first_start: Option<Instant>,
    results: Vec<Option<Vec<f32>>>,
    unanswered: usize,
    queued_seqs: usize,
    /// Questions not started yet: while there is one, the deadline applies.
    unstarted_seqs: usize,
    queued_tokens: usize,
    deadline: Option<Instant>,
    reply: Reply,
}

pub(crate) struct QueueState {
    cfg: Validated,
    pending: VecDeque<QueuedSeq>,
    requests: HashMap<u64, RequestEntry>,
    deadlines: BTreeSet<(Instant, u64)>,
    next_id: u64,
    queued_requests: usize,
    queued_tokens: usize,
    running_batches: usize,
    draining: bool,
    stopping: bool,
    /// Every engine is lost: nothing queued can ever run.
    no_engine: bool,
    drain_rate: DrainRate,
    /// The carries of chunked questions whose request left while a chunk was queued (cancelled,
    /// expired, failed). A carry may hold an engine's device memory, and a device free from
    /// another thread could land inside a CUDA graph capture on the engine's stream, so an
    /// engine thread drops them between its batches, never the thread that cancelled: each
    /// with the engine that must drop it.
    orphaned_carries: Vec<(usize, ChunkCarry)>,
    /// Engines lost for good: their chunks' states went with their devices.
    lost_engines: BTreeSet<usize>,
}

impl QueueState {
    pub fn new(cfg: Validated) -> Self {
        let window = cfg.config.drain_rate_window;
        Self {
            cfg,
            pending: VecDeque::new(),
            requests: HashMap::new(),
            deadlines: BTreeSet::new(),
            next_id: 0,
            queued_requests: 0,
            queued_tokens: 0,
            running_batches: 0,
            draining: false,
            stopping: false,
            no_engine: false,
            orphaned_carries: Vec::new(),
            lost_engines: BTreeSet::new(),
            drain_rate: DrainRate::new(window),
        }
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping
    }

    pub fn is_draining(&self) -> bool {
        self.draining
    }

    /// Whether carries wait for an engine thread to drop them.
    pub fn has_orphaned_carries(&self) -> bool {
        !self.orphaned_carries.is_empty()
    }

    /// Whether carries wait for `engine`'s thread to drop them.
    pub fn has_orphaned_carries_of(&self, engine: usize) -> bool {
        self.orphaned_carries.iter().any(|(e, _)| *e == engine)
    }

    /// The carries for `engine`'s thread to drop (after releasing the lock).
    pub fn take_orphaned_carries(&mut self, engine: usize) -> Vec<ChunkCarry> {
        let (mine, others) = std::mem::take(&mut self.orphaned_carries)
            .into_iter()
            .partition(|(e, _)| *e == engine);
        self.orphaned_carries = others;
        mine.into_iter().map(|(_, carry)| carry).collect()
    }

    pub fn has_queued(&self) -> bool {
        !self.pending.is_empty()
    }

    /// No admitted request is unanswered and no engine is running a batch.
    pub fn is_idle(&self) -> bool {
        self.requests.is_empty() && self.running_batches == 0
    }

    pub fn earliest_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|&(d, _)| d)
    }

    /// The queue's part of [`Stats`]; the engines' part is the caller's.
    pub fn stats_without_engines(&self) -> Stats {
        Stats {
            queued_requests: self.queued_requests,
            queued_tokens: self.queued_tokens,
            queued_sequences: self.pending.len(),
            in_flight_requests: self.requests.len(),
            running_batches: self.running_batches,
            draining: self.draining,
            engines: Vec::new(),
        }
    }

    fn reject(&mut self, reason: RejectReason, now: Instant) -> Rejection {
        let c = &self.cfg.config;
        let retry_after = match reason {
            RejectReason::QueueFullRequests | RejectReason::QueueFullTokens => {
                Some(self.drain_rate.retry_after(
                    now,
                    self.queued_tokens,
                    c.retry_after_default,
                    c.retry_after_min,
                    c.retry_after_max,
                ))
            }
            RejectReason::Draining | RejectReason::NoEngine => Some(c.retry_after_min),
            RejectReason::TooLarge | RejectReason::Invalid => None,
        };
        counter!(names::REJECTIONS_TOTAL, names::REASON_LABEL => reason.as_str()).increment(1);
        Rejection {
            reason,
            retry_after,
        }
    }

    /// Admits a request or says why not. On success returns its id, the receiver of its reply,
    /// and whether its deadline became the earliest one (the deadline thread must re-arm).
    pub fn admit(
        &mut self,
        questions: Vec<Question>,
        deadline: Option<Instant>,
        now: Instant,
    ) -> Result<(u64, ReplyReceiver, bool), Rejection> {
        if self.no_engine {
            return Err(self.reject(RejectReason::NoEngine, now));
        }
        if self.draining || self.stopping {
            return Err(self.reject(RejectReason::Draining, now));
        }
        if questions.is_empty()
            || questions
                .iter()
                .any(|q| q.ids.is_empty() || q.n_options == 0)
        {
            return Err(self.reject(RejectReason::Invalid, now));
        }
        let tokens: usize = questions.iter().map(|q| q.ids.len()).sum();
        let c = &self.cfg.config;
        // The longest piece a batch must hold: a question, or a chunk of one.
        let longest = questions
            .iter()
            .map(|q| c.chunk_size_for(q).unwrap_or(q.ids.len()))
            .max()
            .unwrap_or(0);
        if longest > self.cfg.capacity.tokens || tokens > c.max_queue_tokens {
            return Err(self.reject(RejectReason::TooLarge, now));
        }
        if self.queued_requests >= c.max_queue_requests {
            return Err(self.reject(RejectReason::QueueFullRequests, now));
        }
        if self.queued_tokens + tokens > c.max_queue_tokens {
            return Err(self.reject(RejectReason::QueueFullTokens, now));
        }

        let deadline = deadline.or_else(|| c.default_deadline.map(|d| now + d));
        let id = self.next_id;
        self.next_id += 1;
        let (reply, receiver) = oneshot::channel();
        let n = questions.len();
        for (index, q) in questions.into_iter().enumerate() {
            let chunk = c.chunk_size_for(&q).map(|max_chunk| Chunk {
                start: 0,
                end: max_chunk,
                carry: ChunkCarry::default(),
                engine: None,
                passed_over: 0,
            });
            self.pending.push_back(QueuedSeq {
                request: id,
                index,
                question: q,
                enqueued: now,
                chunk,
            });
        }
        self.requests.insert(
            id,
            RequestEntry {
                admitted: now,
                first_start: None,
                results: vec![None; n],
                unanswered: n,
                queued_seqs: n,
                unstarted_seqs: n,
                queued_tokens: tokens,
                deadline,
                reply,
            },
        );
        self.queued_requests += 1;
        self.queued_tokens += tokens;
        let mut new_earliest = false;
        if let Some(d) = deadline {
            new_earliest = self.earliest_deadline().is_none_or(|e| d < e);
            self.deadlines.insert((d, id));
        }
        self.publish_gauges();
        Ok((id, receiver, new_earliest))
    }

    /// Removes the request's queued questions from the queue and its counters.
    fn unqueue(&mut self, id: u64, entry: &RequestEntry) {
        if entry.queued_seqs == 0 {
            return;
        }
        for seq in std::mem::take(&mut self.pending) {
            if seq.request != id {
                self.pending.push_back(seq);
                continue;
            }
            // A first chunk holds nothing; a lost engine's device is gone.
            if let Some(Chunk {
                carry,
                engine: Some(engine),
                ..
            }) = seq.chunk
            {
                if !self.lost_engines.contains(&engine) {
                    self.orphaned_carries.push((engine, carry));
                }
            }
        }
        self.queued_requests -= 1;
        self.queued_tokens -= entry.queued_tokens;
        if let Some(d) = entry.deadline {
            self.deadlines.remove(&(d, id));
        }
    }

    /// The client dropped its ticket: forget the request, never compute its queued questions.
    /// Returns false if it was already answered (nothing to cancel).
    pub fn cancel(&mut self, id: u64) -> bool {
        let Some(entry) = self.requests.remove(&id) else {
            return false;
        };
        self.unqueue(id, &entry);
        counter!(names::CANCELLED_TOTAL).increment(1);
        self.publish_gauges();
        true
    }

    fn fail(&mut self, id: u64, failure: Failure) {
        if let Some(entry) = self.requests.remove(&id) {
            self.unqueue(id, &entry);
            // Gauges first: whoever receives the reply must see them without this request.
            self.publish_gauges();
            // The client may have gone already; nothing to do then.
            let _ = entry.reply.send(Err(failure));
        }
    }

    /// Fails every request whose deadline is at or before `now` and that still has a question
    /// not started (a chunked question that started runs on, as a whole one does). Returns how
    /// many.
    pub fn expire_overdue(&mut self, now: Instant) -> usize {
        let mut expired = 0;
        while let Some(&(d, id)) = self.deadlines.first() {
            if d > now {
                break;
            }
            self.deadlines.pop_first();
            self.fail(id, Failure::DeadlineExceeded);
            expired += 1;
        }
        if expired > 0 {
            counter!(names::DEADLINE_EXCEEDED_TOTAL).increment(expired as u64);
            self.publish_gauges();
        }
        expired
    }

    /// Decides the next batch (see [`crate::batching`] for which questions) and when to run it:
    /// at once when no engine is running a batch (an idle device never waits: what arrives while
    /// it computes forms the next batch), the batch is full or the scheduler is draining;
    /// otherwise, while another engine's batch runs, once the oldest queued question has waited
    /// `max_wait`. `engine` asks; a chunk whose state another engine holds is left to that one.
    pub fn next_batch(&mut self, now: Instant, engine: usize) -> Next {
        // Beyond the scan, what this engine may run waits for the others to take theirs.
        let Some(first) = self
            .pending
            .iter()
            .take(self.cfg.config.max_scan)
            .position(|s| s.runs_on(engine))
        else {
            return Next::Idle;
        };
        let oldest = self.pending[first].enqueued;
        let Some(plan) = batching::plan(
            self.pending
                .iter()
                .map(|s| s.runs_on(engine).then(|| s.candidate())),
            &self.cfg.buckets,
            self.cfg.capacity.seqs,
            self.cfg.config.max_scan,
            batching::ChunkRoom {
                budget: self.cfg.config.max_chunk_tokens.unwrap_or(usize::MAX),
                grid: self.cfg.config.chunk_grid,
            },
        ) else {
            // Unreachable through `admit`, which refuses questions larger than every bucket; kept
            // so such a question could never wedge the queue (TEI #723).
            if let Some(head) = self.pending.get(first).map(|s| s.request) {
                self.fail(
                    head,
                    Failure::Internal("a question fits no batch bucket".into()),
                );
                self.publish_gauges();
            }
            return Next::Idle;
        };
        let launch_at = oldest + self.cfg.config.max_wait;
        if !plan.full && !self.draining && self.running_batches > 0 && now < launch_at {
            return Next::WaitUntil(launch_at);
        }
        Next::Run(self.take(plan, now))
    }

    fn take(&mut self, plan: batching::Plan, now: Instant) -> TakenBatch {
        for &i in &plan.passed_over {
            if let Some(c) = self.pending.get_mut(i).and_then(|s| s.chunk.as_mut()) {
                c.passed_over += 1;
            }
        }
        for &(i, run) in &plan.cuts {
            if let Some(c) = self.pending.get_mut(i).and_then(|s| s.chunk.as_mut()) {
                // The rest of the chunk is the start of the next one.
                c.end = c.start + run;
            }
        }
        let scanned = plan.picked.last().map_or(0, |&i| i + 1);
        let mut picks = plan.picked.iter().copied().peekable();
        let mut seqs = Vec::with_capacity(plan.picked.len());
        let mut skipped = Vec::new();
        for i in 0..scanned {
            let Some(seq) = self.pending.pop_front() else {
                break;
            };
            if picks.peek() == Some(&i) {
                picks.next();
                seqs.push(seq);
            } else {
                skipped.push(seq);
            }
        }
        for seq in skipped.into_iter().rev() {
            self.pending.push_front(seq);
        }

        for seq in &seqs {
            let len = seq.ids().len();
            self.queued_tokens -= len;
            if let Some(entry) = self.requests.get_mut(&seq.request) {
                entry.first_start.get_or_insert(now);
                entry.queued_tokens -= len;
                // Its deadline applies until every question has reached the model.
                if seq.starts_question() {
                    entry.unstarted_seqs -= 1;
                    if entry.unstarted_seqs == 0 {
                        if let Some(d) = entry.deadline {
                            self.deadlines.remove(&(d, seq.request));
                        }
                    }
                }
                // A question stays queued until its last chunk is taken.
                if seq.answers() {
                    entry.queued_seqs -= 1;
                    if entry.queued_seqs == 0 {
                        self.queued_requests -= 1;
                    }
                }
            }
            // A question's wait ends when its first chunk starts (later chunks keep its time).
            if seq.starts_question() {
                histogram!(names::QUEUE_WAIT_SECONDS)
                    .record(now.saturating_duration_since(seq.enqueued).as_secs_f64());
            }
        }
        let tokens: usize = seqs.iter().map(|s| s.ids().len()).sum();
        let chunks = seqs.iter().filter(|s| s.chunk.is_some()).count();
        if chunks > 0 {
            counter!(names::PREFILL_CHUNKS_TOTAL).increment(chunks as u64);
            counter!(names::PREFILL_CHUNKS_CUT_TOTAL).increment(plan.cuts.len() as u64);
            counter!(names::PREFILL_CHUNKS_OVERDUE_TOTAL).increment(plan.overdue as u64);
        }
        histogram!(names::BATCH_SEQUENCES).record(seqs.len() as f64);
        histogram!(names::BATCH_TOKENS).record(tokens as f64);
        histogram!(names::BATCH_FILL_RATIO).record(tokens as f64 / plan.bucket.tokens as f64);
        self.running_batches += 1;
        self.publish_gauges();
        TakenBatch {
            seqs,
            bucket: plan.bucket,
            tokens,
        }
    }

    /// Hands the engine's outcome for `batch` to its requests. Results of requests that already
    /// left (cancelled, failed, expired) are dropped; a failed batch fails all its requests. A
    /// chunk that is not its question's last queues the next one, in its question's place (by
    /// age: usually first, so a long question moves one chunk per batch).
    pub fn complete(
        &mut self,
        engine: usize,
        batch: TakenBatch,
        outcome: Result<Vec<Vec<f32>>, String>,
        start: Instant,
        end: Instant,
    ) {
        self.running_batches -= 1;
        self.drain_rate.record(start, end, batch.tokens);
        match outcome.and_then(|out| check_shape(&batch, out)) {
            Ok(outputs) => {
                for (seq, probs) in batch.seqs.into_iter().zip(outputs) {
                    if seq.answers() {
                        self.deliver(seq.request, seq.index, probs, end);
                    } else if self.requests.contains_key(&seq.request) {
                        self.requeue_next_chunk(seq, engine);
                    }
                }
            }
            Err(message) => {
                counter!(names::BATCH_FAILURES_TOTAL).increment(1);
                tracing::error!(sequences = batch.seqs.len(), "batch failed: {message}");
                for seq in &batch.seqs {
                    self.fail(seq.request, Failure::Internal(message.clone()));
                }
            }
        }
        self.publish_gauges();
    }

    fn requeue_next_chunk(&mut self, seq: QueuedSeq, engine: usize) {
        let max_chunk = self.cfg.config.max_chunk_tokens.unwrap_or(usize::MAX);
        let next = seq.next_chunk(max_chunk, engine);
        let at = self
            .pending
            .partition_point(|s| s.enqueued <= next.enqueued);
        self.pending.insert(at, next);
    }

    fn deliver(&mut self, id: u64, index: usize, probs: Vec<f32>, end: Instant) {
        let Some(entry) = self.requests.get_mut(&id) else {
            return;
        };
        let Some(slot) = entry.results.get_mut(index) else {
            return;
        };
        if slot.is_some() {
            return;
        }
        *slot = Some(probs);
        entry.unanswered -= 1;
        if entry.unanswered == 0 {
            if let Some(entry) = self.requests.remove(&id) {
                let first_start = entry.first_start.unwrap_or(entry.admitted);
                let answer = Answer {
                    probabilities: entry
                        .results
                        .into_iter()
                        .map(Option::unwrap_or_default)
                        .collect(),
                    queued: first_start.saturating_duration_since(entry.admitted),
                    infer: end.saturating_duration_since(first_start),
                };
                // Gauges first: whoever receives the reply must see them without this request.
                self.publish_gauges();
                let _ = entry.reply.send(Ok(answer));
            }
        }
    }

    /// Stops admitting and fails every unanswered request with `ShuttingDown`.
    pub fn stop(&mut self) {
        self.stopping = true;
        self.draining = true;
        let ids: Vec<u64> = self.requests.keys().copied().collect();
        for id in ids {
            self.fail(id, Failure::ShuttingDown);
        }
        self.publish_gauges();
    }

    /// Engine `engine` is lost for good while others serve: the requests whose next chunk needs
    /// the state it held fail.
    pub fn lose_engine(&mut self, engine: usize, why: &str) {
        self.lost_engines.insert(engine);
        let stranded: BTreeSet<u64> = self
            .pending
            .iter()
            .filter(|s| s.held_by() == Some(engine))
            .map(|s| s.request)
            .collect();
        for id in stranded {
            self.fail(
                id,
                Failure::Internal(format!(
                    "the engine holding its chunked question's state was lost: {why}"
                )),
            );
        }
        self.orphaned_carries.retain(|(e, _)| *e != engine);
        self.publish_gauges();
    }

    /// The last engine is lost: fails every unanswered request (nothing can run them) and
    /// refuses new ones with `NoEngine`.
    pub fn lose_all_engines(&mut self, why: &str) {
        self.no_engine = true;
        let ids: Vec<u64> = self.requests.keys().copied().collect();
        for id in ids {
            self.fail(
                id,
                Failure::Internal(format!("no engine is left to run it: {why}")),
            );
        }
        self.publish_gauges();
    }

    pub fn start_draining(&mut self) {
        self.draining = true;
    }

    fn publish_gauges(&self) {
        gauge!(names::QUEUE_REQUESTS).set(self.queued_requests as f64);
        gauge!(names::QUEUE_TOKENS).set(self.queued_tokens as f64);
        gauge!(names::INFLIGHT_REQUESTS).set(self.requests.len() as f64);
    }
}

/// One result per sequence, each with the sequence's number of options.
pub(crate) fn check_shape(
    batch: &TakenBatch,
    outputs: Vec<Vec<f32>>,
) -> Result<Vec<Vec<f32>>, String> {
    if outputs.len() != batch.seqs.len() {
        return Err(format!(
            "engine returned {} results for {} sequences",
            outputs.len(),
            batch.seqs.len()
        ));
    }
    for (i, (seq, probs)) in batch.seqs.iter().zip(&outputs).enumerate() {
        let expected = if seq.answers() {
            seq.question.n_options
        } else {
            0
        };
        if probs.len() != expected {
            return Err(format!(
                "engine returned {} probabilities for sequence {i}, which expects {expected}",
                probs.len(),
            ));
        }
    }
    Ok(outputs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn chunking_queue() -> QueueState {
        let cfg = Config {
            max_batch_tokens: 32,
            max_batch_seqs: 4,
            max_chunk_tokens: Some(8),
            ..Config::default()
        };
        QueueState::new(cfg.validate().expect("a valid configuration"))
    }

    /// Completes `batch` on `engine` with one empty result per sequence (what a chunk returns).
    fn complete_chunks(state: &mut QueueState, engine: usize, batch: TakenBatch) {
        let now = Instant::now();
        let outputs = batch
            .seqs
            .iter()
            .map(|s| vec![0.5; if s.answers() { 2 } else { 0 }])
            .collect();
        state.complete(engine, batch, Ok(outputs), now, now);
    }

    /// A long question (20 tokens: chunks of 8) admitted at `t0`, then a short one (3 tokens).
    fn long_then_short(state: &mut QueueState, t0: Instant) -> Vec<ReplyReceiver> {
        let long = Question::text((0..20).collect(), 2);
        let short = Question::text(vec![1, 2, 3], 2);
        let (_, long, _) = state.admit(vec![long], None, t0).unwrap();
        let (_, short, _) = state.admit(vec![short], None, t0).unwrap();
        vec![long, short]
    }

    fn chunk_starts(batch: &TakenBatch) -> Vec<Option<usize>> {
        batch
            .seqs
            .iter()
            .map(|s| s.chunk.as_ref().map(|c| c.start))
            .collect()
    }

    #[test]
    fn a_first_chunk_waits_for_its_whole_room_and_a_later_one_is_cut_to_it() {
        let mut state = chunking_queue();
        let t0 = Instant::now();
        let _replies = long_then_short(&mut state, t0);
        // The short question leaves 5 of the 8 tokens a batch with a chunk holds: the first chunk
        // is not cut, it runs next.
        let batch = taken(state.next_batch(t0, 0));
        assert_eq!(chunk_starts(&batch), [None]);
        complete_chunks(&mut state, 0, batch);
        let first = taken(state.next_batch(t0, 0));
        assert_eq!(chunk_starts(&first), [Some(0)]);
        // Another short question queues while it runs: the second chunk is cut to the room left
        // (8..13), and the third starts where the cut ended.
        let short = Question::text(vec![4, 5, 6], 2);
        let _reply = state.admit(vec![short], None, t0).unwrap();
        complete_chunks(&mut state, 0, first);
        let beside = taken(state.next_batch(t0, 0));
        assert_eq!(chunk_starts(&beside), [None, Some(8)]);
        assert_eq!(beside.seqs[1].ids(), (8..13).collect::<Vec<u32>>());
        assert_eq!(beside.tokens, 8);
        assert_eq!(state.queued_tokens, 7, "the cut's rest is still queued");
        complete_chunks(&mut state, 0, beside);
        let last = taken(state.next_batch(t0, 0));
        assert_eq!(chunk_starts(&last), [Some(13)]);
        assert_eq!(last.seqs[0].ids(), (13..20).collect::<Vec<u32>>());
        assert!(last.seqs[0].answers());
        complete_chunks(&mut state, 0, last);
        assert_eq!(state.queued_tokens, 0);
        assert!(state.pending.is_empty());
    }

    fn taken(next: Next) -> TakenBatch {
        match next {
            Next::Run(batch) => batch,
            other => panic!("expected a batch, got {other:?}"),
        }
    }

    /// A question of 20 tokens in chunks of 8 whose first chunk engine 1 ran: the queue, the
    /// request's id and its reply.
    fn first_chunk_run_by_engine_1() -> (QueueState, u64, crate::queue::ReplyReceiver) {
        let mut state = chunking_queue();
        let now = Instant::now();
        let long = Question::text((0..20).collect(), 2);
        let (id, reply, _) = state.admit(vec![long], None, now).unwrap();
        let first = taken(state.next_batch(now, 1));
        assert_eq!(first.seqs[0].ids().len(), 8);
        complete_chunks(&mut state, 1, first);
        (state, id, reply)
    }

    #[test]
    fn a_chunk_is_taken_only_by_the_engine_that_ran_the_one_before() {
        let (mut state, _id, _reply) = first_chunk_run_by_engine_1();
        let now = Instant::now();
        assert!(state.has_queued());
        assert!(
            matches!(state.next_batch(now, 0), Next::Idle),
            "engine 0 holds none of its state"
        );
        let second = taken(state.next_batch(now, 1));
        assert_eq!(second.seqs[0].chunk.as_ref().map(|c| c.start), Some(8));
    }

    #[test]
    fn a_cancelled_chunks_carry_waits_for_its_own_engine() {
        let (mut state, id, _reply) = first_chunk_run_by_engine_1();
        assert!(state.cancel(id));
        assert!(!state.has_queued());
        assert!(state.take_orphaned_carries(0).is_empty());
        assert_eq!(state.take_orphaned_carries(1).len(), 1);
        assert!(!state.has_orphaned_carries());
    }

    #[test]
    fn losing_an_engine_fails_the_requests_whose_state_it_held() {
        let (mut state, _id, mut reply) = first_chunk_run_by_engine_1();
        state.lose_engine(1, "device lost");
        assert!(!state.has_queued());
        assert!(!state.has_orphaned_carries());
        match reply.try_recv() {
            Ok(Err(Failure::Internal(why))) => assert!(why.contains("device lost"), "{why}"),
            other => panic!("expected an internal failure, got {other:?}"),
        }
    }
}
