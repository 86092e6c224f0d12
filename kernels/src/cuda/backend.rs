//! [`CudaBackend`]: the [`Backend`] ops as CUDA kernels (bf16 weights, f32 activations, f32
//! accumulation), launched on one stream.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, DeviceRepr, LaunchArgs, LaunchConfig, PushKernelArg};
use half::bf16;

use super::blas::{row_bucket, Blas, GemmInput};
use super::buffers::{act, act_mut, idx, in_buf, out_buf, weight, CudaBuf, DType, InBuf, OutBuf};
use super::compile::GpuArch;
use super::delta_chunked::{DeltaProjection, DeltaScratchSlot, PROJECTION_CONV_TAPS};
use super::device::{driver_err, CudaOptions, Device};
use super::flash::{FlashInputs, FlashScratchSlot};
use super::tuning::TuningFile;
use super::upload::Staging;
use crate::backend::{
    conv1d_silu_then_l2, delta_net_core_apart, gates_apart, qk_norm_then_rope, AttentionDims,
    Backend, Buffers, DeltaDims, DeltaGates, DeltaState, HeadLayout, KernelResult, Rope, Store,
    Strided, Varlen,
};
use crate::error::KernelError;

/// Threads per block of the element-wise and row kernels.
const BLOCK: u32 = 256;
/// Threads per block of the naive attention kernel (`ATTN_THREADS` in attention.cu).
const ATTN_THREADS: u32 = 128;
/// Largest head the naive attention kernel holds in registers.
const ATTN_MAX_HEAD_DIM: usize = 512;
/// Tile edge of the naive GEMM (`GEMM_TILE` in gemm.cu).
const GEMM_TILE: u32 = 16;
/// The conv1d block's tile (rows x channels), its threads, and the widest kernel it holds
/// (`CONV_TILE_ROWS`, `CONV_TILE_CH`, `CONV_THREADS`, `CONV_MAX_KERNEL` in conv.cu).
const CONV_TILE_ROWS: usize = 32;
const CONV_TILE_CH: usize = 128;
const CONV_THREADS: u32 = 256;
const CONV_MAX_KERNEL: usize = 8;
/// Frequency pairs the rope kernel's by-value table holds (`ROPE_MAX_PAIRS` in rope.cu).
const ROPE_MAX_PAIRS: usize = 64;
/// Largest key head of the delta rule kernel (`DELTA_MAX_K` in delta.cu).
const DELTA_MAX_K: usize = 128;
/// Largest value head of the delta rule kernel, one thread per value (`DELTA_MAX_THREADS`).
const DELTA_MAX_THREADS: usize = 256;

/// The CUDA backend on one GPU.
pub struct CudaBackend {
    pub(super) device: Device,
    blas: Blas,
    ordinal: usize,
    /// Bytes uploaded as weights, and allocated as activation/index buffers (for metrics).
    weight_bytes: AtomicU64,
    buffer_bytes: AtomicU64,
    /// The chunked delta rule's scratch between its two kernels.
    pub(super) delta_scratch: DeltaScratchSlot,
    /// Flash attention's bf16 copies of Q, K and V.
    pub(super) flash_scratch: FlashScratchSlot,
    /// The pinned buffer weights are uploaded through.
    staging: Staging,
}

/// Reads a device's free and total memory; cheap to clone, usable from any thread.
#[derive(Clone)]
pub struct MemoryProbe {
    ctx: Arc<CudaContext>,
}

impl MemoryProbe {
    /// (free, total) bytes.
    pub fn read(&self) -> KernelResult<(usize, usize)> {
        self.ctx
            .mem_get_info()
            .map_err(|e| driver_err("mem_get_info", e))
    }
}

impl CudaBackend {
    /// Checks the CUDA libraries, opens the GPU, compiles (or loads from the disk cache) every
    /// kernel for its architecture. Every failure is an error naming what is missing.
    pub fn new(options: CudaOptions) -> KernelResult<Self> {
        let device = Device::start(&options)?;
        let tuning_file = match &device.cache_dir {
            Some(dir) => {
                let name = device
                    .ctx
                    .name()
                    .map_err(|e| driver_err("reading the GPU name", e))?;
                let identity = Blas::tuning_identity(&name, &device.arch.nvrtc_target());
                Some(TuningFile::new(dir, &identity))
            }
            None => None,
        };
        let blas = Blas::new(device.stream.clone(), tuning_file)?;
        Ok(Self {
            device,
            blas,
            ordinal: options.ordinal,
            weight_bytes: AtomicU64::new(0),
            buffer_bytes: AtomicU64::new(0),
            delta_scratch: DeltaScratchSlot::default(),
            flash_scratch: FlashScratchSlot::default(),
            staging: Staging::default(),
        })
    }

    /// The architecture the kernels were compiled for.
    pub fn arch(&self) -> GpuArch {
        self.device.arch
    }

    /// GEMM shapes timed since start; shapes whose winner was in the tuning file (or timed
    /// earlier in the same row bucket) are not counted.
    pub fn gemm_tunings(&self) -> usize {
        self.blas.tunings()
    }

    /// The file the GEMM algorithms picked by timing are kept in across starts (`None` without a
    /// cache directory or with `no_cache`).
    pub fn gemm_tuning_file(&self) -> Option<&std::path::Path> {
        self.blas.tuning_path()
    }

    /// (free, total) device memory in bytes.
    pub fn memory_info(&self) -> KernelResult<(usize, usize)> {
        self.memory_probe().read()
    }

    /// A handle that reads this device's free and total memory from any thread (for metrics).
    pub fn memory_probe(&self) -> MemoryProbe {
        MemoryProbe {
            ctx: self.device.ctx.clone(),
        }
    }

    /// Device bytes this backend has allocated so far: (weights uploaded, everything else:
    /// activation and index buffers, GEMM workspace and scratch).
    pub fn allocated_bytes(&self) -> (u64, u64) {
        let weights = self.weight_bytes.load(Ordering::Relaxed);
        let buffers = self.buffer_bytes.load(Ordering::Relaxed) + self.blas.bytes();
        (weights, buffers)
    }

