//! Captured passes (CUDA graphs): a pass's layers, recorded once per [`PassShape`] and
//! replayed for every later batch of that shape, so a short pass costs one launch on the host
//! instead of some 300 kernel and GEMM launches.
//!
//! A shape's first batch runs as launched (that also times its GEMMs and sizes the scratch for
//! it); its layers are then recorded without running (stream capture) for the next batch. While
//! a capture runs, [`CaptureGuard`] refuses what a recording cannot hold: allocating, copying
//! through the host, waiting. A capture that fails is dropped with its reason, and that shape runs
//! as launched until the scratch is next replaced (then it is tried again). A graph holds the addresses of the scratch it was recorded with, so
//! scratch that is replaced later (a larger batch) makes every graph stale: it is recaptured.

use super::lock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaContext, CudaGraph, CudaStream};

use super::device::driver_err;
use crate::backend::{KernelResult, PassShape};
use crate::error::KernelError;

/// Whether a capture is running, and the generation of the buffers captures may hold.
#[derive(Default)]
pub(crate) struct CaptureGuard {
    capturing: AtomicBool,
    generation: AtomicU64,
}

impl CaptureGuard {
    /// Refuses `op` while a capture runs: it would allocate, copy through the host or wait, and a
    /// recorded pass cannot hold that.
    pub fn refuse(&self, op: &'static str) -> KernelResult<()> {
        if self.capturing.load(Ordering::Relaxed) {
            return Err(KernelError::invalid(
                op,
                "not allowed while a pass is being captured",
            ));
        }
        Ok(())
    }

