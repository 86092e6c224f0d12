//! Mock engines and helpers shared by the scheduler tests.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use instinct_scheduler::{
    Answer, Batch, Bucket, Config, Engine, Failure, FatalEngineError, Question, Scheduler,
    SeqInput, Ticket,
};
use parking_lot::{Condvar, Mutex};

/// First id of a question that makes the mock return an error for its batch.
pub const FAIL_MARK: u32 = u32::MAX - 1;
/// First id of a question that makes the mock panic.
pub const PANIC_MARK: u32 = u32::MAX - 2;
/// First id of a question that makes the mock return one result too few.
pub const SHORT_MARK: u32 = u32::MAX - 3;
/// First id of a question whose batch waits for the gate to open.
pub const GATE_MARK: u32 = u32::MAX - 4;
/// First id of a question that makes the mock report its device lost.
pub const FATAL_MARK: u32 = u32::MAX - 5;

/// What one engine call was given.
#[derive(Clone, Debug)]
pub struct Record {
    pub engine: usize,
    pub seqs: Vec<Vec<u32>>,
    /// Per sequence, where its chunk starts in its question (`None`: a whole question).
    pub chunk_starts: Vec<Option<usize>>,
    pub bucket: Bucket,
    pub tokens: usize,
}

impl Record {
    pub fn tags(&self) -> Vec<u32> {
        self.seqs.iter().map(|s| s[0]).collect()
    }
}

pub type Log = Arc<Mutex<Vec<Record>>>;

/// Every chunk carry the mock left, and the name of the thread each was dropped on.
#[derive(Debug, Default)]
pub struct CarryLog {
    pub put: usize,
    pub dropped_on: Vec<String>,
}

/// What the mock leaves between chunks: where the next chunk starts and the hash so far. Its drop
/// is logged, as a real engine's device state would be freed.
struct MockCarry {
    at: usize,
    hash: u64,
    log: Arc<Mutex<CarryLog>>,
}

impl Drop for MockCarry {
    fn drop(&mut self) {
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("unnamed").to_string();
        self.log.lock().dropped_on.push(name);
    }
}

/// A latch the gated batch waits on.
#[derive(Default)]
pub struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
}

impl Gate {
    pub fn open(&self) {
        *self.open.lock() = true;
        self.cv.notify_all();
    }

    fn wait(&self) {
        let mut open = self.open.lock();
        while !*open {
            self.cv.wait(&mut open);
        }
    }
}

/// Answers each sequence with a function of its ids alone, after `delay`; records every batch.
pub struct MockEngine {
    pub id: usize,
    pub delay: Duration,
    pub log: Log,
    pub gate: Arc<Gate>,
    pub carries: Arc<Mutex<CarryLog>>,
}

impl Engine for MockEngine {
    fn run_batch(&mut self, batch: &Batch<'_>) -> anyhow::Result<Vec<Vec<f32>>> {
        // What a real engine relies on: every batch of every test fits the bucket it came with.
        let tokens: usize = batch.seqs.iter().map(|s| s.ids.len()).sum();
        assert_eq!(
            tokens, batch.tokens,
            "the batch's token count is its sequences'"
        );
        anyhow::ensure!(
            batch.fits_its_bucket(),
            "the scheduler handed over a batch larger than its bucket: {tokens} tokens in {} \
             sequences for {:?}",
            batch.seqs.len(),
            batch.bucket
        );
        self.log.lock().push(Record {
            engine: self.id,
            seqs: batch.seqs.iter().map(|s| s.ids.to_vec()).collect(),
            chunk_starts: batch
                .seqs
                .iter()
                .map(|s| s.chunk.map(|c| c.start))
                .collect(),
            bucket: batch.bucket,
            tokens: batch.tokens,
        });
        let first_ids: Vec<u32> = batch.seqs.iter().map(|s| s.ids[0]).collect();
        if first_ids.contains(&GATE_MARK) {
            self.gate.wait();
        }
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        if first_ids.contains(&FAIL_MARK) {
            anyhow::bail!("mock failure");
        }
        if first_ids.contains(&FATAL_MARK) {
            return Err(
                anyhow::Error::new(FatalEngineError("mock device lost".into()))
                    .context("running the batch"),
            );
        }
        if first_ids.contains(&PANIC_MARK) {
            panic!("mock panic");
        }
        let mut out: Vec<Vec<f32>> = batch
            .seqs
            .iter()
            .map(|s| answer_or_carry(s, &self.carries))
            .collect();
        if first_ids.contains(&SHORT_MARK) {
            out.pop();
        }
        Ok(out)
    }
}

/// The mock's work on one sequence: [`expected`] of a whole question; for a chunk, the hash
/// resumed from what the previous chunk left in the carry, then the answer (last chunk) or the
/// hash left for the next one (no probabilities).
fn answer_or_carry(s: &SeqInput<'_>, carries: &Arc<Mutex<CarryLog>>) -> Vec<f32> {
    let Some(chunk) = s.chunk else {
        return expected(s.ids, s.n_options);
    };
    let (at, hash) = match chunk.carry.take() {
        Some(held) => {
            let held = held.downcast::<MockCarry>().expect("the mock's own carry");
            (held.at, held.hash)
        }
        None => (0, FNV_START),
    };
    assert_eq!(
        at, chunk.start,
        "a chunk resumes where the previous one ended"
    );
    let h = fnv(hash, s.ids);
    if chunk.last {
        return weights(h, s.n_options);
    }
    carries.lock().put += 1;
    chunk.carry.put(Box::new(MockCarry {
        at: chunk.start + s.ids.len(),
        hash: h,
        log: Arc::clone(carries),
    }));
    Vec::new()
}

const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

