//! GEMMs through cuBLASLt: bf16 operands, f32 accumulation, f32 output (or bf16, for an output
//! whose only reader rounds it to bf16 anyway: the MLP's gate|up, read by SwiGLU). An f32 output
//! may instead be added to (`Store::Add`: the residual stream, in place, by the GEMM's epilogue).
//! The epilogue may also add a bias, or add one and apply the tanh GELU ([`Epilogue`]: the vision
//! tower's, where each such pass over the output would otherwise read and write it once more).
//!
//! Activations are f32 in this backend, so `y = x Wᵀ` first rounds `x` to bf16 into a scratch
//! buffer (as a bf16 model's activations are), then runs one cuBLASLt matmul against the bf16
//! weight. A plan (descriptors plus the algorithm the heuristic picked) is built once per shape and
//! reused; the workspace is allocated once.
//!
//! Batch invariance (default, `CudaOptions::batch_invariant`): every row count of a shape sums each
//! output in one order. A shape's *reference* is the heuristic's first pick at `REFERENCE_ROWS`
//! rows that splits no K; a row bucket times only candidates (the reference, and its heuristic
//! picks with the K split removed) whose output equals the reference's bit for bit on the real
//! operands, at the bucket's first and smallest row counts. docs/validation/batch-invariance.md.

use super::lock;
use std::collections::HashMap;
use std::ffi::c_void;
use std::mem::size_of;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use half::bf16;

use super::buffers::OutBuf;
use super::device::driver_err;
use super::graphs::CaptureGuard;
use super::tuning::{splits_no_k, without_split, TuningFile};
use crate::backend::{KernelResult, Store};
use crate::error::KernelError;

/// cuBLASLt's recommended workspace on Hopper (also enough elsewhere).
const WORKSPACE_BYTES: usize = 32 << 20;
/// Algorithms the heuristic proposes per shape; each is timed once per row bucket and the fastest
/// kept (the heuristic's first pick is often not the best for skinny GEMMs, one short question's).
const CANDIDATES: usize = 8;
/// Timed runs per candidate (after one untimed run), in rounds over all candidates; a candidate's
/// time is its fastest run. Three runs of each candidate back to back picked different winners in
/// two processes on one H100 (12.3 against 10.9 ms for a 648-row forward): in rounds, a clock
/// ramping up or a slow moment costs every candidate alike, and the fastest run of a kernel with
/// a fixed amount of work is the one least disturbed.
const TUNING_RUNS: usize = 5;
/// Shapes whose plans are kept; serving sees one shape per distinct batch row count, so the map is
/// bounded and simply rebuilt when full.
const MAX_PLANS: usize = 4096;
/// The row count at which a shape's batch-invariant reference algorithm is asked of the heuristic:
/// a large batch's (where throughput is decided), so the reference is a kernel built for it.
const REFERENCE_ROWS: usize = 4096;
/// Rows of a candidate's output compared with the reference's when a bucket is timed. Another
/// summation order changes nearly every value of a row (on the H200, 17,696 of 17,920 at 7 rows),
/// so the first rows tell; reading back whole outputs (up to 600 MB at 16,384 rows) made the first
/// start on a GPU warm up in 89 s instead of 3 s. The read-backs go through pageable memory, one
/// after the other: with 32 rows (up to 2.4 MB a check) they were 14.4 s of the 22 s an H100's
/// first start spent timing its ~270 exact buckets, so 8 rows.
const COMPARED_ROWS: usize = 8;
/// Heuristic results searched for the reference (the first that splits no K is taken).
const REFERENCE_SEARCH: usize = 16;

/// A short name of an algorithm (a hash of its opaque bytes), so that logs of tunings at other
/// row counts can tell the same algorithm.
fn algo_tag(algo: &sys::cublasLtMatmulAlgo_t) -> String {
    let hash = algo.data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &word| {
        (h ^ word).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{:08x}", hash >> 32)
}

fn blas_err(op: &str, e: lt::CublasError) -> KernelError {
    KernelError::Backend(format!("{op}: cuBLASLt {e:?}"))
}

/// Where a GEMM's bf16 input comes from.
pub(crate) enum GemmInput<'a, F> {
    /// Written into the scratch buffer by `F` (a conversion or a fused producer).
    Convert(F),
    /// Already in a bf16 buffer of at least `rows · in_dim` values.
    Ready(&'a CudaSlice<bf16>),
}

/// What a GEMM's epilogue does to the product besides storing it (`Store` says replace or add).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Epilogue {
    /// Nothing.
    None,
    /// `+ bias[col]`: an f32 bias (device pointer) to an f32 output (added to it or not). The
    /// sum is `(product + bias) + y` where it adds: the order of a bias pass then a residual add.
    Bias(u64),
    /// `gelu_tanh(product + bias[col])`: a bf16 bias (device pointer) to a bf16 output. cuBLASLt's
    /// GELU, not the same bits as the `bias_gelu` kernel's (docs/validation/cuda-ops.md).
    GeluBias(u64),
}

impl Epilogue {
    /// The epilogue without its pointer, as shapes and tuning files key it (0: none).
    pub(crate) fn tag(self) -> u8 {
        match self {
            Self::None => 0,
            Self::Bias(_) => 1,
            Self::GeluBias(_) => 2,
        }
    }

    fn bias(self) -> Option<u64> {
        match self {
            Self::None => None,
            Self::Bias(bias) | Self::GeluBias(bias) => Some(bias),
        }
    }
}