    pub(super) fn add_buffer_bytes(&self, bytes: u64) {
        self.buffer_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(super) fn release_buffer_bytes(&self, bytes: u64) {
        self.buffer_bytes.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Waits for every queued op to finish.
    pub fn synchronize(&self) -> KernelResult<()> {
        self.device
            .stream
            .synchronize()
            .map_err(|e| driver_err("synchronize", e))
    }
}

pub(super) fn to_i32(op: &'static str, what: &str, v: usize) -> KernelResult<i32> {
    i32::try_from(v).map_err(|_| KernelError::invalid(op, format!("{what} {v} exceeds i32")))
}

pub(super) fn to_u32(op: &'static str, what: &str, v: usize) -> KernelResult<u32> {
    u32::try_from(v).map_err(|_| KernelError::invalid(op, format!("{what} {v} exceeds u32")))
}

/// A 1-D launch with one thread per item.
pub(super) fn linear(op: &'static str, items: usize, block: u32) -> KernelResult<LaunchConfig> {
    let blocks = to_u32(op, "grid size", items.div_ceil(block as usize))?;
    Ok(LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// One block per row.
fn per_row(op: &'static str, rows: usize) -> KernelResult<LaunchConfig> {
    Ok(LaunchConfig {
        grid_dim: (to_u32(op, "rows", rows)?, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// The SwiGLU kernels' grid: blocks of BLOCK threads over (rows, column slices), a slice being
/// BLOCK steps of 8 values (elementwise.cu), so that a thread has few steps and their loads
/// overlap across the whole grid.
fn swiglu_grid(op: &'static str, rows: usize, inter: usize) -> KernelResult<LaunchConfig> {
    Ok(LaunchConfig {
        grid_dim: (
            to_u32(op, "rows", rows)?,
            to_u32(op, "column slices", inter.div_ceil(8 * BLOCK as usize))?,
            1,
        ),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// Checks attention dims and returns the rows qg, k and v all hold (the caller then checks the
/// batch against them with [`check_batch`]).
fn attention_rows(
    op: &'static str,
    qg: &CudaBuf,
    k: &CudaBuf,
    v: &CudaBuf,
    dims: AttentionDims,
) -> KernelResult<usize> {
    let AttentionDims {
        q_heads,
        kv_heads,
        head_dim,
        ..
    } = dims;
    if q_heads == 0 || kv_heads == 0 || !q_heads.is_multiple_of(kv_heads) || head_dim == 0 {
        return Err(KernelError::invalid(
            op,
            format!(
                "q_heads {q_heads} must be a positive multiple of kv_heads {kv_heads} > 0, \
                 head_dim > 0"
            ),
        ));
    }
    if head_dim > ATTN_MAX_HEAD_DIM {
        return Err(KernelError::invalid(
            op,
            format!("head_dim {head_dim} exceeds {ATTN_MAX_HEAD_DIM}"),
        ));
    }
    // Rows every buffer can hold: kernels never touch a row beyond it.
    Ok([
        qg.len() / (q_heads * 2 * head_dim),
        k.len() / (kv_heads * head_dim),
        v.len() / (kv_heads * head_dim),
    ]
    .into_iter()
    .min()
    .unwrap_or(0))
}

/// Checks the host-known part of a batch (`cu_seqlens` has `num_seqs + 1` entries, `batch.rows`
/// fits in `rows_cap`, the rows every buffer of the op holds) and returns the rows to launch over.
/// The contents of `cu_seqlens` stay on the device: kernels read them there and never step beyond
/// the returned row count, whatever they hold.
/// Values per thread of the register-held norm kernels (norms.cu): row kernels (BLOCK threads per
/// row) and one-warp kernels (32 lanes per head). The largest variant also runs longer rows.
const ROW_HELD: [usize; 4] = [4, 8, 12, 16];
const WARP_HELD: [usize; 3] = [4, 8, 16];
const RMS_NORM: [&str; 4] = ["rms_norm_h4", "rms_norm_h8", "rms_norm_h12", "rms_norm_h16"];
const RMS_NORM_BF16: [&str; 4] = [
    "rms_norm_bf16_h4",
    "rms_norm_bf16_h8",
    "rms_norm_bf16_h12",
    "rms_norm_bf16_h16",
];
const ADD_RMS_NORM: [&str; 4] = [
    "add_rms_norm_h4",
    "add_rms_norm_h8",
    "add_rms_norm_h12",
    "add_rms_norm_h16",
];
const ADD_RMS_NORM_BF16: [&str; 4] = [
    "add_rms_norm_bf16_h4",
    "add_rms_norm_bf16_h8",
    "add_rms_norm_bf16_h12",
    "add_rms_norm_bf16_h16",
];
const GATED_RMS_NORM_BF16: [&str; 3] = [
    "gated_rms_norm_bf16_h4",
    "gated_rms_norm_bf16_h8",
    "gated_rms_norm_bf16_h16",
];
/// The same with a bf16 gate `z`.
const GATED_RMS_NORM_BF16_ZBF16: [&str; 3] = [
    "gated_rms_norm_bf16_zbf16_h4",
    "gated_rms_norm_bf16_zbf16_h8",
    "gated_rms_norm_bf16_zbf16_h16",
];
const L2_NORM: [&str; 3] = ["l2_norm_h4", "l2_norm_h8", "l2_norm_h16"];

/// Pushes `buf`, or (absent) a null pointer in its place, for an optional input the kernel then
/// does not read.
fn push_or_null<'a>(launch: &mut LaunchArgs<'a>, buf: Option<&'a CudaSlice<f32>>, null: &'a u64) {
    match buf {
        Some(buf) => launch.arg(buf),
        None => launch.arg(null),
    };
}

/// The delta rule's gates for the conv kernel to compute alongside: their inputs, then beta and g.
type GatesOut<'a> = (DeltaGates<'a, CudaBuf>, &'a mut CudaBuf, &'a mut CudaBuf);

/// The checked inputs of the gates as the conv kernel and `gdr_prepare_conv` read them (`gb` ..
/// `dt_bias`).
pub(super) struct GateInputs<'a> {
    b: InBuf<'a>,
    a: InBuf<'a>,
    /// b's row stride and offset, a's, and the heads.
    ints: [i32; 5],
    a_log: &'a CudaSlice<bf16>,
    dt_bias: &'a CudaSlice<bf16>,
}

impl<'a> GateInputs<'a> {
    /// Checks `gates` for `rows` rows read by a kernel whose x is bf16 (`x_bf16`) or f32.
    pub(super) fn new(
        op: &'static str,
        gates: &DeltaGates<'a, CudaBuf>,
        rows: usize,
        x_bf16: bool,
    ) -> KernelResult<Self> {
        let heads = gates.heads;
        let b = in_buf(op, "b", gates.b, gates.b_at.required_len(rows, heads))?;
        let a = in_buf(op, "a", gates.a, gates.a_at.required_len(rows, heads))?;
        if b.is_bf16() != x_bf16 || a.is_bf16() != x_bf16 {
            return Err(KernelError::invalid(
                op,
                "the gates' b and a must have x's type (the kernel reads all three)",
            ));
        }
        let i = |what, v| to_i32(op, what, v);
        Ok(Self {
            b,
            a,
            ints: [
                i("b row stride", gates.b_at.row_stride)?,
                i("b offset", gates.b_at.offset)?,
                i("a row stride", gates.a_at.row_stride)?,
                i("a offset", gates.a_at.offset)?,
                i("gate heads", heads)?,
            ],
            a_log: weight(op, "a_log", gates.a_log, heads)?,
            dt_bias: weight(op, "dt_bias", gates.dt_bias, heads)?,
        })
    }

    /// Pushes `gb, gb_stride, gb_offset, ga, ga_stride, ga_offset, a_log, dt_bias`.
    pub(super) fn push<'b>(&'b self, launch: &mut LaunchArgs<'b>) {
        self.b.push(launch);
        launch.arg(&self.ints[0]).arg(&self.ints[1]);
        self.a.push(launch);
        launch
            .arg(&self.ints[2])
            .arg(&self.ints[3])
            .arg(self.a_log)
            .arg(self.dt_bias);
    }
}

/// The conv kernel's checked gate arguments (`gb` .. `gate_heads` in conv.cu).
struct ConvGates<'a> {
    inputs: GateInputs<'a>,
    beta: &'a mut CudaSlice<f32>,
    g: &'a mut CudaSlice<f32>,
}

impl<'a> ConvGates<'a> {
    /// Checks `gates` for `rows` rows read by a kernel whose x is bf16 (`x_bf16`) or f32.
    fn new(
        op: &'static str,
        (gates, beta, g): GatesOut<'a>,
        rows: usize,
        x_bf16: bool,
    ) -> KernelResult<Self> {
        let heads = gates.heads;
        Ok(Self {
            inputs: GateInputs::new(op, &gates, rows, x_bf16)?,
            beta: act_mut(op, "beta", beta, rows * heads)?,
            g: act_mut(op, "g", g, rows * heads)?,
        })
    }

    /// Pushes the arguments, or (absent) null pointers and zeros: no gate heads, nothing read.
    fn push<'b>(gates: Option<&'b mut Self>, launch: &mut LaunchArgs<'b>, null: &'b u64) {
        const ZEROS: [i32; 5] = [0; 5];
        match gates {
            Some(c) => {
                c.inputs.push(launch);
                launch
                    .arg(&mut *c.beta)
                    .arg(&mut *c.g)
                    .arg(&c.inputs.ints[4]);
            }
            None => {
                launch.arg(null).arg(&ZEROS[0]).arg(&ZEROS[1]);
                launch.arg(null).arg(&ZEROS[2]).arg(&ZEROS[3]);
                for _ in 0..4 {
                    launch.arg(null);
                }
                launch.arg(&ZEROS[4]);
            }
        }
    }
}

/// The channels the conv kernel L2-normalises itself for `l2` (heads that are whole channel
/// tiles from channel 0 of a dense output), or `None` where the layout needs the separate kernel.
fn conv_l2_channels(l2: HeadLayout, channels: usize) -> Option<usize> {
    let l2_channels = l2.heads * l2.head_dim;
    (l2.head_dim == CONV_TILE_CH
        && l2.head_stride == l2.head_dim
        && l2.offset == 0
        && l2.row_stride == channels
        && l2_channels <= channels)
        .then_some(l2_channels)
}

/// Index of the smallest variant in `held` whose `threads · held` values hold a row of `len`
/// (the last, which loops over longer rows, when none does).
fn held_variant(len: usize, threads: usize, held: &[usize]) -> usize {
    held.iter()
        .position(|&h| h * threads >= len)
        .unwrap_or(held.len() - 1)
}

pub(super) fn check_batch(
    op: &'static str,
    batch: &Varlen<'_, CudaSlice<u32>>,
    rows_cap: usize,
) -> KernelResult<usize> {
    idx(op, "cu_seqlens", batch.cu_seqlens, batch.num_seqs + 1)?;
    if batch.rows > rows_cap {
        return Err(KernelError::invalid(
            op,
            format!("batch has {} rows, buffers hold {rows_cap}", batch.rows),
        ));
    }
    Ok(batch.rows)
}

/// A GEMM's `x`: an f32 activation (rounded to bf16 on the way) or a bf16 GEMM input, of at least
/// `need` values.
fn gemm_input<'a>(op: &'static str, x: &'a CudaBuf, need: usize) -> KernelResult<&'a CudaBuf> {
    if x.len() < need {
        return Err(KernelError::invalid(
            op,
            format!("x holds {} values, needs {need}", x.len()),
        ));
    }
    Ok(x)
}

/// The checked gate `z` (f32, or bf16: the stacked in-projection output of a bf16 model) of a gated
/// RMSNorm launch and its layout arguments (`z, heads, z_stride, z_offset` in norms.cu).
struct GateArgs<'a> {
    z: InBuf<'a>,
    heads: i32,
    stride: i32,
    offset: i32,
}

impl<'a> GateArgs<'a> {
    /// Checks that `z` holds `rows` rows of `heads·dim` at `z_at`.
    fn check(
        op: &'static str,
        z: &'a CudaBuf,
        z_at: Strided,
        rows: usize,
        heads: usize,
        dim: usize,
    ) -> KernelResult<Self> {
        Ok(Self {
            z: in_buf(op, "z", z, z_at.required_len(rows, heads * dim))?,
            heads: to_i32(op, "heads", heads)?,
            stride: to_i32(op, "z row stride", z_at.row_stride)?,
            offset: to_i32(op, "z offset", z_at.offset)?,
        })
    }

    fn is_bf16(&self) -> bool {
        matches!(self.z, InBuf::Bf16(_))
    }

    fn push<'b>(&'b self, launch: &mut LaunchArgs<'b>) {
        self.z.push(launch);
        launch.arg(&self.heads).arg(&self.stride).arg(&self.offset);
    }
}

/// The checked buffers of a delta-rule launch.
pub(super) struct DeltaArgs<'a> {
    pub qkv: &'a CudaSlice<f32>,
    pub beta: &'a CudaSlice<f32>,
    pub g: &'a CudaSlice<f32>,
    pub cu_seqlens: &'a CudaSlice<u32>,
    pub initial: Option<&'a CudaSlice<f32>>,
    pub final_out: Option<&'a mut CudaSlice<f32>>,
    pub out: &'a mut CudaSlice<f32>,
    pub dims: DeltaDims,
    /// Rows every buffer holds and the batch covers: the kernels clamp the sequences to it.
    pub rows_cap: usize,
    /// Whether the states are present, as the kernels take it.
    has_initial: i32,
    has_final: i32,
}

impl<'a> DeltaArgs<'a> {
    /// Checks buffer types and lengths against `dims` and the batch; `None` when there is nothing
    /// to compute (no sequence or no value head).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn check(
        op: &'static str,
        qkv: &'a CudaBuf,
        beta: &'a CudaBuf,
        g: &'a CudaBuf,
        batch: Varlen<'a, CudaSlice<u32>>,
        dims: DeltaDims,
        state: DeltaState<'a, CudaBackend>,
        out: &'a mut CudaBuf,
    ) -> KernelResult<Option<Self>> {
        let v_heads = dims.v_heads;
        let rows_cap = [
            qkv.len() / dims.qkv_width().max(1),
            beta.len() / v_heads.max(1),
            g.len() / v_heads.max(1),
            out.len() / (v_heads * dims.v_dim).max(1),
        ]
        .into_iter()
        .min()
        .unwrap_or(0);
        let rows_cap = check_batch(op, &batch, rows_cap)?;
        let state_len = batch.num_seqs * dims.state_len();
        let has_initial = i32::from(state.initial.is_some());
        let has_final = i32::from(state.final_out.is_some());
        let args = Self {
            qkv: act(op, "qkv", qkv, 0)?,
            beta: act(op, "beta", beta, 0)?,
            g: act(op, "g", g, 0)?,
            cu_seqlens: batch.cu_seqlens,
            initial: state
                .initial
                .map(|s| act(op, "initial state", s, state_len))
                .transpose()?,
            final_out: state
                .final_out
                .map(|s| act_mut(op, "final state", s, state_len))
                .transpose()?,
            out: act_mut(op, "out", out, 0)?,
            dims,
            rows_cap,
            has_initial,
            has_final,
        };
        Ok((batch.num_seqs > 0 && v_heads > 0).then_some(args))
    }

    /// Pushes the arguments every delta-rule kernel takes in this order: `cu_seqlens, initial,
    /// has_initial, final_state, has_final, out`. The kernels never touch an absent state
    /// (has_* = 0); qkv stands in for it as a valid pointer.
    pub(super) fn push_states_and_out<'b>(&'b mut self, launch: &mut LaunchArgs<'b>) {
        launch
            .arg(self.cu_seqlens)
            .arg(self.initial.unwrap_or(self.qkv))
            .arg(&self.has_initial);
        match self.final_out.as_deref_mut() {
            Some(final_state) => launch.arg(final_state),
            None => launch.arg(self.qkv),
        };
        launch.arg(&self.has_final).arg(&mut *self.out);
    }
}