fn fnv(mut h: u64, ids: &[u32]) -> u64 {
    for &id in ids {
        h ^= u64::from(id);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The mock's answer: option weights from a hash of all the ids, normalised.
pub fn expected(ids: &[u32], n_options: usize) -> Vec<f32> {
    weights(fnv(FNV_START, ids), n_options)
}

fn weights(h: u64, n_options: usize) -> Vec<f32> {
    let weights: Vec<f32> = (0..n_options)
        .map(|k| 1.0 + ((h >> ((k * 7) % 57)) & 0xff) as f32)
        .collect();
    let sum: f32 = weights.iter().sum();
    weights.iter().map(|w| w / sum).collect()
}

/// A question tagged `tag` (its first id) of `len` tokens.
pub fn question(tag: u32, len: usize, n_options: usize) -> Question {
    let ids = std::iter::once(tag)
        .chain((1..len as u32).map(|i| tag.wrapping_mul(2_654_435_761).wrapping_add(i) % 150_000))
        .collect();
    Question::text(ids, n_options)
}

pub fn expected_answer(questions: &[Question]) -> Vec<Vec<f32>> {
    questions
        .iter()
        .map(|q| expected(&q.ids, q.n_options))
        .collect()
}

/// A deterministic pseudo-random sequence (no dependency needed for tests).
pub struct Lcg(pub u64);

impl Lcg {
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

pub struct Harness {
    pub scheduler: Scheduler,
    pub log: Log,
    pub gate: Arc<Gate>,
    pub carries: Arc<Mutex<CarryLog>>,
}

impl Harness {
    pub fn new(config: Config, engines: usize, delay: Duration) -> Self {
        let log = Log::default();
        let gate = Arc::new(Gate::default());
        let carries = Arc::default();
        let engines: Vec<Box<dyn Engine>> = (0..engines)
            .map(|id| {
                Box::new(MockEngine {
                    id,
                    delay,
                    log: Arc::clone(&log),
                    gate: Arc::clone(&gate),
                    carries: Arc::clone(&carries),
                }) as Box<dyn Engine>
            })
            .collect();
        let scheduler = Scheduler::start(config, engines).expect("scheduler starts");
        Self {
            scheduler,
            log,
            gate,
            carries,
        }
    }

    /// Waits until every carry the engines left is dropped; the threads that dropped them.
    pub fn carries_dropped(&self, within: Duration) -> Vec<String> {
        let until = Instant::now() + within;
        loop {
            {
                let log = self.carries.lock();
                if log.dropped_on.len() == log.put {
                    return log.dropped_on.clone();
                }
                assert!(
                    Instant::now() < until,
                    "{} of {} carries dropped",
                    log.dropped_on.len(),
                    log.put
                );
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Submits every request (each must be admitted); their tickets, in order.
    pub fn submit_all(&self, requests: &[Vec<Question>]) -> Vec<Ticket> {
        requests
            .iter()
            .map(|q| self.scheduler.submit(q.clone(), None).expect("admitted"))
            .collect()
    }

    /// Runs `requests` with every one queued before the engine starts on them (the engine held
    /// while they are submitted): their answers, in order.
    pub fn run_queued(&self, requests: &[Vec<Question>]) -> Vec<Vec<Vec<f32>>> {
        let blocker = self.block_engine();
        let tickets = self.submit_all(requests);
        self.gate.open();
        wait(blocker, LONG).unwrap();
        tickets
            .into_iter()
            .map(|t| wait(t, LONG).unwrap())
            .collect()
    }

    /// Submits a one-question request that holds engine 0 until the gate opens, and returns once
    /// the engine is running it.
    pub fn block_engine(&self) -> Ticket {
        self.hold_engine_with(question(GATE_MARK, 4, 2))
    }

    /// Submits `gated` (its first id the gate's mark: the batch that runs it, or its first
    /// chunk, waits for the gate) alone, and returns once engine 0 is running it.
    pub fn hold_engine_with(&self, gated: Question) -> Ticket {
        assert_eq!(gated.ids[0], GATE_MARK);
        let ticket = self
            .scheduler
            .submit(vec![gated], None)
            .expect("the gated request admitted");
        let until = Instant::now() + Duration::from_secs(5);
        while self.scheduler.stats().engines[0].busy_since.is_none() {
            assert!(
                Instant::now() < until,
                "engine never started the gated request"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        ticket
    }

    /// Batches recorded so far, without the blocker's.
    pub fn batches(&self) -> Vec<Record> {
        self.log
            .lock()
            .iter()
            .filter(|r| !r.tags().contains(&GATE_MARK))
            .cloned()
            .collect()
    }

    /// Index (among `batches()`) of the batch that ran the question tagged `tag`.
    pub fn batch_of(&self, tag: u32) -> Option<usize> {
        self.batches().iter().position(|r| r.tags().contains(&tag))
    }

    /// How many times the question tagged `tag` was given to an engine.
    pub fn times_computed(&self, tag: u32) -> usize {
        self.log
            .lock()
            .iter()
            .flat_map(|r| r.tags())
            .filter(|&t| t == tag)
            .count()
    }
}

/// Awaits a ticket with a time limit (the test fails if it takes longer); the probabilities.
pub fn wait(ticket: Ticket, within: Duration) -> Result<Vec<Vec<f32>>, Failure> {
    wait_answer(ticket, within).map(|a| a.probabilities)
}

/// Awaits a ticket with a time limit (the test fails if it takes longer).
pub fn wait_answer(ticket: Ticket, within: Duration) -> Result<Answer, Failure> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("tokio runtime");
    rt.block_on(async { tokio::time::timeout(within, ticket).await })
        .expect("ticket resolved in time")
}

pub const LONG: Duration = Duration::from_secs(10);