    /// Scratch that captures may have recorded was replaced (or is about to be): they are stale.
    /// Refused while a capture runs.
    pub fn replace(&self, op: &'static str) -> KernelResult<()> {
        self.refuse(op)?;
        self.generation.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    fn set_capturing(&self, on: bool) {
        self.capturing.store(on, Ordering::Relaxed);
    }
}

/// The most graphs one backend holds (~1.3 MB of device memory each for Qwen3.5-4B, so at most
/// ~0.65 GB): past it, the one replayed least recently goes. Shapes multiply (rows in steps of 8 ×
/// sequences × what they carry: 177 under the upstream mix with rows in steps of 16 and 32), and a
/// fleet's traffic uses few of them most of the time.
pub(crate) const MAX_GRAPHS: usize = 512;

/// A graph kept for replay.
struct Held {
    graph: SendGraph,
    /// The [`CaptureGuard`] generation it was recorded in.
    generation: u64,
    /// Device bytes it took (approximate: see [`GraphStats::bytes`]).
    bytes: u64,
    /// When it was last captured or replayed ([`State::tick`]).
    used: u64,
}

/// The shape of the graph used least recently, among `held` (shape, last use).
fn least_recent(held: impl Iterator<Item = (PassShape, u64)>) -> Option<PassShape> {
    held.min_by_key(|&(shape, used)| (used, shape))
        .map(|(shape, _)| shape)
}

/// A captured graph, moved between threads with its backend.
struct SendGraph(CudaGraph);

// SAFETY: the graph's handles are plain driver objects, valid from any thread that binds their
// context (cudarc binds it on every call); `Graphs` only touches them under its lock, so no two
// threads launch or destroy one at once.
unsafe impl Send for SendGraph {}
unsafe impl Sync for SendGraph {}

/// What the captures did since start (for metrics and logs).
#[derive(Clone, Debug, Default)]
pub struct GraphStats {
    /// The shapes whose graphs are held now.
    pub held: Vec<PassShape>,
    /// Replays per shape.
    pub replays: Vec<(PassShape, u64)>,
    /// Passes of a captured-size shape that ran as launched (its first batch, a shape whose
    /// capture failed, a stale graph).
    pub misses: u64,
    /// Captures made (recaptures of stale graphs included) and the time they took.
    pub captures: u64,
    pub capture_seconds: f64,
    /// Device memory the held graphs took when instantiated (the drop in free memory around
    /// each, so approximate).
    pub bytes: u64,
    /// Shapes whose capture failed (run as launched until their scratch is replaced, then tried
    /// again), and the last reason.
    pub failed: usize,
    pub last_failure: Option<String>,
    /// Graphs dropped to stay within [`MAX_GRAPHS`].
    pub evictions: u64,
}

/// The counts of several backends on one device (the text and screenshot language copies): shapes
/// held by both are listed once per backend, replays of one shape added up.
impl std::iter::Sum for GraphStats {
    fn sum<I: Iterator<Item = Self>>(all: I) -> Self {
        let mut total = Self::default();
        for s in all {
            total.held.extend(s.held);
            for (shape, n) in s.replays {
                match total.replays.iter_mut().find(|(t, _)| *t == shape) {
                    Some((_, m)) => *m += n,
                    None => total.replays.push((shape, n)),
                }
            }
            total.misses += s.misses;
            total.captures += s.captures;
            total.capture_seconds += s.capture_seconds;
            total.bytes += s.bytes;
            total.failed += s.failed;
            total.last_failure = s.last_failure.or(total.last_failure);
            total.evictions += s.evictions;
        }
        total.held.sort();
        total.replays.sort();
        total
    }
}

#[derive(Default)]
struct State {
    held: HashMap<PassShape, Held>,
    /// Counts graph uses, to order them by recency.
    tick: u64,
    replays: HashMap<PassShape, u64>,
    /// Shapes whose capture failed, with why and the generation it failed in: tried again once
    /// the generation moves on (their scratch was replaced), run as launched until then.
    failed: HashMap<PassShape, (String, u64)>,
    stats: GraphStats,
}

/// The graphs of one backend, by shape.
pub(crate) struct Graphs {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    state: Arc<Mutex<State>>,
}

/// Reads a backend's [`GraphStats`] from any thread (for metrics); cheap to clone.
#[derive(Clone)]
pub struct GraphProbe {
    state: Arc<Mutex<State>>,
}

impl GraphProbe {
    pub fn stats(&self) -> GraphStats {
        let state = lock(&self.state);
        let mut stats = state.stats.clone();
        stats.held = state.held.keys().copied().collect();
        stats.held.sort();
        stats.failed = state.failed.len();
        stats.replays = state.replays.iter().map(|(&s, &n)| (s, n)).collect();
        stats.replays.sort();
        stats
    }
}

impl Graphs {
    /// Graphs on `stream`, which must be a stream of its own (the legacy default stream cannot
    /// be captured) with event tracking off (events recorded outside a capture cannot be waited
    /// on inside it).
    pub fn new(ctx: Arc<CudaContext>, stream: Arc<CudaStream>) -> Self {
        Self {
            ctx,
            stream,
            state: Arc::default(),
        }
    }

    pub fn probe(&self) -> GraphProbe {
        GraphProbe {
            state: self.state.clone(),
        }
    }

    /// Runs `layers` at `shape`: replays its graph, or runs it and then captures it.
    pub fn run(
        &self,
        shape: PassShape,
        guard: &CaptureGuard,
        layers: &mut dyn FnMut() -> KernelResult<()>,
    ) -> KernelResult<()> {
        {
            let mut state = lock(&self.state);
            state.tick += 1;
            let tick = state.tick;
            if let Some(held) = state.held.get_mut(&shape) {
                if held.generation == guard.generation() {
                    held.used = tick;
                    held.graph
                        .0
                        .launch()
                        .map_err(|e| driver_err("replaying a captured pass", e))?;
                    *state.replays.entry(shape).or_default() += 1;
                    return Ok(());
                }
                let bytes = held.bytes;
                state.held.remove(&shape);
                state.stats.bytes = state.stats.bytes.saturating_sub(bytes);
            }
            state.stats.misses += 1;
            match state.failed.get(&shape) {
                Some((_, generation)) if *generation == guard.generation() => {
                    drop(state);
                    return layers();
                }
                Some(_) => {
                    state.failed.remove(&shape);
                }
                None => {}
            }
        }
        layers()?;
        self.capture(shape, guard, layers)
    }