/// The rope kernel's by-value frequency table (`RopeTable` in rope.cu).
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct RopeTable {
    inv_freq: [f32; ROPE_MAX_PAIRS],
    axis: [u32; ROPE_MAX_PAIRS],
}

// SAFETY: plain `repr(C)` data with the same layout as the CUDA struct.
unsafe impl DeviceRepr for RopeTable {}

impl RopeTable {
    /// The table of `rope` and its number of frequency pairs, for heads of `head_dim`.
    pub(super) fn new(
        op: &'static str,
        rope: &Rope,
        head_dim: usize,
    ) -> KernelResult<(Self, usize)> {
        let rot = rope.rotary_dim;
        if !rot.is_multiple_of(2) || rot > head_dim || rot / 2 > ROPE_MAX_PAIRS {
            return Err(KernelError::invalid(
                op,
                format!(
                    "rotary_dim {rot} must be even, at most head_dim {head_dim} and at most {}",
                    2 * ROPE_MAX_PAIRS
                ),
            ));
        }
        let half = rot / 2;
        let mut table = RopeTable {
            inv_freq: [0.0; ROPE_MAX_PAIRS],
            axis: [0; ROPE_MAX_PAIRS],
        };
        for j in 0..half {
            table.inv_freq[j] = rope.inv_freq(j);
            table.axis[j] = rope.axis(j) as u32;
        }
        Ok((table, half))
    }
}

impl Buffers for CudaBackend {
    type Buf = CudaBuf;
    type Idx = CudaSlice<u32>;
}

impl Backend for CudaBackend {
    fn name(&self) -> String {
        format!("cuda:{}", self.ordinal)
    }

    /// One forward per GEMM tuning bucket ([`row_bucket`]).
    fn warm_rows(&self, max_rows: usize) -> Vec<usize> {
        crate::backend::bucket_tops(max_rows, row_bucket)
    }

    fn alloc(&self, len: usize) -> KernelResult<CudaBuf> {
        let slice = self.device.stream.alloc_zeros::<f32>(len);
        let slice = slice.map_err(|e| driver_err("alloc", e))?;
        self.buffer_bytes
            .fetch_add(4 * len as u64, Ordering::Relaxed);
        Ok(CudaBuf::F32(slice))
    }

    /// A bf16 buffer: the norms write GEMM inputs in the precision the GEMM reads them.
    fn alloc_gemm_input(&self, len: usize) -> KernelResult<CudaBuf> {
        let slice = self.device.stream.alloc_zeros::<bf16>(len);
        let slice = slice.map_err(|e| driver_err("alloc_gemm_input", e))?;
        self.buffer_bytes
            .fetch_add(2 * len as u64, Ordering::Relaxed);
        Ok(CudaBuf::Bf16(slice))
    }

    fn alloc_idx(&self, len: usize) -> KernelResult<CudaSlice<u32>> {
        let slice = self.device.stream.alloc_zeros::<u32>(len);
        let slice = slice.map_err(|e| driver_err("alloc_idx", e))?;
        self.buffer_bytes
            .fetch_add(4 * len as u64, Ordering::Relaxed);
        Ok(slice)
    }

    /// Uploads a weight in bf16 (the model stores its weights in bf16), rounded on every core into
    /// the pinned staging buffer (upload.rs): a 4B model is 4.2 G values.
    fn upload(&self, data: &[f32]) -> KernelResult<CudaBuf> {
        self.upload_stacked(&[data])
    }

    fn upload_stacked(&self, parts: &[&[f32]]) -> KernelResult<CudaBuf> {
        let slice = self
            .staging
            .upload(&self.device.ctx, &self.device.stream, parts)?;
        self.weight_bytes
            .fetch_add(2 * slice.len() as u64, Ordering::Relaxed);
        Ok(CudaBuf::Bf16(slice))
    }

    fn write(&self, dst: &mut CudaBuf, data: &[f32]) -> KernelResult<()> {
        const OP: &str = "write";
        if dst.len() < data.len() {
            return Err(KernelError::invalid(
                OP,
                format!(
                    "destination holds {} values, needs {}",
                    dst.len(),
                    data.len()
                ),
            ));
        }
        if data.is_empty() {
            return Ok(());
        }
        let stream = &self.device.stream;
        let copied = match dst {
            CudaBuf::F32(s) => stream.memcpy_htod(data, &mut s.slice_mut(..data.len())),
            CudaBuf::Bf16(s) => {
                let host: Vec<bf16> = data.iter().map(|&v| bf16::from_f32(v)).collect();
                stream.memcpy_htod(&host, &mut s.slice_mut(..data.len()))
            }
        };
        copied.map_err(|e| driver_err(OP, e))
    }