/// Descriptors and algorithm of one GEMM shape.
struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    w_layout: sys::cublasLtMatrixLayout_t,
    x_layout: sys::cublasLtMatrixLayout_t,
    y_layout: sys::cublasLtMatrixLayout_t,
    /// The algorithm in use: the heuristic's first choice until the shape is timed.
    algo: sys::cublasLtMatmulAlgo_t,
    /// The heuristic's candidates, timed on the shape's first real call.
    candidates: Vec<sys::cublasLtMatmulAlgo_t>,
    tuned: bool,
    /// Batch-invariant mode: only candidates giving this algorithm's bits are timed (`None`: any).
    reference: Option<sys::cublasLtMatmulAlgo_t>,
    /// How long building it took (the heuristic's search, the reference's checks): logged when the
    /// shape is timed.
    built_in: std::time::Duration,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each handle was created by this plan and is destroyed once; errors at tear-down
        // have no one to report to.
        unsafe {
            let _ = lt::destroy_matmul_desc(self.desc);
            let _ = lt::destroy_matrix_layout(self.w_layout);
            let _ = lt::destroy_matrix_layout(self.x_layout);
            let _ = lt::destroy_matrix_layout(self.y_layout);
        }
    }
}

/// Shape key: (rows, in_dim, out_dim, bf16 output, adds to the output, epilogue tag).
type Shape = (usize, usize, usize, bool, bool, u8);
/// A shape without its rows (the batch-invariant reference is one per family).
type Family = (usize, usize, bool, bool, u8);
/// The rows of a tuning file's line holding a family's reference (no bucket has them).
const REFERENCE_LINE_ROWS: usize = 0;

/// Up to this many rows (unless `INSTINCT_GEMM_EXACT_ROWS` says otherwise: [`exact_rows`]),
/// every multiple of [`EXACT_STEP`] is a bucket of its own: the row counts captured passes are
/// padded to, so each captured shape runs the winner timed at its own rows.
const EXACT_UP_TO: usize = 2048;
/// The step of the exact buckets (the captured passes' row padding, `captured_shape`).
const EXACT_STEP: usize = 8;
/// Above the exact buckets, buckets are multiples of this up to `FINE_BUCKETS_UP_TO` rows.
const BUCKET_STEP: usize = 128;
/// Above this, buckets are powers of two again (a tile row more or less matters little there).
const FINE_BUCKETS_UP_TO: usize = 4096;

/// The row count up to which every multiple of 8 is a tuning bucket: `INSTINCT_GEMM_EXACT_ROWS`
/// (rounded down to a multiple of 128, at most 4,096; 0 makes the buckets 128 rows wide from 129
/// rows, as before the exact ones), else 2,048. Exact buckets make a first start on a GPU time
/// ~270 row counts instead of ~40 (ready after 27 s instead of 11 on an H100); the winners are
/// kept in the tuning file, so later starts time nothing.
pub(crate) fn exact_rows() -> usize {
    static ROWS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *ROWS.get_or_init(|| {
        let Ok(value) = std::env::var("INSTINCT_GEMM_EXACT_ROWS") else {
            return EXACT_UP_TO;
        };
        match value.trim().parse::<usize>() {
            Ok(rows) => rows.min(FINE_BUCKETS_UP_TO) / BUCKET_STEP * BUCKET_STEP,
            Err(_) => {
                tracing::warn!(
                    value,
                    default = EXACT_UP_TO,
                    "INSTINCT_GEMM_EXACT_ROWS is not a row count; the default is used"
                );
                EXACT_UP_TO
            }
        }
    })
}

/// The row count a tuning result is shared across (the top of the bucket `rows` falls in). Serving
/// sees a new total row count with almost every batch; timing candidates for each would put the
/// tuning cost on requests, so each bucket is timed once (at start-up: `warm_rows`, then kept in
/// the tuning file) and its winner reused. Powers of two up to 8 rows, then every multiple of 8
/// up to [`exact_rows`] (the captured row counts), then multiples of 128 up to 4,096 (powers of
/// two up to 128 where the exact buckets are off), then powers of two.
/// The best kernel moves with the row count: the GEMM tiles are 64 to 256 rows tall and a pass
/// fills 132 SMs in waves, so one more tile row can cost a wave. With 128-row buckets each timed
/// at its top, an H100 forward of one question took 7-16% longer at 304-904 ids than with the
/// winners timed at its own rows, 4-6% at 1,048-1,704 ids and 1-2% at 2,248-3,304 ids
/// (docs/benchmarks/gpu-calls/2026-12-06-exact-buckets-h100/, tools/reference/gemm_bucket_cost.sh).
pub(crate) fn row_bucket(rows: usize) -> usize {
    bucket_with(rows, exact_rows())
}

/// [`row_bucket`] with exact buckets up to `exact` rows (a multiple of 128).
fn bucket_with(rows: usize, exact: usize) -> usize {
    if rows <= EXACT_STEP || rows > FINE_BUCKETS_UP_TO {
        rows.next_power_of_two()
    } else if rows <= exact {
        rows.div_ceil(EXACT_STEP) * EXACT_STEP
    } else if rows <= BUCKET_STEP {
        rows.next_power_of_two()
    } else {
        rows.div_ceil(BUCKET_STEP) * BUCKET_STEP
    }
}

/// The smallest row count of `rows`' bucket (see [`row_bucket`]).
pub(crate) fn bucket_floor(rows: usize) -> usize {
    floor_with(rows, exact_rows())
}