    /// Records `layers` at `shape` for later batches. Only a lost device is an error: any other
    /// failure leaves the shape to run as launched, its reason kept.
    fn capture(
        &self,
        shape: PassShape,
        guard: &CaptureGuard,
        layers: &mut dyn FnMut() -> KernelResult<()>,
    ) -> KernelResult<()> {
        let t0 = Instant::now();
        let generation = guard.generation();
        let free_before = self.free_bytes();
        let recorded = self.record(guard, layers).and_then(|graph| {
            graph
                .upload()
                .map_err(|e| driver_err("uploading a captured pass", e))?;
            Ok(graph)
        });
        let mut state = lock(&self.state);
        state.stats.capture_seconds += t0.elapsed().as_secs_f64();
        match recorded {
            Ok(graph) => {
                let bytes = free_before.saturating_sub(self.free_bytes());
                state.stats.captures += 1;
                while state.held.len() >= MAX_GRAPHS {
                    let held = state.held.iter().map(|(&s, h)| (s, h.used));
                    let Some(oldest) = least_recent(held) else {
                        break;
                    };
                    if let Some(gone) = state.held.remove(&oldest) {
                        state.stats.bytes = state.stats.bytes.saturating_sub(gone.bytes);
                        state.stats.evictions += 1;
                    }
                }
                state.stats.bytes += bytes;
                state.tick += 1;
                let held = Held {
                    graph: SendGraph(graph),
                    generation,
                    bytes,
                    used: state.tick,
                };
                state.held.insert(shape, held);
                tracing::debug!(
                    rows = shape.rows,
                    seqs = shape.seqs,
                    ms = t0.elapsed().as_secs_f64() * 1e3,
                    bytes,
                    "pass captured"
                );
                Ok(())
            }
            Err(KernelError::DeviceLost(why)) => Err(KernelError::DeviceLost(why)),
            Err(e) => {
                let why = format!("{} rows × {} sequences: {e}", shape.rows, shape.seqs);
                tracing::warn!(
                    "a pass could not be captured; its shape runs as launched until the scratch is next \
                     replaced: {why}"
                );
                state.stats.last_failure = Some(why.clone());
                state.failed.insert(shape, (why, generation));
                Ok(())
            }
        }
    }

    /// One capture of `layers` (nothing runs), instantiated.
    fn record(
        &self,
        guard: &CaptureGuard,
        layers: &mut dyn FnMut() -> KernelResult<()>,
    ) -> KernelResult<CudaGraph> {
        // Thread-local: other threads of the process (a vision tower on its own backend) may
        // still allocate while this one records.
        self.stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| driver_err("beginning a capture", e))?;
        let recording = Recording {
            guard,
            stream: &self.stream,
        };
        guard.set_capturing(true);
        let body = layers();
        // Always ended, so the stream leaves capture mode whatever the body did.
        std::mem::forget(recording);
        guard.set_capturing(false);
        let ended = self.stream.end_capture(CUgraphInstantiate_flags(0));
        body?;
        ended
            .map_err(|e| driver_err("ending a capture", e))?
            .ok_or_else(|| KernelError::Backend("the capture recorded nothing".into()))
    }

    fn free_bytes(&self) -> u64 {
        self.ctx.mem_get_info().map_or(0, |(free, _)| free as u64)
    }
}

/// A capture in progress. Dropped only if its body panics (a normal end forgets it): the stream
/// then leaves capture mode and the guard lets allocations through again, so the engine that
/// catches the panic can go on with the next batch.
struct Recording<'a> {
    guard: &'a CaptureGuard,
    stream: &'a Arc<CudaStream>,
}

impl Drop for Recording<'_> {
    fn drop(&mut self) {
        self.guard.set_capturing(false);
        // The graph of a capture cut short is discarded.
        let _ = self.stream.end_capture(CUgraphInstantiate_flags(0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_graph_used_least_recently_goes_first() {
        let shape = |rows| PassShape {
            rows,
            seqs: 1,
            ..PassShape::default()
        };
        let held = [(shape(16), 5), (shape(32), 2), (shape(48), 9)];
        assert_eq!(least_recent(held.into_iter()), Some(shape(32)));
        assert_eq!(least_recent(std::iter::empty()), None);
    }
}