    fn write_idx(&self, dst: &mut CudaSlice<u32>, data: &[u32]) -> KernelResult<()> {
        const OP: &str = "write_idx";
        idx(OP, "destination", dst, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        self.device
            .stream
            .memcpy_htod(data, &mut dst.slice_mut(..data.len()))
            .map_err(|e| driver_err(OP, e))
    }

    fn read(&self, src: &CudaBuf, len: usize) -> KernelResult<Vec<f32>> {
        const OP: &str = "read";
        if src.len() < len {
            return Err(KernelError::invalid(
                OP,
                format!("source holds {} values, needs {len}", src.len()),
            ));
        }
        if len == 0 {
            return Ok(Vec::new());
        }
        let stream = &self.device.stream;
        let values = match src {
            CudaBuf::F32(s) => stream.clone_dtoh(&s.slice(..len)),
            CudaBuf::Bf16(s) => stream
                .clone_dtoh(&s.slice(..len))
                .map(|v| v.into_iter().map(f32::from).collect()),
        };
        let values = values.map_err(|e| driver_err(OP, e))?;
        self.synchronize()?;
        Ok(values)
    }

    fn embedding(
        &self,
        table: &CudaBuf,
        vocab: usize,
        ids: &CudaSlice<u32>,
        rows: usize,
        dim: usize,
        out: &mut CudaBuf,
    ) -> KernelResult<()> {
        const OP: &str = "embedding";
        let table = weight(OP, "table", table, vocab * dim)?;
        let ids = idx(OP, "ids", ids, rows)?;
        let out = act_mut(OP, "out", out, rows * dim)?;
        if rows * dim == 0 {
            return Ok(());
        }
        let (rows_a, dim_a) = (to_i32(OP, "rows", rows)?, to_i32(OP, "dim", dim)?);
        let vocab_a = to_u32(OP, "vocab", vocab)?;
        let f = self.device.function("embedding")?;
        let mut launch = self.device.stream.launch_builder(f);
        launch
            .arg(table)
            .arg(ids)
            .arg(out)
            .arg(&rows_a)
            .arg(&dim_a)
            .arg(&vocab_a);
        // SAFETY: argument types match the kernel; lengths checked above.
        unsafe { launch.launch(linear(OP, rows * dim, BLOCK)?) }.map_err(|e| driver_err(OP, e))?;
        Ok(())
    }

    fn rms_norm(
        &self,
        x: &CudaBuf,
        weight_buf: &CudaBuf,
        rows: usize,
        dim: usize,
        eps: f32,
        out: &mut CudaBuf,
    ) -> KernelResult<()> {
        const OP: &str = "rms_norm";
        let x = act(OP, "x", x, rows * dim)?;
        let w = weight(OP, "weight", weight_buf, dim)?;
        let out = out_buf(OP, "out", out, rows * dim)?;
        if rows == 0 || dim == 0 {
            return Ok(());
        }
        let dim_a = to_i32(OP, "dim", dim)?;
        let held = held_variant(dim, BLOCK as usize, &ROW_HELD);
        let kernel = match out {
            OutBuf::F32(_) => RMS_NORM[held],
            OutBuf::Bf16(_) => RMS_NORM_BF16[held],
        };
        let f = self.device.function(kernel)?;
        let mut launch = self.device.stream.launch_builder(f);
        launch.arg(x).arg(w);
        match out {
            OutBuf::F32(o) => launch.arg(o),
            OutBuf::Bf16(o) => launch.arg(o),
        };
        launch.arg(&dim_a).arg(&eps);
        // SAFETY: argument types match the kernel; lengths checked above.
        unsafe { launch.launch(per_row(OP, rows)?) }.map_err(|e| driver_err(OP, e))?;
        Ok(())
    }

    fn add_rms_norm(
        &self,
        residual: &mut CudaBuf,
        delta: &CudaBuf,
        weight_buf: &CudaBuf,
        rows: usize,
        dim: usize,
        eps: f32,
        out: &mut CudaBuf,
    ) -> KernelResult<()> {
        const OP: &str = "add_rms_norm";
        let residual = act_mut(OP, "residual", residual, rows * dim)?;
        let delta = act(OP, "delta", delta, rows * dim)?;
        let w = weight(OP, "weight", weight_buf, dim)?;
        let out = out_buf(OP, "out", out, rows * dim)?;
        if rows == 0 || dim == 0 {
            return Ok(());
        }
        let dim_a = to_i32(OP, "dim", dim)?;
        let held = held_variant(dim, BLOCK as usize, &ROW_HELD);
        let kernel = match out {
            OutBuf::F32(_) => ADD_RMS_NORM[held],
            OutBuf::Bf16(_) => ADD_RMS_NORM_BF16[held],
        };
        let f = self.device.function(kernel)?;
        let mut launch = self.device.stream.launch_builder(f);
        launch.arg(residual).arg(delta).arg(w);
        match out {
            OutBuf::F32(o) => launch.arg(o),
            OutBuf::Bf16(o) => launch.arg(o),
        };
        launch.arg(&dim_a).arg(&eps);
        // SAFETY: argument types match the kernel; lengths checked above.
        unsafe { launch.launch(per_row(OP, rows)?) }.map_err(|e| driver_err(OP, e))?;
        Ok(())
    }

    fn gemm_to(
        &self,
        x: &CudaBuf,
        w: &CudaBuf,
        rows: usize,
        in_dim: usize,
        out_dim: usize,
        store: Store,
        y: &mut CudaBuf,
    ) -> KernelResult<()> {
        const OP: &str = "gemm";
        let x = gemm_input(OP, x, rows * in_dim)?;
        let w = weight(OP, "w", w, out_dim * in_dim)?;
        let y = out_buf(OP, "y", y, rows * out_dim)?;
        if rows == 0 || out_dim == 0 || (in_dim == 0 && store == Store::Add) {
            return Ok(());
        }
        // A bf16 `y` (from alloc_gemm_input) gets cuBLASLt's bf16 output; only f32 has a fallback,
        // and only f32 can be added to.
        let y = match y {
            OutBuf::F32(y) => y,
            OutBuf::Bf16(_) if store == Store::Add => {
                return Err(KernelError::invalid(
                    OP,
                    "y must be f32 to be added to (bf16 GEMM outputs are replaced only)",
                ));
            }
            OutBuf::Bf16(y) => {
                if in_dim > 0
                    && self.blas_gemm(x, rows, in_dim, (w, out_dim, OutBuf::Bf16(y)), store)?
                {
                    return Ok(());
                }
                return Err(KernelError::invalid(
                    OP,
                    format!(
                        "cuBLASLt has no bf16-output algorithm for {rows}x{in_dim} -> {out_dim}; \
                         give an f32 y"
                    ),
                ));
            }
        };
        if in_dim > 0
            && self.blas_gemm(x, rows, in_dim, (w, out_dim, OutBuf::F32(&mut *y)), store)?
        {
            return Ok(());
        }
        self.tiled_gemm(x, w, rows, in_dim, out_dim, store, y)
    }

    fn reserve_gemm_input(&self, values: usize) -> KernelResult<()> {
        self.blas.reserve(values)
    }

    fn head_rms_norm(
        &self,
        x: &mut CudaBuf,
        weight_buf: &CudaBuf,
        layout: HeadLayout,
        rows: usize,
        eps: f32,
    ) -> KernelResult<()> {
        const OP: &str = "head_rms_norm";
        layout.check_fits(OP, x.len(), rows)?;
        let x = act_mut(OP, "x", x, 0)?;
        let w = weight(OP, "weight", weight_buf, layout.head_dim)?;
        self.per_head(OP, "head_rms_norm", x, Some(w), layout, rows, eps)
    }

    fn rope(
        &self,
        x: &mut CudaBuf,
        layout: HeadLayout,
        positions: &CudaSlice<u32>,
        rows: usize,
        rope: &Rope,
    ) -> KernelResult<()> {
        const OP: &str = "rope";
        layout.check_fits(OP, x.len(), rows)?;
        let x = act_mut(OP, "x", x, 0)?;
        let positions = idx(OP, "positions", positions, rows * 3)?;
        let (table, half) = RopeTable::new(OP, rope, layout.head_dim)?;
        if rows == 0 || layout.heads == 0 || half == 0 {
            return Ok(());
        }
        let rows_a = to_i32(OP, "rows", rows)?;
        let heads_a = to_i32(OP, "heads", layout.heads)?;
        let half_a = to_i32(OP, "rotary_dim", half)?;
        let head_stride = to_i32(OP, "head_stride", layout.head_stride)?;
        let row_stride = to_i32(OP, "row_stride", layout.row_stride)?;
        let offset = to_i32(OP, "offset", layout.offset)?;
        let f = self.device.function("rope")?;
        let mut launch = self.device.stream.launch_builder(f);
        launch
            .arg(x)
            .arg(positions)
            .arg(&table)
            .arg(&rows_a)
            .arg(&heads_a)
            .arg(&half_a)
            .arg(&head_stride)
            .arg(&row_stride)
            .arg(&offset);
        let cfg = linear(OP, rows * layout.heads * half, BLOCK)?;
        // SAFETY: argument types match the kernel; the layout was checked against x above.
        unsafe { launch.launch(cfg) }.map_err(|e| driver_err(OP, e))?;
        Ok(())
    }

    fn qk_norm_rope(
        &self,
        (q_buf, q_norm, q_layout): (&mut CudaBuf, &CudaBuf, HeadLayout),
        (k_buf, k_norm, k_layout): (&mut CudaBuf, &CudaBuf, HeadLayout),
        positions: &CudaSlice<u32>,
        rows: usize,
        rope: &Rope,
        eps: f32,
    ) -> KernelResult<()> {
        const OP: &str = "qk_norm_rope";
        let head_dim = q_layout.head_dim;
        if k_layout.head_dim != head_dim {
            // One kernel serves one head size; other shapes take the four kernels.
            return qk_norm_then_rope(
                self,
                (q_buf, q_norm, q_layout),
                (k_buf, k_norm, k_layout),
                positions,
                rows,
                rope,
                eps,
            );
        }
        q_layout.check_fits(OP, q_buf.len(), rows)?;
        k_layout.check_fits(OP, k_buf.len(), rows)?;
        let q = act_mut(OP, "q", q_buf, 0)?;
        let k = act_mut(OP, "k", k_buf, 0)?;
        let qw = weight(OP, "q_norm", q_norm, head_dim)?;
        let kw = weight(OP, "k_norm", k_norm, head_dim)?;
        let positions = idx(OP, "positions", positions, rows * 3)?;
        let (table, half) = RopeTable::new(OP, rope, head_dim)?;
        let heads = q_layout.heads + k_layout.heads;
        if rows == 0 || heads == 0 {
            return Ok(());
        }
        let i = |what, v| to_i32(OP, what, v);
        let q_at = [
            i("q heads", q_layout.heads)?,
            i("q head stride", q_layout.head_stride)?,
            i("q row stride", q_layout.row_stride)?,
            i("q offset", q_layout.offset)?,
        ];
        let k_at = [
            i("k heads", k_layout.heads)?,
            i("k head stride", k_layout.head_stride)?,
            i("k row stride", k_layout.row_stride)?,
            i("k offset", k_layout.offset)?,
        ];
        let head_dim_a = i("head_dim", head_dim)?;
        let half_a = i("rotary pairs", half)?;
        let rows_a = i("rows", rows)?;
        let f = self.device.function("qk_norm_rope")?;
        let mut launch = self.device.stream.launch_builder(f);
        launch.arg(q).arg(qw);
        for v in &q_at {
            launch.arg(v);
        }
        launch.arg(k).arg(kw);
        for v in &k_at {
            launch.arg(v);
        }
        launch
            .arg(&head_dim_a)
            .arg(positions)
            .arg(&table)
            .arg(&half_a)
            .arg(&rows_a)
            .arg(&eps);
        // One warp (32 threads) per (row, head).
        let cfg = linear(OP, rows * heads * 32, BLOCK)?;
        // SAFETY: argument types match the kernel; both layouts were checked against their buffers
        // and positions holds rows·3 values.
        unsafe { launch.launch(cfg) }.map_err(|e| driver_err(OP, e))?;
        Ok(())
    }

    fn attention(
        &self,
        qg: &CudaBuf,
        k: &CudaBuf,
        v: &CudaBuf,
        batch: Varlen<'_, CudaSlice<u32>>,
        dims: AttentionDims,
        out: &mut CudaBuf,
    ) -> KernelResult<()> {
        const OP: &str = "attention";
        let AttentionDims {
            q_heads,
            kv_heads,
            head_dim,
            scale,
        } = dims;
        let out_rows = out.len() / (q_heads * head_dim).max(1);
        let rows_cap = attention_rows(OP, qg, k, v, dims)?.min(out_rows);
        let rows_cap = check_batch(OP, &batch, rows_cap)?;
        let qg = act(OP, "qg", qg, 0)?;
        let k = act(OP, "k", k, 0)?;
        let v = act(OP, "v", v, 0)?;
        let out = act_mut(OP, "out", out, 0)?;
        if rows_cap == 0 || batch.num_seqs == 0 {
            return Ok(());
        }
        // Head dims that are multiples of 16 up to 256 take the tensor-core kernel.
        if super::flash::flash_variant(head_dim).is_some() {
            let inputs = FlashInputs::Dense { qg, k, v };
            return self.flash_attention(inputs, batch, dims, false, OutBuf::F32(out));
        }
        let num_seqs = to_i32(OP, "num_seqs", batch.num_seqs)?;
        let q_heads_a = to_i32(OP, "q_heads", q_heads)?;
        let kv_heads_a = to_i32(OP, "kv_heads", kv_heads)?;
        let head_dim_a = to_i32(OP, "head_dim", head_dim)?;
        let rows_cap_a = to_u32(OP, "rows", rows_cap)?;
        let cfg = LaunchConfig {
            grid_dim: (rows_cap_a, to_u32(OP, "q_heads", q_heads)?, 1),
            block_dim: (ATTN_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let f = self.device.function("attention_gated")?;
        let mut launch = self.device.stream.launch_builder(f);
        launch
            .arg(qg)
            .arg(k)
            .arg(v)
            .arg(batch.cu_seqlens)
            .arg(&num_seqs)
            .arg(out)
            .arg(&q_heads_a)
            .arg(&kv_heads_a)
            .arg(&head_dim_a)
            .arg(&scale)
            .arg(&rows_cap_a);
        // SAFETY: argument types match the kernel; it stays below rows_cap in every buffer.
        unsafe { launch.launch(cfg) }.map_err(|e| driver_err(OP, e))?;
        Ok(())
    }

    fn attention_last(
        &self,
        qg: &CudaBuf,
        k: &CudaBuf,
        v: &CudaBuf,
        batch: Varlen<'_, CudaSlice<u32>>,
        dims: AttentionDims,
        out: &mut CudaBuf,
    ) -> KernelResult<()> {
        const OP: &str = "attention_last";
        let rows_cap = attention_rows(OP, qg, k, v, dims)?;
        check_batch(OP, &batch, rows_cap)?;
        if super::flash::flash_variant(dims.head_dim).is_none() {
            return Err(KernelError::invalid(
                OP,
                format!(
                    "head_dim {} is not a multiple of 16 up to 256 (the last-row kernel's sizes)",
                    dims.head_dim
                ),
            ));
        }
        let qg = act(OP, "qg", qg, 0)?;
        let k = act(OP, "k", k, 0)?;
        let v = act(OP, "v", v, 0)?;
        let out = act_mut(
            OP,
            "out",
            out,
            batch.num_seqs * dims.q_heads * dims.head_dim,
        )?;
        if batch.rows == 0 || batch.num_seqs == 0 {
            return Ok(());
        }
        let inputs = FlashInputs::Dense { qg, k, v };
        self.flash_attention(inputs, batch, dims, true, OutBuf::F32(out))
    }

    fn gated_attention(
        &self,
        qkv_buf: &mut CudaBuf,
        (q_norm, k_norm): (&CudaBuf, &CudaBuf),
        positions: &CudaSlice<u32>,
        rope: &Rope,
        eps: f32,
        batch: Varlen<'_, CudaSlice<u32>>,
        dims: AttentionDims,
        last_only: bool,
        out_b: &mut CudaBuf,
    ) -> KernelResult<()> {
        const OP: &str = "gated_attention";
        let AttentionDims {
            q_heads,
            kv_heads,
            head_dim,
            ..
        } = dims;
        if kv_heads == 0
            || q_heads % kv_heads != 0
            || super::flash::flash_variant(head_dim).is_none()
        {
            return Err(KernelError::invalid(
                OP,
                format!(
                    "needs q_heads ({q_heads}) a multiple of kv_heads ({kv_heads}) and head_dim \
                     ({head_dim}) a multiple of 16 up to 256 (the flash kernel's sizes)"
                ),
            ));
        }
        let width = dims.stacked_width();
        let rows_cap = Strided::dense(width).rows_in(qkv_buf.len(), width);
        check_batch(OP, &batch, rows_cap)?;
        let rows = batch.rows;
        let out_rows = if last_only { batch.num_seqs } else { rows };
        let qkv = act_mut(OP, "qkv", qkv_buf, rows * width)?;
        let norms = (
            weight(OP, "q_norm", q_norm, head_dim)?,
            weight(OP, "k_norm", k_norm, head_dim)?,
        );
        let positions = idx(OP, "positions", positions, rows * 3)?;
        let (table, half) = RopeTable::new(OP, rope, head_dim)?;
        let out = out_buf(OP, "out", out_b, out_rows * q_heads * head_dim)?;
        if rows == 0 || batch.num_seqs == 0 {
            return Ok(());
        }
        let inputs = FlashInputs::Stacked {
            qkv,
            norms,
            positions,
            rope: (&table, half),
            eps,
        };
        self.flash_attention(inputs, batch, dims, last_only, out)
    }

    fn conv1d_silu(
        &self,
        x: &CudaBuf,
        x_at: Strided,
        weight_buf: &CudaBuf,
        batch: Varlen<'_, CudaSlice<u32>>,
        channels: usize,
        kernel: usize,
        window_in: Option<&CudaBuf>,
        window_out: Option<&mut CudaBuf>,
        out: &mut CudaBuf,
    ) -> KernelResult<()> {
        self.conv(
            x,
            x_at,
            weight_buf,
            batch,
            channels,
            kernel,
            window_in,
            window_out,
            (0, 0.0),
            out,
            None,
        )
    }

    fn conv1d_silu_l2(
        &self,
        x: &CudaBuf,
        x_at: Strided,
        weight_buf: &CudaBuf,
        batch: Varlen<'_, CudaSlice<u32>>,
        channels: usize,
        kernel: usize,
        l2: HeadLayout,
        eps: f32,
        out: &mut CudaBuf,
    ) -> KernelResult<()> {
        // The conv kernel normalises heads that are whole channel tiles from channel 0 of a dense
        // output; any other layout takes the two kernels.
        if let Some(l2_channels) = conv_l2_channels(l2, channels) {
            self.conv(
                x,
                x_at,
                weight_buf,
                batch,
                channels,
                kernel,
                None,
                None,
                (l2_channels, eps),
                out,
                None,
            )
        } else {
            conv1d_silu_then_l2(
                self, x, x_at, weight_buf, batch, channels, kernel, l2, eps, out,
            )
        }
    }

    fn conv1d_silu_l2_gates(
        &self,
        x: &CudaBuf,
        x_at: Strided,
        weight_buf: &CudaBuf,
        batch: Varlen<'_, CudaSlice<u32>>,
        channels: usize,
        kernel: usize,
        (l2, eps): (HeadLayout, f32),
        out: &mut CudaBuf,
        gates: DeltaGates<'_, CudaBuf>,
        (beta, g): (&mut CudaBuf, &mut CudaBuf),
    ) -> KernelResult<()> {
        // One launch where the conv kernel takes the L2 layout and reads b and a as it reads x.
        let same_type = gates.b.dtype() == x.dtype() && gates.a.dtype() == x.dtype();
        match conv_l2_channels(l2, channels) {
            Some(l2_channels) if same_type => self.conv(
                x,
                x_at,
                weight_buf,
                batch,
                channels,
                kernel,
                None,
                None,
                (l2_channels, eps),
                out,
                Some((gates, beta, g)),
            ),
            _ => {
                self.conv1d_silu_l2(x, x_at, weight_buf, batch, channels, kernel, l2, eps, out)?;
                gates_apart(self, gates, batch.rows, (beta, g))
            }
        }
    }

    fn l2_norm(
        &self,
        x: &mut CudaBuf,
        layout: HeadLayout,
        rows: usize,
        eps: f32,
    ) -> KernelResult<()> {
        const OP: &str = "l2_norm";
        layout.check_fits(OP, x.len(), rows)?;
        let x = act_mut(OP, "x", x, 0)?;
        let kernel = L2_NORM[held_variant(layout.head_dim, 32, &WARP_HELD)];
        self.per_head(OP, kernel, x, None, layout, rows, eps)
    }

    fn delta_gates(
        &self,
        b: &CudaBuf,
        b_at: Strided,
        a: &CudaBuf,
        a_at: Strided,
        a_log: &CudaBuf,
        dt_bias: &CudaBuf,
        rows: usize,
        heads: usize,
        beta: &mut CudaBuf,
        g: &mut CudaBuf,
    ) -> KernelResult<()> {
        const OP: &str = "delta_gates";
        let b = in_buf(OP, "b", b, b_at.required_len(rows, heads))?;
        let a = in_buf(OP, "a", a, a_at.required_len(rows, heads))?;
        let kernel = match (&b, &a) {
            (InBuf::F32(_), InBuf::F32(_)) => "delta_gates",
            (InBuf::Bf16(_), InBuf::Bf16(_)) => "delta_gates_bf16x",
            _ => {
                return Err(KernelError::invalid(
                    OP,
                    "b and a must have the same type (both f32 or both bf16)",
                ))
            }
        };
        let a_log = weight(OP, "a_log", a_log, heads)?;
        let dt_bias = weight(OP, "dt_bias", dt_bias, heads)?;
        let beta = act_mut(OP, "beta", beta, rows * heads)?;
        let g = act_mut(OP, "g", g, rows * heads)?;
        if rows * heads == 0 {
            return Ok(());
        }
        let rows_a = to_i32(OP, "rows", rows)?;
        let heads_a = to_i32(OP, "heads", heads)?;
        let b_stride = to_i32(OP, "b row stride", b_at.row_stride)?;
        let b_offset = to_i32(OP, "b offset", b_at.offset)?;
        let a_stride = to_i32(OP, "a row stride", a_at.row_stride)?;
        let a_offset = to_i32(OP, "a offset", a_at.offset)?;
        let f = self.device.function(kernel)?;
        let mut launch = self.device.stream.launch_builder(f);
        b.push(&mut launch);
        launch.arg(&b_stride).arg(&b_offset);
        a.push(&mut launch);
        launch
            .arg(&a_stride)
            .arg(&a_offset)
            .arg(a_log)
            .arg(dt_bias)
            .arg(beta)
            .arg(g)
            .arg(&rows_a)
            .arg(&heads_a);
        // SAFETY: argument types match the kernel; b and a hold `rows` rows at their strides, beta
        // and g rows·heads values (checked above).
        unsafe { launch.launch(linear(OP, rows * heads, BLOCK)?) }
            .map_err(|e| driver_err(OP, e))?;
        Ok(())
    }

    /// The chunked kernel (delta_chunked.cu) where it takes the dims, else the token-by-token one.
    fn gated_delta_rule_chunked(
        &self,
        qkv: &CudaBuf,
        beta: &CudaBuf,
        g: &CudaBuf,
        batch: Varlen<'_, CudaSlice<u32>>,
        dims: DeltaDims,
        state: DeltaState<'_, Self>,
        out: &mut CudaBuf,
    ) -> KernelResult<()> {
        if self.delta_chunked_supports(dims) {
            self.delta_rule_chunked(qkv, beta, g, batch, dims, state, out, None)
        } else {
            self.delta_rule(qkv, beta, g, batch, dims, state, out)
        }
    }

    /// The chunked rule's first kernel reads the bf16 projection and does the conv, the L2 norms and
    /// the gates itself (`gdr_prepare_conv`, the same bits) where the shapes allow; else the ops
    /// one after the other.
    fn delta_net_core(
        &self,
        (x, x_at): (&CudaBuf, Strided),
        (conv_weight, kernel, l2_eps): (&CudaBuf, usize, f32),
        gates: DeltaGates<'_, CudaBuf>,
        batch: Varlen<'_, CudaSlice<u32>>,
        dims: DeltaDims,
        state: DeltaState<'_, Self>,
        (conv, beta, g): (&mut CudaBuf, &mut CudaBuf, &mut CudaBuf),
        out: &mut CudaBuf,
    ) -> KernelResult<()> {
        const OP: &str = "delta_net_core";
        let even = |v: usize| v.is_multiple_of(2);
        let fused = kernel == PROJECTION_CONV_TAPS
            && [x, gates.b, gates.a]
                .into_iter()
                .all(|b| b.dtype() == DType::Bf16)
            && gates.heads == dims.v_heads
            && [x_at.row_stride, x_at.offset, dims.k_dim, dims.v_dim]
                .into_iter()
                .all(even)
            && self.delta_chunked_supports(dims);
        if !fused {
            return delta_net_core_apart(
                self,
                (x, x_at),
                (conv_weight, kernel, l2_eps),
                gates,
                batch,
                dims,
                state,
                (conv, beta, g),
                out,
            );
        }
        let width = dims.qkv_width();
        let CudaBuf::Bf16(x) = x else {
            unreachable!("checked bf16 above")
        };
        let x_rows = x_at.rows_in(x.len(), width);
        if x_rows < batch.rows {
            return Err(KernelError::invalid(
                OP,
                format!(
                    "x holds {x_rows} rows of the q|k|v block, the batch has {}",
                    batch.rows
                ),
            ));
        }
        let proj = DeltaProjection {
            x,
            x_stride: to_i32(OP, "x row stride", x_at.row_stride)?,
            x_offset: to_i32(OP, "x offset", x_at.offset)?,
            conv_weight: weight(OP, "conv weight", conv_weight, width * kernel)?,
            gates: GateInputs::new(OP, &gates, batch.rows, true)?,
            l2_eps,
        };
        // The scratch is the plain form's input; here it only stands in for absent states.
        self.delta_rule_chunked(conv, beta, g, batch, dims, state, out, Some(proj))
    }

    fn gated_delta_rule_recurrent(
        &self,
        qkv: &CudaBuf,
        beta: &CudaBuf,
        g: &CudaBuf,
        batch: Varlen<'_, CudaSlice<u32>>,
        dims: DeltaDims,
        state: DeltaState<'_, Self>,
        out: &mut CudaBuf,
    ) -> KernelResult<()> {
        self.delta_rule(qkv, beta, g, batch, dims, state, out)
    }

    fn gated_rms_norm(
        &self,
        x: &mut CudaBuf,
        z: &CudaBuf,
        z_at: Strided,
        weight_buf: &CudaBuf,
        rows: usize,
        heads: usize,
        dim: usize,
        eps: f32,
    ) -> KernelResult<()> {
        const OP: &str = "gated_rms_norm";
        let norm_rows = rows * heads;
        let x = act_mut(OP, "x", x, norm_rows * dim)?;
        let gate = GateArgs::check(OP, z, z_at, rows, heads, dim)?;
        let w = weight(OP, "weight", weight_buf, dim)?;
        if norm_rows == 0 || dim == 0 {
            return Ok(());
        }
        let dim_a = to_i32(OP, "dim", dim)?;
        let f = self.device.function(if gate.is_bf16() {
            "gated_rms_norm_zbf16"
        } else {
            "gated_rms_norm"
        })?;
        let mut launch = self.device.stream.launch_builder(f);
        let rows_a = to_i32(OP, "rows", norm_rows)?;
        launch.arg(x);
        gate.push(&mut launch);
        launch.arg(w).arg(&rows_a).arg(&dim_a).arg(&eps);
        // SAFETY: argument types match the kernel; x holds rows·heads·dim values and z `rows` rows
        // of heads·dim at its stride (checked above). One warp per normalised row.
        unsafe { launch.launch(linear(OP, norm_rows * 32, BLOCK)?) }
            .map_err(|e| driver_err(OP, e))?;
        Ok(())
    }

    fn swiglu(
        &self,
        gate_up: &CudaBuf,
        rows: usize,
        inter: usize,
        out: &mut CudaBuf,
    ) -> KernelResult<()> {
        const OP: &str = "swiglu";
        let gate_up = in_buf(OP, "gate_up", gate_up, rows * 2 * inter)?;
        let out = act_mut(OP, "out", out, rows * inter)?;
        if rows * inter == 0 {
            return Ok(());
        }
        let rows_a = to_i32(OP, "rows", rows)?;
        let inter_a = to_i32(OP, "inter", inter)?;
        let kernel = match gate_up {
            InBuf::F32(_) => "swiglu",
            InBuf::Bf16(_) => "swiglu_from_bf16",
        };
        let f = self.device.function(kernel)?;
        let mut launch = self.device.stream.launch_builder(f);
        gate_up.push(&mut launch);
        launch.arg(out).arg(&rows_a).arg(&inter_a);
        // SAFETY: argument types match the kernel; lengths checked above.
        unsafe { launch.launch(swiglu_grid(OP, rows, inter)?) }.map_err(|e| driver_err(OP, e))?;
        Ok(())
    }

    fn gated_rms_norm_gemm(
        &self,
        x_buf: &mut CudaBuf,
        z_buf: &CudaBuf,
        z_at: Strided,
        norm_buf: &CudaBuf,
        rows: usize,
        heads: usize,
        dim: usize,
        eps: f32,
        w_buf: &CudaBuf,
        out_dim: usize,
        store: Store,
        y_buf: &mut CudaBuf,
    ) -> KernelResult<()> {
        const OP: &str = "gated_rms_norm_gemm";
        let (norm_rows, in_dim) = (rows * heads, heads * dim);
        let x = act(OP, "x", x_buf, norm_rows * dim)?;
        let gate = GateArgs::check(OP, z_buf, z_at, rows, heads, dim)?;
        let nw = weight(OP, "norm weight", norm_buf, dim)?;
        let w = weight(OP, "w", w_buf, out_dim * in_dim)?;
        let y = act_mut(OP, "y", y_buf, rows * out_dim)?;
        if rows == 0 || out_dim == 0 {
            return Ok(());
        }
        let rows_a = to_i32(OP, "rows", norm_rows)?;
        let dim_a = to_i32(OP, "dim", dim)?;
        let convert = |x_bf16: &mut CudaSlice<bf16>| {
            if in_dim == 0 {
                return Ok(());
            }
            let held = held_variant(dim, 32, &WARP_HELD);
            let f = self.device.function(if gate.is_bf16() {
                GATED_RMS_NORM_BF16_ZBF16[held]
            } else {
                GATED_RMS_NORM_BF16[held]
            })?;
            let mut launch = self.device.stream.launch_builder(f);
            launch.arg(x);
            gate.push(&mut launch);
            launch
                .arg(nw)
                .arg(x_bf16)
                .arg(&rows_a)
                .arg(&dim_a)
                .arg(&eps);
            // SAFETY: argument types match the kernel; x holds rows·heads·dim values, z `rows` rows
            // of heads·dim at its stride, the scratch rows·heads·dim (sized by the GEMM). One
            // warp per normalised row.
            unsafe { launch.launch(linear(OP, norm_rows * 32, BLOCK)?) }
                .map_err(|e| driver_err(OP, e))?;
            Ok(())
        };
        let input = GemmInput::Convert(convert);
        if in_dim > 0
            && self
                .blas
                .gemm(rows, in_dim, (w, out_dim, OutBuf::F32(y)), store, input)?
        {
            return Ok(());
        }
        // No cuBLASLt plan for the shape: the two-step form.
        self.gated_rms_norm(x_buf, z_buf, z_at, norm_buf, rows, heads, dim, eps)?;
        self.gemm_to(x_buf, w_buf, rows, in_dim, out_dim, store, y_buf)
    }

    fn swiglu_gemm(
        &self,
        gate_up: &CudaBuf,
        rows: usize,
        inter: usize,
        w_buf: &CudaBuf,
        out_dim: usize,
        act_buf: &mut CudaBuf,
        store: Store,
        y_buf: &mut CudaBuf,
    ) -> KernelResult<()> {
        const OP: &str = "swiglu_gemm";
        let gu = in_buf(OP, "gate_up", gate_up, rows * 2 * inter)?;
        let kernel = match gu {
            InBuf::F32(_) => "swiglu_bf16",
            InBuf::Bf16(_) => "swiglu_bf16_from_bf16",
        };
        let w = weight(OP, "w", w_buf, out_dim * inter)?;
        let y = act_mut(OP, "y", y_buf, rows * out_dim)?;
        if rows == 0 || out_dim == 0 {
            return Ok(());
        }
        let rows_a = to_i32(OP, "rows", rows)?;
        let inter_a = to_i32(OP, "inter", inter)?;
        let convert = |x_bf16: &mut CudaSlice<bf16>| {
            if inter == 0 {
                return Ok(());
            }
            let f = self.device.function(kernel)?;
            let mut launch = self.device.stream.launch_builder(f);
            gu.push(&mut launch);
            launch.arg(x_bf16).arg(&rows_a).arg(&inter_a);
            // SAFETY: argument types match the kernel; gate_up holds rows·2·inter values and the
            // scratch rows·inter (sized by the GEMM).
            unsafe { launch.launch(swiglu_grid(OP, rows, inter)?) }
                .map_err(|e| driver_err(OP, e))?;
            Ok(())
        };
        if inter > 0
            && self.blas.gemm(
                rows,
                inter,
                (w, out_dim, OutBuf::F32(y)),
                store,
                GemmInput::Convert(convert),
            )?
        {
            return Ok(());
        }
        // No cuBLASLt plan for the shape: the two-step form.
        self.swiglu(gate_up, rows, inter, act_buf)?;
        self.gemm_to(act_buf, w_buf, rows, inter, out_dim, store, y_buf)
    }

    fn gather_last(
        &self,
        x: &CudaBuf,
        batch: Varlen<'_, CudaSlice<u32>>,
        dim: usize,
        out: &mut CudaBuf,
    ) -> KernelResult<()> {
        const OP: &str = "gather_last";
        let rows_cap = check_batch(OP, &batch, x.len() / dim.max(1))?;
        let x = act(OP, "x", x, 0)?;
        let out = act_mut(OP, "out", out, batch.num_seqs * dim)?;
        if batch.num_seqs == 0 || dim == 0 {
            return Ok(());
        }
        if batch.num_seqs > 65_535 {
            return Err(KernelError::invalid(OP, "more than 65535 sequences"));
        }
        let dim_a = to_i32(OP, "dim", dim)?;
        let rows_cap_a = to_u32(OP, "rows", rows_cap)?;
        let cfg = LaunchConfig {
            grid_dim: (
                to_u32(OP, "dim", dim.div_ceil(BLOCK as usize))?,
                batch.num_seqs as u32,
                1,
            ),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let f = self.device.function("gather_last")?;
        let mut launch = self.device.stream.launch_builder(f);
        launch
            .arg(x)
            .arg(batch.cu_seqlens)
            .arg(out)
            .arg(&dim_a)
            .arg(&rows_cap_a);
        // SAFETY: argument types match the kernel; it reads only rows below rows_cap.
        unsafe { launch.launch(cfg) }.map_err(|e| driver_err(OP, e))?;
        Ok(())
    }
}

impl CudaBackend {
    /// A cuBLASLt GEMM (`x` rounded to bf16 on the way if f32); `false` if it has no plan.
    fn blas_gemm(
        &self,
        x: &CudaBuf,
        rows: usize,
        in_dim: usize,
        output: (&CudaSlice<bf16>, usize, OutBuf<'_>),
        store: Store,
    ) -> KernelResult<bool> {
        match x {
            CudaBuf::F32(x) => {
                let convert =
                    |x_bf16: &mut CudaSlice<bf16>| self.round_to_bf16(x, rows * in_dim, x_bf16);
                self.blas
                    .gemm(rows, in_dim, output, store, GemmInput::Convert(convert))
            }
            CudaBuf::Bf16(x) => {
                let ready = GemmInput::<fn(&mut CudaSlice<bf16>) -> KernelResult<()>>::Ready(x);
                self.blas.gemm(rows, in_dim, output, store, ready)
            }
        }
    }

    /// The shared-memory tiled GEMM (an f32 `x` is used unrounded): for shapes cuBLASLt refuses.
    #[allow(clippy::too_many_arguments)]
    fn tiled_gemm(
        &self,
        x: &CudaBuf,
        w: &CudaSlice<bf16>,
        rows: usize,
        in_dim: usize,
        out_dim: usize,
        store: Store,
        y: &mut CudaSlice<f32>,
    ) -> KernelResult<()> {
        const OP: &str = "gemm";
        let add = i32::from(store == Store::Add);
        let rows_a = to_i32(OP, "rows", rows)?;
        let in_a = to_i32(OP, "in_dim", in_dim)?;
        let out_a = to_i32(OP, "out_dim", out_dim)?;
        let cfg = LaunchConfig {
            grid_dim: (
                to_u32(OP, "grid", out_dim.div_ceil(GEMM_TILE as usize))?,
                to_u32(OP, "grid", rows.div_ceil(GEMM_TILE as usize))?,
                1,
            ),
            block_dim: (GEMM_TILE, GEMM_TILE, 1),
            shared_mem_bytes: 0,
        };
        if cfg.grid_dim.1 > 65_535 {
            return Err(KernelError::invalid(OP, format!("{rows} rows is too many")));
        }
        let f = self.device.function(match x {
            CudaBuf::F32(_) => "gemm_xwt",
            CudaBuf::Bf16(_) => "gemm_xwt_bf16x",
        })?;
        let mut launch = self.device.stream.launch_builder(f);
        match x {
            CudaBuf::F32(x) => launch.arg(x),
            CudaBuf::Bf16(x) => launch.arg(x),
        };
        launch
            .arg(w)
            .arg(y)
            .arg(&rows_a)
            .arg(&in_a)
            .arg(&out_a)
            .arg(&add);
        // SAFETY: argument types match the kernel; lengths checked above.
        unsafe { launch.launch(cfg) }.map_err(|e| driver_err(OP, e))?;
        Ok(())
    }

    /// `out[..n] = bf16(x[..n])`.
    fn round_to_bf16(
        &self,
        x: &CudaSlice<f32>,
        n: usize,
        out: &mut CudaSlice<bf16>,
    ) -> KernelResult<()> {
        const OP: &str = "f32_to_bf16";
        if n == 0 {
            return Ok(());
        }
        let n_a = i64::try_from(n).map_err(|_| KernelError::invalid(OP, "too many values"))?;
        let f = self.device.function("f32_to_bf16")?;
        let mut launch = self.device.stream.launch_builder(f);
        launch.arg(x).arg(out).arg(&n_a);
        // SAFETY: x and out hold at least n values (checked by the callers); the kernel reads and
        // writes below n.
        unsafe { launch.launch(linear(OP, n.div_ceil(2), BLOCK)?) }
            .map_err(|e| driver_err(OP, e))?;
        Ok(())
    }

    /// The gated delta rule, token by token (see delta.cu).
    #[allow(clippy::too_many_arguments)]
    fn delta_rule(
        &self,
        qkv: &CudaBuf,
        beta: &CudaBuf,
        g: &CudaBuf,
        batch: Varlen<'_, CudaSlice<u32>>,
        dims: DeltaDims,
        state: DeltaState<'_, Self>,
        out: &mut CudaBuf,
    ) -> KernelResult<()> {
        const OP: &str = "gated_delta_rule";
        let DeltaDims {
            k_heads,
            v_heads,
            k_dim,
            v_dim,
        } = dims;
        if k_heads == 0 || k_dim == 0 || v_dim == 0 || !v_heads.is_multiple_of(k_heads) {
            return Err(KernelError::invalid(
                OP,
                format!("v_heads {v_heads} must be a multiple of k_heads {k_heads}; dims > 0"),
            ));
        }
        if k_dim > DELTA_MAX_K || v_dim > DELTA_MAX_THREADS {
            return Err(KernelError::invalid(
                OP,
                format!("k_dim {k_dim} (max {DELTA_MAX_K}) or v_dim {v_dim} (max {DELTA_MAX_THREADS}) too large"),
            ));
        }
        let Some(args) = DeltaArgs::check(OP, qkv, beta, g, batch, dims, state, out)? else {
            return Ok(());
        };
        let cfg = LaunchConfig {
            grid_dim: (
                to_u32(OP, "num_seqs", batch.num_seqs)?,
                to_u32(OP, "v_heads", v_heads)?,
                1,
            ),
            block_dim: (to_u32(OP, "v_dim", v_dim.div_ceil(32) * 32)?, 1, 1),
            shared_mem_bytes: 0,
        };
        self.launch_delta(OP, "gated_delta_rule_recurrent", args, cfg)
    }

    /// Launches the token-by-token delta-rule kernel.
    fn launch_delta(
        &self,
        op: &'static str,
        kernel: &str,
        mut args: DeltaArgs<'_>,
        cfg: LaunchConfig,
    ) -> KernelResult<()> {
        let dims = args.dims;
        let k_heads_a = to_i32(op, "k_heads", dims.k_heads)?;
        let v_heads_a = to_i32(op, "v_heads", dims.v_heads)?;
        let k_dim_a = to_i32(op, "k_dim", dims.k_dim)?;
        let v_dim_a = to_i32(op, "v_dim", dims.v_dim)?;
        let scale = (dims.k_dim as f64).powf(-0.5) as f32;
        let rows_cap_a = to_u32(op, "rows", args.rows_cap)?;
        let f = self.device.function(kernel)?;
        let mut launch = self.device.stream.launch_builder(f);
        launch.arg(args.qkv).arg(args.beta).arg(args.g);
        args.push_states_and_out(&mut launch);
        launch
            .arg(&k_heads_a)
            .arg(&v_heads_a)
            .arg(&k_dim_a)
            .arg(&v_dim_a)
            .arg(&scale)
            .arg(&rows_cap_a);
        // SAFETY: argument types match the kernels; state buffers hold num_seqs states (checked
        // by DeltaArgs); the kernels clamp every sequence to rows_cap rows; the caller sized the
        // launch (and any dynamic shared memory) for the kernel.
        unsafe { launch.launch(cfg) }.map_err(|e| driver_err(op, e))?;
        Ok(())
    }

    /// Launches a one-warp-per-head kernel (`head_rms_norm` with a weight, `l2_norm` without).
    /// conv1d_silu, with the L2 norm of each head of the first `l2_channels` output channels
    /// (whole CONV_TILE_CH-wide heads; 0 for none) fused in.
    #[allow(clippy::too_many_arguments)]
    fn conv(
        &self,
        x: &CudaBuf,
        x_at: Strided,
        weight_buf: &CudaBuf,
        batch: Varlen<'_, CudaSlice<u32>>,
        channels: usize,
        kernel: usize,
        window_in: Option<&CudaBuf>,
        window_out: Option<&mut CudaBuf>,
        (l2_channels, l2_eps): (usize, f32),
        out: &mut CudaBuf,
        gates: Option<GatesOut<'_>>,
    ) -> KernelResult<()> {
        const OP: &str = "conv1d_silu";
        let l2_channels = to_i32(OP, "l2 channels", l2_channels)?;
        if kernel == 0 || channels == 0 || kernel > CONV_MAX_KERNEL {
            return Err(KernelError::invalid(
                OP,
                format!("kernel must be 1..={CONV_MAX_KERNEL} and channels > 0"),
            ));
        }
        // Rows both x (at its stride) and out hold: the kernels never touch a row beyond it.
        let rows_cap = x_at.rows_in(x.len(), channels).min(out.len() / channels);
        let rows_cap = check_batch(OP, &batch, rows_cap)?;
        let win_len = batch.num_seqs * (kernel - 1) * channels;
        let x_stride = to_i32(OP, "x row stride", x_at.row_stride)?;
        let x_offset = to_i32(OP, "x offset", x_at.offset)?;
        let x = in_buf(OP, "x", x, 0)?;
        let (conv_kernel, window_kernel) = match x {
            InBuf::F32(_) => ("conv1d_silu", "conv1d_window_out"),
            InBuf::Bf16(_) => ("conv1d_silu_bf16x", "conv1d_window_out_bf16x"),
        };
        let w = weight(OP, "weight", weight_buf, channels * kernel)?;
        let out = act_mut(OP, "out", out, 0)?;
        let window_in = window_in
            .map(|w| act(OP, "window_in", w, win_len))
            .transpose()?;
        let has_window = i32::from(window_in.is_some());
        // Absent inputs (the window, the gates) the kernels never read: a null pointer stands in.
        let null = 0u64;
        let num_seqs = to_i32(OP, "num_seqs", batch.num_seqs)?;
        let channels_a = to_i32(OP, "channels", channels)?;
        let kernel_a = to_i32(OP, "kernel", kernel)?;
        let rows_cap_a = to_u32(OP, "rows", rows_cap)?;
        if batch.num_seqs == 0 {
            return Ok(());
        }
        let mut gate_args = gates
            .map(|gates| ConvGates::new(OP, gates, rows_cap, x.is_bf16()))
            .transpose()?;
        if rows_cap > 0 {
            let f = self.device.function(conv_kernel)?;
            let mut launch = self.device.stream.launch_builder(f);
            x.push(&mut launch);
            launch
                .arg(&x_stride)
                .arg(&x_offset)
                .arg(w)
                .arg(batch.cu_seqlens)
                .arg(&num_seqs);
            push_or_null(&mut launch, window_in, &null);
            launch
                .arg(&has_window)
                .arg(&mut *out)
                .arg(&channels_a)
                .arg(&kernel_a)
                .arg(&rows_cap_a)
                .arg(&l2_channels)
                .arg(&l2_eps);
            ConvGates::push(gate_args.as_mut(), &mut launch, &null);
            // One block per tile of rows x channels (see conv.cu).
            let cfg = LaunchConfig {
                grid_dim: (
                    to_u32(OP, "rows", rows_cap.div_ceil(CONV_TILE_ROWS))?,
                    to_u32(OP, "channels", channels.div_ceil(CONV_TILE_CH))?,
                    1,
                ),
                block_dim: (CONV_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: argument types match the kernel; it stays below rows_cap rows.
            unsafe { launch.launch(cfg) }.map_err(|e| driver_err(OP, e))?;
        }
        if let Some(window_out) = window_out {
            let window_out = act_mut(OP, "window_out", window_out, win_len)?;
            if win_len > 0 {
                let f = self.device.function(window_kernel)?;
                let mut launch = self.device.stream.launch_builder(f);
                x.push(&mut launch);
                launch
                    .arg(&x_stride)
                    .arg(&x_offset)
                    .arg(batch.cu_seqlens)
                    .arg(&num_seqs);
                push_or_null(&mut launch, window_in, &null);
                launch
                    .arg(&has_window)
                    .arg(window_out)
                    .arg(&channels_a)
                    .arg(&kernel_a)
                    .arg(&rows_cap_a);
                // SAFETY: argument types match the kernel; window_out holds win_len values.
                unsafe { launch.launch(linear(OP, win_len, BLOCK)?) }
                    .map_err(|e| driver_err(OP, e))?;
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn per_head(
        &self,
        op: &'static str,
        kernel: &str,
        x: &mut CudaSlice<f32>,
        w: Option<&CudaSlice<bf16>>,
        layout: HeadLayout,
        rows: usize,
        eps: f32,
    ) -> KernelResult<()> {
        if rows == 0 || layout.heads == 0 {
            return Ok(());
        }
        let rows_a = to_i32(op, "rows", rows)?;
        let heads = to_i32(op, "heads", layout.heads)?;
        let head_dim = to_i32(op, "head_dim", layout.head_dim)?;
        let head_stride = to_i32(op, "head_stride", layout.head_stride)?;
        let row_stride = to_i32(op, "row_stride", layout.row_stride)?;
        let offset = to_i32(op, "offset", layout.offset)?;
        let f = self.device.function(kernel)?;
        let mut launch = self.device.stream.launch_builder(f);
        launch.arg(x);
        if let Some(w) = w {
            launch.arg(w);
        }
        launch
            .arg(&rows_a)
            .arg(&heads)
            .arg(&head_dim)
            .arg(&head_stride)
            .arg(&row_stride)
            .arg(&offset)
            .arg(&eps);
        // One warp (32 threads) per head.
        let cfg = linear(op, rows * layout.heads * 32, BLOCK)?;
        // SAFETY: argument types match the kernel; the layout was checked against x.
        unsafe { launch.launch(cfg) }.map_err(|e| driver_err(op, e))?;
        Ok(())
    }
}