/// [`bucket_floor`] with exact buckets up to `exact` rows.
fn floor_with(rows: usize, exact: usize) -> usize {
    let top = bucket_with(rows, exact);
    let below = if top <= EXACT_STEP || top > FINE_BUCKETS_UP_TO {
        top / 2
    } else if top <= exact {
        top - EXACT_STEP
    } else if top <= BUCKET_STEP {
        top / 2
    } else {
        top - BUCKET_STEP
    };
    below + 1
}

struct State {
    plans: HashMap<Shape, Option<Plan>>,
    /// The fastest algorithm per (row bucket, in_dim, out_dim), timed on the bucket's first shape.
    tuned: HashMap<Shape, sys::cublasLtMatmulAlgo_t>,
    /// Batch-invariant mode: each family's reference (`None`: no unsplit algorithm).
    references: HashMap<Family, Option<sys::cublasLtMatmulAlgo_t>>,
    /// `x` rounded to bf16; grows to the largest GEMM input seen (sized at warm-up).
    scratch: Option<CudaSlice<bf16>>,
}

/// A cuBLASLt handle, its workspace and the plans built so far.
pub(crate) struct Blas {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    stream: Arc<CudaStream>,
    state: Mutex<State>,
    /// Where the timed winners are kept across starts (`None`: not kept).
    tuning_file: Option<TuningFile>,
    /// Shapes timed since start (the rest took a stored or earlier winner).
    tunings: AtomicUsize,
    /// Whether each row's output must not depend on the GEMM's row count (see the module doc).
    batch_invariant: bool,
    /// Refuses tuning and scratch growth while a pass is captured (shared with the workspace).
    capture: Arc<CaptureGuard>,
}

// SAFETY: the handle and plan descriptors are used only under `state`'s lock or by `&self` calls that
// enqueue on the one stream; cuBLASLt handles may be used from any thread.
unsafe impl Send for Blas {}
unsafe impl Sync for Blas {}

impl Drop for Blas {
    fn drop(&mut self) {
        if let Ok(state) = self.state.get_mut() {
            state.plans.clear();
        }
        // SAFETY: created in `new`, destroyed once, after every plan using it.
        unsafe {
            let _ = lt::destroy_handle(self.handle);
        }
    }
}

impl Blas {
    /// A handle and workspace on `stream`; the winners stored in `tuning_file` (if any) are used
    /// instead of timing those shapes again, and new winners are added to it. With
    /// `batch_invariant`, every row count of a shape sums in one order (see the module doc).
    pub fn new(
        stream: Arc<CudaStream>,
        tuning_file: Option<TuningFile>,
        batch_invariant: bool,
        capture: Arc<CaptureGuard>,
    ) -> KernelResult<Self> {
        let handle = lt::create_handle().map_err(|e| blas_err("cublasLtCreate", e))?;
        // SAFETY: a plain byte buffer only cuBLASLt writes.
        let workspace = unsafe { stream.alloc::<u8>(WORKSPACE_BYTES) }
            .map_err(|e| driver_err("cuBLASLt workspace", e))?;
        let blas = Self {
            handle,
            workspace,
            stream,
            state: Mutex::new(State {
                plans: HashMap::new(),
                tuned: HashMap::new(),
                references: HashMap::new(),
                scratch: None,
            }),
            tuning_file,
            tunings: AtomicUsize::new(0),
            batch_invariant,
            capture,
        };
        blas.reload_winners();
        Ok(blas)
    }

    /// Takes up the winners (and references) the tuning file holds that this handle has not
    /// timed or read yet: at start, and before a warm-up, after another copy on the device stored
    /// its own. Shapes planned already keep their algorithm.
    pub fn reload_winners(&self) {
        let Some(file) = &self.tuning_file else {
            return;
        };
        let stored = file.load();
        let mut state = lock(&self.state);
        for ((rows, in_dim, out_dim, bf16_out, add, epilogue), data) in stored {
            let algo = sys::cublasLtMatmulAlgo_t { data };
            if rows == REFERENCE_LINE_ROWS {
                // Only a batch-invariant file has these lines (its identity says so).
                state
                    .references
                    .entry((in_dim, out_dim, bf16_out, add, epilogue))
                    .or_insert(Some(algo));
            } else {
                state
                    .tuned
                    .entry((rows, in_dim, out_dim, bf16_out, add, epilogue))
                    .or_insert(algo);
            }
        }
    }

    /// Whether this backend runs batch-invariant (GEMMs here; the other ops ask this too).
    pub fn batch_invariant(&self) -> bool {
        self.batch_invariant
    }

    /// The identity a tuning file is kept under: the same GPU model, driver and cuBLASLt, timed
    /// the same way (and under the same batch-invariance rule), make the same picks valid. The
    /// mode-off identity is the one files had before the mode existed.
    pub fn tuning_identity(gpu_name: &str, arch: &str, batch_invariant: bool) -> String {
        let mut driver = 0;
        // SAFETY: writes one int; the driver library is loaded (the context is open).
        let _ = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver) };
        // SAFETY: a plain query of the loaded cuBLASLt.
        let cublaslt = unsafe { sys::cublasLtGetVersion() };
        let exact = exact_rows();
        let invariant = if batch_invariant {
            format!(" batch-invariant=v1 reference-rows={REFERENCE_ROWS}")
        } else {
            String::new()
        };
        format!(
            "gpu={gpu_name} arch={arch} driver={driver} cublaslt={cublaslt} candidates={CANDIDATES} runs={TUNING_RUNS} buckets={EXACT_STEP}-{exact}/{BUCKET_STEP}-{FINE_BUCKETS_UP_TO} compared={COMPARED_ROWS}{invariant}"
        )
    }

    /// Whether every shape with a winner at `like`'s row bucket has one at `rows`' bucket too
    /// (and there is at least one).
    pub fn has_winners_like(&self, rows: usize, like: usize) -> bool {
        let state = lock(&self.state);
        let (bucket, like) = (row_bucket(rows), row_bucket(like));
        let mut shapes = state.tuned.keys().filter(|k| k.0 == like).peekable();
        shapes.peek().is_some()
            && shapes.all(|&(_, i, o, bf16_out, add, epilogue)| {
                state
                    .tuned
                    .contains_key(&(bucket, i, o, bf16_out, add, epilogue))
            })
    }

    /// Shapes timed since start.
    pub fn tunings(&self) -> usize {
        self.tunings.load(Ordering::Relaxed)
    }

    /// The file the timed winners are kept in, if any.
    pub fn tuning_path(&self) -> Option<&Path> {
        self.tuning_file.as_ref().map(TuningFile::path)
    }

    /// Device bytes held: the workspace and the input scratch.
    pub fn bytes(&self) -> u64 {
        let state = lock(&self.state);
        let scratch = state.scratch.as_ref().map_or(0, |s| 2 * s.len());
        (WORKSPACE_BYTES + scratch) as u64
    }

    /// Makes room for `values` bf16 activation values, so no GEMM allocates later.
    pub fn reserve(&self, values: usize) -> KernelResult<()> {
        let mut state = lock(&self.state);
        self.scratch(&mut state, values).map(|_| ())
    }

    fn scratch<'a>(
        &self,
        state: &'a mut State,
        values: usize,
    ) -> KernelResult<&'a mut CudaSlice<bf16>> {
        let big_enough = state.scratch.as_ref().is_some_and(|s| s.len() >= values);
        if !big_enough {
            self.capture.replace("gemm scratch")?;
            state.scratch = None;
            let fresh = self
                .stream
                .alloc_zeros::<bf16>(values.max(1))
                .map_err(|e| driver_err("gemm scratch", e))?;
            state.scratch = Some(fresh);
        }
        Ok(state.scratch.as_mut().expect("just set"))
    }

    /// `y = x Wᵀ` (or `y += x Wᵀ`, as `store` says: f32 outputs only), `w: [out_dim, in_dim]`,
    /// reading a bf16 `x`: given ready, or written into the scratch by a `Convert` producer (which
    /// must write `rows·in_dim` values into the slice it gets); with `epilogue`'s bias (of
    /// `out_dim` values) and GELU applied on the way out.
    /// Returns `false` (and does nothing) when cuBLASLt has no algorithm for the shape (odd leading
    /// dimensions), so the caller can fall back. Conversion and matmul run under one lock, so
    /// concurrent callers never share the scratch buffer.
    pub fn gemm(
        &self,
        rows: usize,
        in_dim: usize,
        (w, out_dim, y): (&CudaSlice<bf16>, usize, OutBuf<'_>),
        (store, epilogue): (Store, Epilogue),
        input: GemmInput<'_, impl FnOnce(&mut CudaSlice<bf16>) -> KernelResult<()>>,
    ) -> KernelResult<bool> {
        const OP: &str = "gemm";
        let add = store == Store::Add;
        let bf16_out = y.is_bf16();
        if add && bf16_out {
            return Err(KernelError::invalid(
                OP,
                "only an f32 output can be added to",
            ));
        }
        match epilogue {
            Epilogue::Bias(_) if bf16_out => {
                return Err(KernelError::invalid(OP, "a bias epilogue writes f32"));
            }
            Epilogue::GeluBias(_) if !bf16_out => {
                return Err(KernelError::invalid(OP, "a GELU epilogue writes bf16"));
            }
            _ => {}
        }
        let mut state = lock(&self.state);
        let tag = epilogue.tag();
        let key = (rows, in_dim, out_dim, bf16_out, add, tag);
        // The tuning's key: the same shape with its rows' bucket.
        let bucket = (row_bucket(rows), in_dim, out_dim, bf16_out, add, tag);
        if !state.plans.contains_key(&key) {
            if state.plans.len() >= MAX_PLANS {
                state.plans.clear();
            }
            let building = std::time::Instant::now();
            let dims = (rows, in_dim, out_dim, bf16_out);
            let mut plan = self.plan(dims, epilogue, CANDIDATES)?;
            if let (true, Some(plan)) = (self.batch_invariant, plan.as_mut()) {
                let family = (in_dim, out_dim, bf16_out, add, tag);
                let reference = match state.references.get(&family) {
                    Some(reference) => *reference,
                    None => {
                        let reference = self.reference(in_dim, out_dim, bf16_out, epilogue)?;
                        state.references.insert(family, reference);
                        reference
                    }
                };
                // A reference cuBLASLt refuses on this exact shape leaves it batch-dependent
                // (today's rule); the validation doc lists this as what is not covered.
                if let Some(reference) = reference.filter(|r| self.accepts(plan, r)) {
                    self.restrict_to_reference(plan, reference);
                }
            }
            if let Some(plan) = plan.as_mut() {
                plan.built_in = building.elapsed();
            }
            if let (Some(plan), Some(algo)) = (plan.as_mut(), state.tuned.get(&bucket)) {
                // The bucket's winner, if cuBLASLt accepts it for this exact shape.
                if self.accepts(plan, algo) {
                    plan.algo = *algo;
                    plan.tuned = true;
                }
            }
            state.plans.insert(key, plan);
        }
        if state.plans[&key].is_none() {
            return Ok(false);
        }
        if matches!(input, GemmInput::Convert(_)) {
            self.scratch(&mut state, rows * in_dim)?;
        }
        let State {
            plans,
            tuned,
            references,
            scratch,
        } = &mut *state;
        let x: &CudaSlice<bf16> = match input {
            GemmInput::Convert(convert) => {
                let x = scratch.as_mut().expect("sized just above");
                convert(x)?;
                x
            }
            GemmInput::Ready(x) => x,
        };
        let stream = &self.stream;
        let (x_ptr, _x_rec) = x.device_ptr(stream);
        let (ws_ptr, _ws_rec) = self.workspace.device_ptr(stream);
        let plan = plans
            .get_mut(&key)
            .and_then(Option::as_mut)
            .expect("checked above");
        let (w_ptr, _w_rec) = w.device_ptr(stream);
        let (y_ptr, _y_rec) = match y {
            OutBuf::F32(y) => y.device_ptr_mut(stream),
            OutBuf::Bf16(y) => y.device_ptr_mut(stream),
        };
        let ptrs = [w_ptr, x_ptr, y_ptr, ws_ptr];
        if !plan.tuned {
            let check_rows = if plan.reference.is_some() {
                bucket_floor(rows)
            } else {
                rows
            };
            let dims = (rows, in_dim, out_dim, bf16_out, check_rows);
            self.tune(plan, ptrs, dims, (store, epilogue))?;
            self.tunings.fetch_add(1, Ordering::Relaxed);
            if tuned.len() >= MAX_PLANS {
                tuned.clear();
            }
            tuned.insert(bucket, plan.algo);
            if let Some(file) = &self.tuning_file {
                let reference_lines = references.iter().filter_map(|(&family, algo)| {
                    let (in_dim, out_dim, bf16_out, add, tag) = family;
                    let shape = (REFERENCE_LINE_ROWS, in_dim, out_dim, bf16_out, add, tag);
                    algo.map(|algo| (shape, algo.data))
                });
                let words = tuned
                    .iter()
                    .map(|(&shape, algo)| (shape, algo.data))
                    .chain(reference_lines)
                    .collect();
                // A file that cannot be written costs the next start its timing, nothing else.
                let _ = file.store(&words);
            }
        }
        // SAFETY: the pointers are this call's w [out, in], x [rows, in], y [rows, out] (lengths
        // checked by the caller), the workspace and the bias; all on `stream`.
        unsafe { self.run(plan, &plan.algo, ptrs, (store, epilogue)) }
            .map_err(|e| blas_err(OP, e))?;
        Ok(true)
    }

    /// One matmul with `algo`: `y = x Wᵀ` (or `y += x Wᵀ`, in place: cuBLASLt reads C and writes
    /// D at the same address with the same layout) over `[w, x, y, workspace]` device pointers,
    /// through the plan's epilogue with this call's bias.
    ///
    /// # Safety
    /// The pointers must hold the plan's shapes (the workspace WORKSPACE_BYTES, the bias the
    /// output's width), and `epilogue` must be the one the plan was built with.
    unsafe fn run(
        &self,
        plan: &Plan,
        algo: &sys::cublasLtMatmulAlgo_t,
        [w, x, y, ws]: [u64; 4],
        (store, epilogue): (Store, Epilogue),
    ) -> Result<(), lt::CublasError> {
        if let Some(bias) = epilogue.bias() {
            // The plan is shared by every call of its shape (the tower's 24 blocks): the pointer
            // is set for each, under the state lock the caller holds.
            set_bias_pointer(plan.desc, bias)?;
        }
        let alpha = 1.0f32;
        let beta = match store {
            Store::Replace => 0.0f32,
            Store::Add => 1.0,
        };
        lt::matmul(
            self.handle,
            plan.desc,
            (&alpha) as *const f32 as *const c_void,
            (&beta) as *const f32 as *const c_void,
            w as *const c_void,
            plan.w_layout,
            x as *const c_void,
            plan.x_layout,
            y as *const c_void,
            plan.y_layout,
            y as *mut c_void,
            plan.y_layout,
            algo,
            ws as *mut c_void,
            WORKSPACE_BYTES,
            self.stream.cu_stream() as sys::cudaStream_t,
        )
    }

    /// Whether cuBLASLt can run `algo` on `plan`'s exact shape with our workspace.
    fn accepts(&self, plan: &Plan, algo: &sys::cublasLtMatmulAlgo_t) -> bool {
        // SAFETY: the plan's descriptors are live; `result` is plain data cuBLASLt fills.
        unsafe {
            let mut result: sys::cublasLtMatmulHeuristicResult_t = std::mem::zeroed();
            let status = sys::cublasLtMatmulAlgoCheck(
                self.handle,
                plan.desc,
                plan.w_layout,
                plan.x_layout,
                plan.y_layout,
                plan.y_layout,
                algo,
                &mut result,
            );
            status == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS
                && result.workspaceSize <= WORKSPACE_BYTES
        }
    }

    /// Times every candidate algorithm on the real operands and keeps the fastest. A replaced `y`
    /// is overwritten (the caller runs the real matmul afterwards); one that is added to must keep
    /// its values, so those candidates add to a zeroed stand-in instead. A candidate that fails is
    /// skipped; so, with a reference (batch-invariant mode), is one whose output differs from the
    /// reference's at `rows` or at `check_rows` (on the first [`COMPARED_ROWS`] rows of each).
    fn tune(
        &self,
        plan: &mut Plan,
        [w, x, y, ws]: [u64; 4],
        (rows, in_dim, out_dim, bf16_out, check_rows): (usize, usize, usize, bool, usize),
        (store, epilogue): (Store, Epilogue),
    ) -> KernelResult<()> {
        const OP: &str = "gemm tuning";
        let how = (store, epilogue);
        self.capture.refuse(OP)?;
        let started = std::time::Instant::now();
        let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let y_len = rows * out_dim;
        let stand_in = match store {
            Store::Replace => None,
            Store::Add => Some(
                self.stream
                    .alloc_zeros::<f32>(y_len.max(1))
                    .map_err(|e| driver_err(OP, e))?,
            ),
        };
        let y = match &stand_in {
            Some(buf) => buf.device_ptr(&self.stream).0,
            None => y,
        };
        let ptrs = [w, x, y, ws];
        // Bytes of the first `n` rows of y, at most `COMPARED_ROWS` of them.
        let row_bytes = out_dim * if bf16_out { 2 } else { 4 };
        let compared = |n: usize| n.min(COMPARED_ROWS) * row_bytes;
        let check = match plan.reference {
            Some(reference) => {
                let floor = if check_rows < rows {
                    let dims = (check_rows, in_dim, out_dim, bf16_out);
                    let floor = self.descriptors(dims, epilogue)?;
                    Some((floor, compared(check_rows)))
                } else {
                    None
                };
                let bytes = compared(rows);
                self.output_bytes(plan, &reference, ptrs, how, bytes)?
                    .map(|want| (reference, want, floor))
            }
            None => None,
        };
        // The candidates that give the reference's bits and run.
        let mut viable = Vec::with_capacity(plan.candidates.len());
        for algo in &plan.candidates {
            if let Some((reference, want, floor)) = &check {
                if !self.same_output(plan, (algo, reference), ptrs, how, (want, floor))? {
                    continue;
                }
            }
            // SAFETY: as in `gemm`: the pointers hold the plan's shapes (the stand-in as many
            // values as y).
            if unsafe { self.run(plan, algo, ptrs, how) }.is_ok() {
                viable.push(*algo);
            }
        }
        let checked = started.elapsed();
        let mut fastest = vec![f32::INFINITY; viable.len()];
        for _ in 0..TUNING_RUNS {
            let mut events = Vec::with_capacity(viable.len());
            for algo in &viable {
                let start = self.stream.record_event(timing);
                // SAFETY: as above.
                let ran = unsafe { self.run(plan, algo, ptrs, how) }.is_ok();
                let end = self.stream.record_event(timing);
                events.push((start.map_err(|e| driver_err(OP, e))?, end, ran));
            }
            for (fast, (start, end, ran)) in fastest.iter_mut().zip(events) {
                let end = end.map_err(|e| driver_err(OP, e))?;
                let ms = start.elapsed_ms(&end).map_err(|e| driver_err(OP, e))?;
                *fast = if ran && !fast.is_nan() {
                    fast.min(ms)
                } else {
                    f32::NAN
                };
            }
        }
        // A candidate that failed a run (NaN) is never the fastest.
        let best = (0..viable.len())
            .filter(|&i| !fastest[i].is_nan())
            .min_by(|&a, &b| fastest[a].total_cmp(&fastest[b]));
        tracing::debug!(
            rows,
            in_dim,
            out_dim,
            candidates_us = ?fastest.iter().map(|ms| (ms * 1e3).round()).collect::<Vec<_>>(),
            algos = ?viable.iter().map(algo_tag).collect::<Vec<_>>(),
            chosen = ?best,
            plan_ms = plan.built_in.as_secs_f64() * 1e3,
            check_ms = checked.as_secs_f64() * 1e3,
            timing_ms = (started.elapsed() - checked).as_secs_f64() * 1e3,
            "gemm tuned"
        );
        if let Some(i) = best {
            plan.algo = viable[i];
        }
        plan.tuned = true;
        Ok(())
    }

    /// Whether `algo` gives the reference's output `want` bit for bit: over all rows (unless it is
    /// the reference) and, on `floor`'s plan, over `floor`'s first bytes.
    fn same_output(
        &self,
        plan: &Plan,
        (algo, reference): (&sys::cublasLtMatmulAlgo_t, &sys::cublasLtMatmulAlgo_t),
        ptrs: [u64; 4],
        how: (Store, Epilogue),
        (want, floor): (&[u8], &Option<(Plan, usize)>),
    ) -> KernelResult<bool> {
        if algo.data != reference.data {
            let got = self.output_bytes(plan, algo, ptrs, how, want.len())?;
            if got.as_deref() != Some(want) {
                return Ok(false);
            }
        }
        if let Some((floor, bytes)) = floor {
            let got = self.output_bytes(floor, algo, ptrs, how, *bytes)?;
            return Ok(got.as_deref() == Some(&want[..*bytes]));
        }
        Ok(true)
    }

    /// `y`'s first `bytes` bytes after one run of `algo` on `plan` (adding to a zeroed `y` where
    /// `store` adds), or `None` where the run fails. Waits for the stream.
    fn output_bytes(
        &self,
        plan: &Plan,
        algo: &sys::cublasLtMatmulAlgo_t,
        ptrs: [u64; 4],
        how: (Store, Epilogue),
        bytes: usize,
    ) -> KernelResult<Option<Vec<u8>>> {
        const OP: &str = "gemm invariance check";
        use cudarc::driver::result::{memcpy_dtoh_async, memset_d8_async};
        let stream = self.stream.cu_stream();
        if how.0 == Store::Add {
            // SAFETY: y (the stand-in) holds at least `bytes` bytes.
            unsafe { memset_d8_async(ptrs[2], 0, bytes, stream) }.map_err(|e| driver_err(OP, e))?;
        }
        // SAFETY: as in `gemm`: the pointers hold the plan's shapes.
        if unsafe { self.run(plan, algo, ptrs, how) }.is_err() {
            return Ok(None);
        }
        let mut host = vec![0u8; bytes];
        // SAFETY: y holds `bytes` bytes; `host` outlives the copy (the stream is waited on).
        unsafe { memcpy_dtoh_async(&mut host, ptrs[2], stream) }.map_err(|e| driver_err(OP, e))?;
        self.stream.synchronize().map_err(|e| driver_err(OP, e))?;
        Ok(Some(host))
    }

    /// The batch-invariant reference of a family: the heuristic's first pick at `REFERENCE_ROWS`
    /// rows that splits no K, else its first pick with the split removed (if cuBLASLt takes it).
    fn reference(
        &self,
        in_dim: usize,
        out_dim: usize,
        bf16_out: bool,
        epilogue: Epilogue,
    ) -> KernelResult<Option<sys::cublasLtMatmulAlgo_t>> {
        let dims = (REFERENCE_ROWS, in_dim, out_dim, bf16_out);
        let Some(plan) = self.plan(dims, epilogue, REFERENCE_SEARCH)? else {
            return Ok(None);
        };
        let unsplit = plan.candidates.iter().find(|a| splits_no_k(a)).copied();
        Ok(unsplit.or_else(|| {
            plan.candidates
                .iter()
                .filter_map(without_split)
                .find(|a| self.accepts(&plan, a))
        }))
    }

    /// Batch-invariant mode: `plan` runs `reference` until timed, and its candidates become the
    /// reference and the heuristic's picks with their K split removed (those cuBLASLt takes),
    /// each to be checked against the reference's output when timed.
    fn restrict_to_reference(&self, plan: &mut Plan, reference: sys::cublasLtMatmulAlgo_t) {
        let mut candidates = vec![reference];
        for algo in plan.candidates.iter().filter_map(without_split) {
            if !candidates.iter().any(|c| c.data == algo.data) && self.accepts(plan, &algo) {
                candidates.push(algo);
            }
        }
        plan.candidates = candidates;
        plan.algo = reference;
        plan.reference = Some(reference);
    }

    /// The plan of one shape (rows, in_dim, out_dim, bf16 output) with up to `count` candidates
    /// from the heuristic, or `None` when cuBLASLt offers no algorithm for it.
    fn plan(
        &self,
        dims: (usize, usize, usize, bool),
        epilogue: Epilogue,
        count: usize,
    ) -> KernelResult<Option<Plan>> {
        const OP: &str = "gemm plan";
        let e = |err| blas_err(OP, err);
        let mut plan = self.descriptors(dims, epilogue)?;
        let pref = lt::create_matmul_pref().map_err(e)?;
        let workspace = WORKSPACE_BYTES as u64;
        // SAFETY: the preference is live; the attribute is a u64 byte count; `results` has room
        // for `count` entries and cuBLASLt fills `found` of them.
        let heuristic = unsafe {
            let mut results: Vec<sys::cublasLtMatmulHeuristicResult_t> =
                (0..count).map(|_| std::mem::zeroed()).collect();
            let mut found = 0i32;
            let searched = lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&workspace) as *const u64 as *const c_void,
                size_of::<u64>(),
            )
            .and_then(|()| {
                sys::cublasLtMatmulAlgoGetHeuristic(
                    self.handle,
                    plan.desc,
                    plan.w_layout,
                    plan.x_layout,
                    plan.y_layout,
                    plan.y_layout,
                    pref,
                    count as i32,
                    results.as_mut_ptr(),
                    &mut found,
                )
                .result()
            });
            let _ = lt::destroy_matmul_pref(pref);
            searched.map(|()| {
                results[..found.clamp(0, count as i32) as usize]
                    .iter()
                    .filter(|r| r.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
                    .map(|r| r.algo)
                    .collect::<Vec<_>>()
            })
        };
        match heuristic {
            Ok(algos) if !algos.is_empty() => {
                plan.algo = algos[0];
                plan.candidates = algos;
                Ok(Some(plan))
            }
            Ok(_) | Err(lt::CublasError(sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED)) => {
                Ok(None)
            }
            Err(err) => Err(e(err)),
        }
    }

    /// The descriptors of one shape (rows, in_dim, out_dim, bf16 output) and epilogue, with no
    /// algorithm yet.
    ///
    /// cuBLASLt is column-major: the row-major `y [rows, out]` is the column-major `yᵀ [out, rows]`
    /// `= W xᵀ`, where the row-major `W [out, in]` is a column-major `[in, out]` used transposed
    /// and the row-major `x [rows, in]` a column-major `[in, rows]` used as is.
    fn descriptors(
        &self,
        (rows, in_dim, out_dim, bf16_out): (usize, usize, usize, bool),
        epilogue: Epilogue,
    ) -> KernelResult<Plan> {
        const OP: &str = "gemm plan";
        let e = |err| blas_err(OP, err);
        let (r, k, n) = (rows as u64, in_dim as u64, out_dim as u64);
        let bf = sys::cudaDataType_t::CUDA_R_16BF;
        let f32t = sys::cudaDataType_t::CUDA_R_32F;
        let desc = lt::create_matmul_desc(sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, f32t)
            .map_err(e)?;
        let plan_parts = (|| {
            let w_layout = lt::create_matrix_layout(bf, k, n, k as i64)?;
            let x_layout = lt::create_matrix_layout(bf, k, r, k as i64)?;
            let y_type = if bf16_out { bf } else { f32t };
            let y_layout = lt::create_matrix_layout(y_type, n, r, n as i64)?;
            Ok::<_, lt::CublasError>((w_layout, x_layout, y_layout))
        })();
        let (w_layout, x_layout, y_layout) = match plan_parts {
            Ok(parts) => parts,
            Err(err) => {
                // SAFETY: created above, not used elsewhere.
                unsafe {
                    let _ = lt::destroy_matmul_desc(desc);
                }
                return Err(e(err));
            }
        };
        let plan = Plan {
            desc,
            w_layout,
            x_layout,
            y_layout,
            // SAFETY: plain data, overwritten (by the heuristic's choice) before any use.
            algo: unsafe { std::mem::zeroed() },
            candidates: Vec::new(),
            tuned: false,
            reference: None,
            built_in: std::time::Duration::ZERO,
        };
        let transpose: i32 = 1;
        // SAFETY: the descriptor is live; the attribute is an i32 (cublasOperation_t).
        unsafe {
            lt::set_matmul_desc_attribute(
                plan.desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                (&transpose) as *const i32 as *const c_void,
                size_of::<i32>(),
            )
        }
        .map_err(e)?;
        let (kind, bias_type) = match epilogue {
            Epilogue::None => return Ok(plan),
            Epilogue::Bias(_) => (sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS, f32t),
            Epilogue::GeluBias(_) => (sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_BIAS, bf),
        };
        // SAFETY: the descriptor is live; the attributes are a cublasLtEpilogue_t and a
        // cudaDataType_t (both C enums, i32-sized), then the bias's device pointer.
        unsafe {
            lt::set_matmul_desc_attribute(
                plan.desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_EPILOGUE,
                (&kind) as *const sys::cublasLtEpilogue_t as *const c_void,
                size_of::<sys::cublasLtEpilogue_t>(),
            )
            .and_then(|()| {
                lt::set_matmul_desc_attribute(
                    plan.desc,
                    sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                    (&bias_type) as *const sys::cudaDataType_t as *const c_void,
                    size_of::<sys::cudaDataType_t>(),
                )
            })
        }
        .map_err(e)?;
        // The heuristic sees the bias's alignment; each call sets its own pointer again.
        if let Some(bias) = epilogue.bias() {
            set_bias_pointer(plan.desc, bias).map_err(e)?;
        }
        Ok(plan)
    }
}

/// Points `desc`'s epilogue at a bias.
fn set_bias_pointer(desc: sys::cublasLtMatmulDesc_t, bias: u64) -> Result<(), lt::CublasError> {
    // SAFETY: the descriptor is live; the attribute is a device pointer (cuBLASLt reads it when a
    // matmul runs, by which time the caller's bias is on the stream).
    unsafe {
        lt::set_matmul_desc_attribute(
            desc,
            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
            (&bias) as *const u64 as *const c_void,
            size_of::<u64>(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::{bucket_with, floor_with};
    use crate::backend::bucket_tops;

    #[test]
    fn a_bucket_floor_is_its_smallest_row_count() {
        for exact in [0, 1024, 2048] {
            for rows in [
                1, 2, 3, 8, 9, 16, 64, 65, 128, 129, 700, 768, 1024, 1025, 2048, 2049, 2176, 4096,
                4097, 15_446,
            ] {
                let bucket = |r| bucket_with(r, exact);
                let floor = floor_with(rows, exact);
                assert!(
                    floor <= rows && bucket(floor) == bucket(rows),
                    "{rows} (exact to {exact})"
                );
                assert!(
                    floor == 1 || bucket(floor - 1) < bucket(rows),
                    "{rows} (exact to {exact})"
                );
            }
        }
    }

    #[test]
    fn row_buckets_are_exact_to_2048_then_keep_tile_rows_alike_up_to_4096() {
        let row_bucket = |r| bucket_with(r, 2048);
        // Powers of two up to 8 rows, then every multiple of 8 up to 2,048.
        assert_eq!([1, 2, 3, 8].map(row_bucket), [1, 2, 4, 8]);
        assert_eq!(
            [9, 100, 128, 139, 648, 2041, 2048].map(row_bucket),
            [16, 104, 128, 144, 648, 2048, 2048]
        );
        // Then multiples of 128: 2100 and 2176 share a bucket, 2177 does not.
        assert_eq!(
            [2049, 2100, 2176, 2177].map(row_bucket),
            [2176, 2176, 2176, 2304]
        );
        assert_eq!(
            [4095, 4096, 4097, 15_446].map(row_bucket),
            [4096, 4096, 8192, 16_384]
        );
        // Every bucket is warmed once, at its top, and the limit itself last.
        let tops = bucket_tops(5000, row_bucket);
        assert_eq!(&tops[..9], &[1, 2, 4, 8, 16, 24, 32, 40, 48]);
        assert_eq!(&tops[tops.len() - 3..], &[3968, 4096, 5000]);
        assert_eq!(tops.len(), 4 + 255 + 16 + 1);
        assert!(tops.iter().all(|&t| row_bucket(t) == t || t == 5000));
    }

    #[test]
    fn without_exact_buckets_they_are_the_powers_of_two_to_128_then_128_rows_wide() {
        let row_bucket = |r| bucket_with(r, 0);
        assert_eq!(
            [1, 3, 9, 100, 128, 129, 700, 761, 775].map(row_bucket),
            [1, 4, 16, 128, 128, 256, 768, 768, 896]
        );
        let tops = bucket_tops(5000, row_bucket);
        assert_eq!(&tops[..9], &[1, 2, 4, 8, 16, 32, 64, 128, 256]);
        assert_eq!(tops.len(), 8 + 31 + 1);
    }
}
