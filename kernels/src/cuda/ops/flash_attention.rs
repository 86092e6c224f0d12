//! Launch of the tensor-core flash attention kernels (`kernels/cuda/flash_attention.cu`).
//!
//! [`super::attention`] checks the arguments, then routes head dims this kernel supports here and
//! keeps the naive `attention_gated` kernel for the rest.
//!
//! Two shapes: the wide kernel (128 query rows, 8 warps, one block per SM at head size 256) for
//! long sequences, the narrow one (64 rows, 4 warps, two blocks per SM) for batches whose mean
//! sequence length is below 1,024, where the wide one mostly waits on memory.
//!
//! The vision tower's bidirectional attention at head size 64 runs on Hopper's warpgroup MMAs
//! instead (`kernels/cuda/flash_bidir_wgmma.cu`; the same bits as the mma.sync layouts, faster),
//! unless a layout is forced.
//!
//! Both read Q, K and V in bf16 (so their tiles stream in with cp.async): a first kernel,
//! `flash_bf16_inputs` (or, from a stacked projection, rope.cu's `attention_prologue`), writes them
//! from the f32 activations into the workspace's flash scratch.

use std::sync::atomic::{AtomicUsize, Ordering};

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use half::bf16;

use super::super::buffers::OutBuf;
use super::super::compile::GpuArch;
use super::super::device::driver_err;
use super::super::launch::{linear, to_i32, to_u32, Gpu};
use super::super::workspace::{FlashScratch, ScratchGuard};
use super::rope::RopeTable;
use super::shared::opt_in_smem;
use super::vision::AxialFreqs;
use crate::backend::{AttentionDims, KernelResult, Varlen};
use crate::error::KernelError;

/// Query rows per block of the wide kernel (8 warps of 16 rows; one block per SM at d = 256).
const BM: usize = 128;
/// Query rows per block of the narrow kernel (4 warps; two blocks per SM at d = 256).
const BM_NARROW: usize = 64;
/// Keys per shared-memory tile (`FA_BN`).
const BN: usize = 64;
/// bf16 padding per shared-memory row (`FA_PAD`).
const PAD: usize = 8;
/// Batches whose mean sequence length is below this take the narrow kernel: their blocks see few
/// key tiles, so the wide kernel (one block per SM) mostly waits on memory.
const NARROW_BELOW_MEAN_LEN: usize = 1024;
/// The narrow kernel puts its query tiles on grid y, which CUDA caps at 65,535.
const GRID_Y_MAX: usize = 65_535;

/// Testing and benchmarking override of the kernel choice: 0 = by batch shape, else the query
/// rows per block to force (`BM` or `BM_NARROW`). Process-wide.
static FORCE_ROWS: AtomicUsize = AtomicUsize::new(0);

/// The Hopper bidirectional kernel (`flash_bidir_wgmma_d64`): query rows per block (two
/// warpgroups of 64), keys per shared-memory stage and stages in its ring, as compiled.
const WGMMA_BM: usize = 128;
const WGMMA_BN: usize = 64;
const WGMMA_STAGES: usize = 3;
/// Its threads per block (two warpgroups).
const WGMMA_THREADS: u32 = 256;

/// Threads per block of the bf16 conversion.
const CONVERT_BLOCK: u32 = 256;
/// Threads per block of `attention_prologue` (one warp per head).
const PROLOGUE_BLOCK: u32 = 256;

/// How the last-row kernel spreads a batch's keys: `(splits, tiles_per_split)` for a batch of
/// `rows` rows whose last rows make `blocks` (query heads × sequences) blocks on a GPU of `sms`
/// SMs. When the blocks alone fill two per SM, no split (`(1, _)`); otherwise each block's key
/// tiles are cut into enough splits to fill them, each split as many tiles as the longest
/// sequence possible (all `rows`) needs. The host never reads `cu_seqlens` (the launch stays
/// capturable), so the cut assumes that longest sequence; shorter ones leave splits idle.
pub(crate) fn last_row_split(rows: usize, blocks: usize, sms: usize) -> (usize, usize) {
    let max_tiles = rows.div_ceil(BN).max(1);
    let want = (2 * sms.max(1)).div_ceil(blocks.max(1)).clamp(1, max_tiles);
    let per_split = max_tiles.div_ceil(want);
    (max_tiles.div_ceil(per_split), per_split)
}

/// Key tiles per split of the batch-invariant last-row form (256 keys).
///
/// A sequence's last row is then summed over splits of `INVARIANT_TILES_PER_SPLIT` of its own key
/// tiles, merged in order: `ceil(ceil(len / 64) / 4)` splits, a function of its own length only,
/// whatever else is in the batch (the split kernel skips the splits past a sequence's tiles and
/// the merge reads only its own). Every batch takes the split form, even where no sequence needs
/// more than one split, since the unsplit kernel rounds differently. Four tiles: a 712-id
/// question's 12 tiles make 3 splits (48 blocks of its 16 heads), a 15,446-id prompt's 242 make
/// 61; and the partial rows (`[num_seqs][q_heads][splits][d + 2]` f32, splits sized for the
/// longest sequence the batch could hold) stay within a quarter of the bf16 Q scratch for batches
/// of up to 32 sequences (`num_seqs / (32 · 4)` of it in general).
const INVARIANT_TILES_PER_SPLIT: usize = 4;

/// The batch-invariant last-row split of a batch of `rows` rows: `(splits, tiles_per_split)` with
/// the tiles per split fixed, enough splits for the longest sequence the batch could hold.
pub(crate) fn invariant_last_row_split(rows: usize) -> (usize, usize) {
    let max_tiles = rows.div_ceil(BN).max(1);
    (
        max_tiles.div_ceil(INVARIANT_TILES_PER_SPLIT),
        INVARIANT_TILES_PER_SPLIT,
    )
}

/// One shape of the flash kernel: query rows per block (16 per warp), whether query tiles run on
/// grid x (wide) or grid y (narrow: heads on x, so the heads of a kv group run side by side and
/// share K/V in L2), and whether it computes each sequence's last row only (one block per
/// sequence, on its last tile).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FlashShape {
    pub rows: usize,
    pub tiles_on_y: bool,
    pub last_row: bool,
    /// Last-row form over key splits (grid z), merged by `flash_last_combine`.
    pub split: bool,
    /// The prefix form: each sequence's queries follow its prefix keys (joined key rows).
    pub prefix: bool,
    /// The bidirectional form (the vision tower): no causal mask, no gate.
    pub bidir: bool,
}

pub(crate) const WIDE: FlashShape = FlashShape {
    rows: BM,
    tiles_on_y: false,
    last_row: false,
    split: false,
    prefix: false,
    bidir: false,
};

pub(crate) const NARROW: FlashShape = FlashShape {
    rows: BM_NARROW,
    tiles_on_y: true,
    last_row: false,
    split: false,
    prefix: false,
    bidir: false,
};

/// The narrow layout, for `attention_last`.
pub(crate) const LAST_ROW: FlashShape = FlashShape {
    last_row: true,
    ..NARROW
};

/// The last-row layout over key splits.
pub(crate) const LAST_SPLIT: FlashShape = FlashShape {
    split: true,
    ..LAST_ROW
};

/// The narrow layout over joined prefix and own keys (a batch carrying prefix states).
pub(crate) const PREFIX_NARROW: FlashShape = FlashShape {
    prefix: true,
    ..NARROW
};

/// The last-row layout (unsplit) over joined prefix and own keys.
pub(crate) const PREFIX_LAST: FlashShape = FlashShape {
    prefix: true,
    ..LAST_ROW
};

/// The last-row layout over key splits of joined prefix and own keys (the batch-invariant form).
pub(crate) const PREFIX_LAST_SPLIT: FlashShape = FlashShape {
    prefix: true,
    ..LAST_SPLIT
};

/// The narrow layout, bidirectional within each segment (the vision tower's images).
pub(crate) const BIDIR: FlashShape = FlashShape {
    bidir: true,
    ..NARROW
};

/// The wide layout, bidirectional within each segment: for long segments (a whole screenshot).
pub(crate) const BIDIR_WIDE: FlashShape = FlashShape {
    bidir: true,
    ..WIDE
};

impl FlashShape {
    /// The entry point laid out for head size `d` (64, 128 or 256, from [`flash_variant`]).
    pub fn kernel(self, d: usize) -> &'static str {
        if self.bidir {
            return match (self.tiles_on_y, d) {
                (true, 64) => "flash_attention_bidir_d64",
                (true, 128) => "flash_attention_bidir_d128",
                (true, _) => "flash_attention_bidir_d256",
                (false, 64) => "flash_attention_bidir_wide_d64",
                (false, 128) => "flash_attention_bidir_wide_d128",
                (false, _) => "flash_attention_bidir_wide_d256",
            };
        }
        if self.prefix {
            return match (self.last_row, self.split, d) {
                (true, true, 64) => "flash_attention_prefix_last_split_d64",
                (true, true, 128) => "flash_attention_prefix_last_split_d128",
                (true, true, _) => "flash_attention_prefix_last_split_d256",
                (true, false, 64) => "flash_attention_prefix_last_d64",
                (true, false, 128) => "flash_attention_prefix_last_d128",
                (true, false, _) => "flash_attention_prefix_last_d256",
                (false, _, 64) => "flash_attention_prefix_d64",
                (false, _, 128) => "flash_attention_prefix_d128",
                (false, _, _) => "flash_attention_prefix_d256",
            };
        }
        match (self.last_row && self.split, d) {
            (true, 64) => return "flash_attention_last_split_d64",
            (true, 128) => return "flash_attention_last_split_d128",
            (true, _) => return "flash_attention_last_split_d256",
            _ => {}
        }
        match (self.last_row, self.tiles_on_y, d) {
            (true, _, 64) => "flash_attention_last_d64",
            (true, _, 128) => "flash_attention_last_d128",
            (true, _, _) => "flash_attention_last_d256",
            (false, false, 64) => "flash_attention_d64",
            (false, false, 128) => "flash_attention_d128",
            (false, false, _) => "flash_attention_d256",
            (false, true, 64) => "flash_attention_narrow_d64",
            (false, true, 128) => "flash_attention_narrow_d128",
            (false, true, _) => "flash_attention_narrow_d256",
        }
    }

    fn threads(self) -> u32 {
        // 32 threads per warp, 16 query rows per warp.
        (self.rows * 2) as u32
    }

    /// Dynamic shared memory at head size `d`: the Q tile, one K and one V tile, bf16 with padded
    /// rows.
    pub fn smem_bytes(self, d: usize) -> usize {
        (self.rows + 2 * BN) * (d + PAD) * 2
    }

    /// Query tiles to launch for a batch: `Σ ceil(len_s / rows) ≤ ceil(rows / rows) + num_seqs`,
    /// an upper bound that needs no look at `cu_seqlens` (blocks beyond the real count exit); one
    /// per sequence for the last-row kernel.
    pub fn tiles(self, rows: usize, num_seqs: usize) -> usize {
        if self.last_row {
            num_seqs
        } else {
            rows.div_ceil(self.rows) + num_seqs
        }
    }
}

/// The shape for a batch: narrow for short sequences (mean length below
/// `NARROW_BELOW_MEAN_LEN`) unless its grid would exceed the grid-y cap, wide otherwise; or the
/// forced one (see [`force_query_rows`]).
pub(crate) fn flash_shape(rows: usize, num_seqs: usize) -> FlashShape {
    narrow_or_wide((NARROW, WIDE), rows, num_seqs)
}

/// The bidirectional layout for a batch, by the same rule as [`flash_shape`]: a whole screenshot
/// takes the wide one. Both sum each row's keys in the same order.
pub(crate) fn bidir_shape(rows: usize, num_seqs: usize) -> FlashShape {
    narrow_or_wide((BIDIR, BIDIR_WIDE), rows, num_seqs)
}

fn narrow_or_wide(
    (narrow, wide): (FlashShape, FlashShape),
    rows: usize,
    num_seqs: usize,
) -> FlashShape {
    let narrow_fits = narrow.tiles(rows, num_seqs) <= GRID_Y_MAX;
    match FORCE_ROWS.load(Ordering::Relaxed) {
        BM_NARROW if narrow_fits => narrow,
        BM => wide,
        _ if narrow_fits && rows < num_seqs.saturating_mul(NARROW_BELOW_MEAN_LEN) => narrow,
        _ => wide,
    }
}

/// The kernel entry point for `head_dim` and the head size it lays its tiles out for, or `None`
/// where the naive kernel must run (head dims that are not a multiple of 16, or above 256).
pub(crate) fn flash_variant(head_dim: usize) -> Option<(&'static str, usize)> {
    if head_dim == 0 || !head_dim.is_multiple_of(16) {
        return None;
    }
    match head_dim {
        1..=64 => Some(("flash_attention_d64", 64)),
        65..=128 => Some(("flash_attention_d128", 128)),
        129..=256 => Some(("flash_attention_d256", 256)),
        _ => None,
    }
}

/// Forces the flash attention kernel shape for every later call in this process, for tests
/// and benchmarks: `Some(128)` the wide kernel, `Some(64)` the narrow one (unless a batch's
/// grid would not fit it), `None` (or any other value) back to choosing by batch shape.
pub(crate) fn force_query_rows(rows: Option<usize>) {
    FORCE_ROWS.store(rows.unwrap_or(0), Ordering::Relaxed);
}

/// Gated causal GQA attention with the flash kernel: every row, or with `last` each sequence's
/// last row only (into `out[s]`). The caller (`attention`, `attention_last`,
/// `gated_attention`) has checked the dims, that the inputs hold `batch.rows` rows and `out` the
/// rows written, and that `flash_variant(head_dim)` is `Some`; `batch.rows` and
/// `batch.num_seqs` are non-zero. Dense inputs need an f32 `out` (the gate's sigmoid goes
/// there first).
pub(crate) fn flash_attention(
    gpu: &Gpu,
    inputs: FlashInputs<'_>,
    batch: Varlen<'_, CudaSlice<u32>>,
    (dims, last): (AttentionDims, bool),
    mut out: OutBuf<'_>,
) -> KernelResult<()> {
    const OP: &str = "attention";
    let Some((_, d)) = flash_variant(dims.head_dim) else {
        return Err(KernelError::invalid(
            OP,
            format!("flash attention does not take head_dim {}", dims.head_dim),
        ));
    };
    let carried = match &inputs {
        FlashInputs::Stacked { carried, .. } => *carried,
        FlashInputs::Dense { .. } => None,
    };
    let prefix_rows = carried.map_or(0, |c| c.rows);
    let q_len = batch.rows * dims.q_heads * d;
    let kv_len = (batch.rows + prefix_rows) * dims.kv_heads * d;
    let (shape, splits, per_split) = if carried.is_some() {
        if PREFIX_NARROW.tiles(batch.rows, batch.num_seqs) > GRID_Y_MAX {
            return Err(KernelError::invalid(
                OP,
                format!("{} rows exceed the prefix kernel's grid", batch.rows),
            ));
        }
        if last && gpu.blas.batch_invariant() {
            // Split over the joined keys as the whole prompt's last row is: the same sums.
            let (splits, per_split) = invariant_last_row_split(batch.rows + prefix_rows);
            (PREFIX_LAST_SPLIT, splits, per_split)
        } else {
            (if last { PREFIX_LAST } else { PREFIX_NARROW }, 1, 0)
        }
    } else if last && gpu.blas.batch_invariant() {
        let (splits, per_split) = invariant_last_row_split(batch.rows);
        (LAST_SPLIT, splits, per_split)
    } else if last {
        let blocks = dims.q_heads * batch.num_seqs;
        match last_row_split(batch.rows, blocks, gpu.device.sm_count) {
            (1, _) => (LAST_ROW, 1, 0),
            (splits, per_split) => (LAST_SPLIT, splits, per_split),
        }
    } else {
        (flash_shape(batch.rows, batch.num_seqs), 1, 0)
    };
    let partial_len = if shape.split {
        dims.q_heads * batch.num_seqs * splits * (d + 2)
    } else {
        0
    };
    let mut guard = flash_scratch(gpu, OP, (q_len, kv_len, partial_len))?;
    let scratch = guard.scratch();
    let rows = to_u32(OP, "rows", batch.rows)?;
    let q_heads = to_i32(OP, "q_heads", dims.q_heads)?;
    let kv_heads = to_i32(OP, "kv_heads", dims.kv_heads)?;
    let head_dim = to_i32(OP, "head_dim", dims.head_dim)?;
    let d_a = to_i32(OP, "head size", d)?;
    // Every row's gate is turned into its sigmoid before the flash kernel, by every thread of
    // the GPU at once (in the epilogue it would wait at the end of the longest blocks); the
    // last-row form takes the sigmoid of its one row itself.
    let gates = i32::from(!last);
    // Whether the flash kernel finds the gates' sigmoid in `out` (else in qg's gate columns).
    let (qg, qg_stride, gate_in_out) = match inputs {
        FlashInputs::Dense { qg, k, v } => {
            let OutBuf::F32(gate_out) = &mut out else {
                return Err(KernelError::invalid(
                    OP,
                    "dense inputs need an f32 output (it holds the gate's sigmoid first)",
                ));
            };
            let gate_heads = if last { 0 } else { dims.q_heads };
            let items = batch.rows * (dims.q_heads + 2 * dims.kv_heads + gate_heads) * (d / 8);
            let cfg = linear(OP, items, CONVERT_BLOCK)?;
            // SAFETY: argument types match the kernel; it reads `rows` rows of qg, k and v
            // (held, checked by the caller) and writes that many rows of the scratch (sized
            // above) and, with `gates`, of `out` (which holds `rows` rows then).
            unsafe {
                gpu.launch(OP, "flash_bf16_inputs", cfg, |launch| {
                    launch
                        .arg(qg)
                        .arg(k)
                        .arg(v)
                        .arg(&rows)
                        .arg(&q_heads)
                        .arg(&kv_heads)
                        .arg(&head_dim)
                        .arg(&d_a)
                        .arg(&dims.scale)
                        .arg(&mut scratch.q)
                        .arg(&mut scratch.k)
                        .arg(&mut scratch.v)
                        .arg(&mut **gate_out)
                        .arg(&gates);
                })?;
            }
            (qg, 2 * dims.q_heads * dims.head_dim, gates)
        }
        FlashInputs::Stacked {
            qkv,
            norms: (q_norm, k_norm),
            positions,
            rope,
            eps,
            carried,
        } => {
            // Without a carried state the prologue writes rows in place (cu_seqlens stands in
            // for the unread prefix offsets).
            let cu_prefix = carried.map_or(batch.cu_seqlens, |c| c.cu_prefix);
            let prefix_rows_a = to_u32(OP, "prefix rows", prefix_rows)?;
            let write_back = i32::from(carried.is_some());
            let row_stride = to_i32(OP, "stacked row", dims.stacked_width())?;
            let half = to_i32(OP, "rotary pairs", rope.1)?;
            let rows_i = to_i32(OP, "rows", batch.rows)?;
            let num_seqs = to_i32(OP, "num_seqs", batch.num_seqs)?;
            // The last-row kernel reads the queries of each sequence's last row only.
            let last_only = i32::from(last);
            let gate_heads = if last { 0 } else { dims.q_heads };
            let warps = batch.rows * (dims.q_heads + 2 * dims.kv_heads + gate_heads);
            let mut cfg = linear(OP, warps * 32, PROLOGUE_BLOCK)?;
            cfg.shared_mem_bytes = to_u32(
                OP,
                "prologue shared memory",
                PROLOGUE_BLOCK as usize / 32 * dims.head_dim * 4,
            )?;
            // SAFETY: argument types match the kernel; qkv holds `rows` stacked rows, positions
            // rows·3 values and the norms head_dim values (checked by the caller); it writes
            // that many rows of the scratch (sized above) and the gates of qkv in place.
            unsafe {
                gpu.launch(OP, "attention_prologue", cfg, |launch| {
                    launch
                        .arg(&mut *qkv)
                        .arg(&row_stride)
                        .arg(&q_heads)
                        .arg(&kv_heads)
                        .arg(&head_dim)
                        .arg(&d_a)
                        .arg(q_norm)
                        .arg(k_norm)
                        .arg(positions)
                        .arg(rope.0)
                        .arg(&half)
                        .arg(&rows_i)
                        .arg(&eps)
                        .arg(&dims.scale)
                        .arg(&mut scratch.q)
                        .arg(&mut scratch.k)
                        .arg(&mut scratch.v)
                        .arg(&gates)
                        .arg(batch.cu_seqlens)
                        .arg(&num_seqs)
                        .arg(&last_only)
                        .arg(cu_prefix)
                        .arg(&prefix_rows_a)
                        .arg(&write_back);
                })?;
            }
            if let Some(Carried {
                cu_prefix,
                keys: Some((pk, pv)),
                rows: p_rows,
            }) = carried
            {
                let items = p_rows * 2 * dims.kv_heads * (d / 8);
                let cfg = linear(OP, items, CONVERT_BLOCK)?;
                // SAFETY: argument types match the kernel; it reads `p_rows` rows of pk and pv
                // (checked by the caller) and writes joined rows below rows + p_rows of the
                // scratch (sized above).
                unsafe {
                    gpu.launch(OP, "flash_prefix_rows", cfg, |launch| {
                        launch
                            .arg(pk)
                            .arg(pv)
                            .arg(&prefix_rows_a)
                            .arg(&kv_heads)
                            .arg(&head_dim)
                            .arg(&d_a)
                            .arg(cu_prefix)
                            .arg(batch.cu_seqlens)
                            .arg(&num_seqs)
                            .arg(&mut scratch.k)
                            .arg(&mut scratch.v);
                    })?;
                }
            }
            (&*qkv, dims.stacked_width(), 0)
        }
    };
    let smem = shape.smem_bytes(d);
    let kernel = shape.kernel(d);
    opt_in(gpu, OP, kernel, shape.tiles_on_y, smem)?;
    let tiles = to_u32(OP, "query tiles", shape.tiles(batch.rows, batch.num_seqs))?;
    let heads = to_u32(OP, "q_heads", dims.q_heads)?;
    let splits_a = to_u32(OP, "key splits", splits)?;
    let cfg = LaunchConfig {
        grid_dim: if shape.tiles_on_y {
            (heads, tiles, splits_a)
        } else {
            (tiles, heads, 1)
        },
        block_dim: (shape.threads(), 1, 1),
        shared_mem_bytes: to_u32(OP, "shared memory", smem)?,
    };
    let num_seqs = to_i32(OP, "num_seqs", batch.num_seqs)?;
    let qg_stride = qg_stride as i64;
    let out_bf16 = i32::from(out.is_bf16());
    let per_split_a = to_i32(OP, "tiles per split", per_split)?;
    let prefix_rows_u32 = to_u32(OP, "prefix rows", prefix_rows)?;
    // SAFETY: argument types match the kernel; it clamps every sequence boundary to `rows`,
    // which every buffer holds (checked by the caller); a split launch writes
    // q_heads·num_seqs·splits partial rows of d + 2 (the scratch holds them).
    unsafe {
        gpu.launch(OP, kernel, cfg, |launch| {
            launch
                .arg(&scratch.q)
                .arg(&scratch.k)
                .arg(&scratch.v)
                .arg(qg)
                .arg(&qg_stride)
                .arg(&gate_in_out)
                .arg(batch.cu_seqlens)
                .arg(&num_seqs)
                .arg(&rows);
            out.push(launch);
            launch
                .arg(&out_bf16)
                .arg(&q_heads)
                .arg(&kv_heads)
                .arg(&head_dim)
                .arg(&per_split_a)
                .arg(&mut scratch.partial);
            if let Some(c) = carried {
                launch.arg(c.cu_prefix).arg(&prefix_rows_u32);
            }
        })?;
    }
    if !shape.split {
        return Ok(());
    }
    let cfg = LaunchConfig {
        grid_dim: (to_u32(OP, "num_seqs", batch.num_seqs)?, heads, 1),
        block_dim: (
            to_u32(OP, "head_dim", dims.head_dim.next_multiple_of(32))?,
            1,
            1,
        ),
        shared_mem_bytes: 0,
    };
    let splits_i = to_i32(OP, "key splits", splits)?;
    // SAFETY: argument types match the kernel; it reads the partial rows the split launch
    // wrote for the splits holding key tiles of each sequence (the same count as there) and
    // writes num_seqs rows of out (held, checked by the caller).
    unsafe {
        gpu.launch(OP, "flash_last_combine", cfg, |launch| {
            launch
                .arg(&scratch.partial)
                .arg(&splits_i)
                .arg(&per_split_a)
                .arg(batch.cu_seqlens)
                .arg(&num_seqs)
                .arg(&rows)
                .arg(qg)
                .arg(&qg_stride);
            out.push(launch);
            launch.arg(&out_bf16).arg(&q_heads).arg(&head_dim).arg(&d_a);
            // Without a prefix, cu_seqlens stands in for the offsets (none read: 0 rows).
            launch
                .arg(carried.map_or(batch.cu_seqlens, |c| c.cu_prefix))
                .arg(&prefix_rows_u32);
        })
    }
}

/// Sets `kernel`'s shared-memory attributes (`smem` bytes; the largest carveout where two blocks
/// share an SM). Above 48 KiB a kernel must opt in. Setting it on every launch costs a host-side
/// driver call, is no stream operation (so it is fine during graph capture), and keeps the
/// attribute with the function, whichever backend instance launches it.
fn opt_in(
    gpu: &Gpu,
    op: &'static str,
    kernel: &str,
    two_blocks_per_sm: bool,
    smem: usize,
) -> KernelResult<()> {
    opt_in_smem(gpu, op, kernel, smem)?;
    if two_blocks_per_sm {
        // Two blocks per SM (the narrow layout, the wgmma kernel) need the largest shared-memory
        // carveout (a hint the driver may otherwise size for one block).
        gpu.device
            .function(kernel)?
            .set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                100,
            )
            .map_err(|e| driver_err("attention: shared memory carveout", e))?;
    }
    Ok(())
}

/// The vision tower's qkv product before its bias and rotary, which the bidirectional kernel's
/// inputs then add and apply on the way (`flash_bidir_inputs_rope`, the same f32 operations as
/// `add_bias` and `rope_axial` first).
#[derive(Clone, Copy)]
pub(crate) struct RawQkv<'a> {
    /// `[3·heads·head_dim]`, bf16.
    pub bias: &'a CudaSlice<bf16>,
    /// `[rows, 2]`: each row's patch row and column.
    pub positions: &'a CudaSlice<u32>,
    pub freqs: AxialFreqs,
}

/// Bidirectional attention within each segment (the vision tower's images) on the flash kernel:
/// `qkv` rows `[q | k | v][heads][head_dim]` f32, `out` rows `[heads][head_dim]` f32 or bf16 (the
/// next GEMM's input: each f32 result rounded to nearest even as it is stored), scores
/// scaled by `scale`; Q, K and V rounded to bf16 first (`flash_bidir_inputs`, or with `raw` the bias
/// added and q and k rotated on the way). The caller checked that `flash_variant` takes `head_dim`,
/// the batch and the buffers' sizes.
pub(crate) fn flash_bidirectional(
    gpu: &Gpu,
    (qkv, raw): (&CudaSlice<f32>, Option<RawQkv<'_>>),
    batch: Varlen<'_, CudaSlice<u32>>,
    (heads, head_dim, scale): (usize, usize, f32),
    mut out: OutBuf<'_>,
) -> KernelResult<()> {
    const OP: &str = "attention_bidirectional";
    let Some((_, d)) = flash_variant(head_dim) else {
        return Err(KernelError::invalid(
            OP,
            format!("flash attention does not take head_dim {head_dim}"),
        ));
    };
    let shape = bidir_shape(batch.rows, batch.num_seqs);
    let tiles = shape.tiles(batch.rows, batch.num_seqs);
    if shape.tiles_on_y && tiles > GRID_Y_MAX {
        return Err(KernelError::invalid(
            OP,
            format!("{} rows exceed the kernel's grid", batch.rows),
        ));
    }
    let values = batch.rows * heads * d;
    let mut guard = flash_scratch(gpu, OP, (values, values, 0))?;
    let scratch = guard.scratch();
    let rows = to_u32(OP, "rows", batch.rows)?;
    let heads_a = to_i32(OP, "heads", heads)?;
    let head_dim_a = to_i32(OP, "head_dim", head_dim)?;
    let d_a = to_i32(OP, "head size", d)?;
    match raw {
        None => {
            let cfg = linear(OP, batch.rows * 3 * heads * (d / 8), CONVERT_BLOCK)?;
            // SAFETY: argument types match the kernel; qkv holds `rows` rows of 3·heads·head_dim
            // (checked by the caller) and the scratch rows·heads·d values of each (sized above).
            unsafe {
                gpu.launch(OP, "flash_bidir_inputs", cfg, |launch| {
                    launch
                        .arg(qkv)
                        .arg(&rows)
                        .arg(&heads_a)
                        .arg(&head_dim_a)
                        .arg(&d_a)
                        .arg(&scale)
                        .arg(&mut scratch.q)
                        .arg(&mut scratch.k)
                        .arg(&mut scratch.v);
                })?;
            }
        }
        Some(raw) => {
            if d != head_dim || !head_dim.is_multiple_of(16) {
                return Err(KernelError::invalid(
                    OP,
                    format!("the bias and rotary go in on the way for head sizes of 64, 128 or 256, not {head_dim}"),
                ));
            }
            let cfg = linear(OP, batch.rows * 3 * heads * (head_dim / 16), CONVERT_BLOCK)?;
            // SAFETY: argument types match the kernel; qkv holds `rows` rows of 3·heads·head_dim,
            // the bias 3·heads·head_dim values and positions rows·2 (checked by the caller), the
            // scratch rows·heads·d values of each (sized above; d = head_dim).
            unsafe {
                gpu.launch(OP, "flash_bidir_inputs_rope", cfg, |launch| {
                    launch
                        .arg(qkv)
                        .arg(raw.bias)
                        .arg(raw.positions)
                        .arg(&raw.freqs)
                        .arg(&rows)
                        .arg(&heads_a)
                        .arg(&head_dim_a)
                        .arg(&scale)
                        .arg(&mut scratch.q)
                        .arg(&mut scratch.k)
                        .arg(&mut scratch.v);
                })?;
            }
        }
    }
    if uses_wgmma_bidir(gpu, head_dim) {
        return wgmma_bidirectional(gpu, scratch, batch, heads, out);
    }
    let kernel = shape.kernel(d);
    let smem = shape.smem_bytes(d);
    opt_in(gpu, OP, kernel, shape.tiles_on_y, smem)?;
    let (heads_g, tiles_g) = (
        to_u32(OP, "heads", heads)?,
        to_u32(OP, "query tiles", tiles)?,
    );
    let cfg = LaunchConfig {
        grid_dim: if shape.tiles_on_y {
            (heads_g, tiles_g, 1)
        } else {
            (tiles_g, heads_g, 1)
        },
        block_dim: (shape.threads(), 1, 1),
        shared_mem_bytes: to_u32(OP, "shared memory", smem)?,
    };
    let num_seqs = to_i32(OP, "num_seqs", batch.num_seqs)?;
    let (unread_stride, unread_flag, no_splits) = (0i64, 0i32, 0i32);
    let out_bf16 = i32::from(out.is_bf16());
    // SAFETY: argument types match the kernel; it clamps every segment to `rows`, which the
    // scratch and `out` (checked by the caller) hold; the gate arguments are not read.
    unsafe {
        gpu.launch(OP, kernel, cfg, |launch| {
            launch
                .arg(&scratch.q)
                .arg(&scratch.k)
                .arg(&scratch.v)
                .arg(qkv)
                .arg(&unread_stride)
                .arg(&unread_flag)
                .arg(batch.cu_seqlens)
                .arg(&num_seqs)
                .arg(&rows);
            out.push(launch);
            launch
                .arg(&out_bf16)
                .arg(&heads_a)
                .arg(&heads_a)
                .arg(&head_dim_a)
                .arg(&no_splits)
                .arg(&mut scratch.partial);
        })
    }
}

/// Whether the bidirectional attention of heads of `head_dim` runs on the Hopper kernel: heads of
/// exactly 64 on an sm_90 GPU (its kernels are compiled for sm_90a), with no layout forced.
fn uses_wgmma_bidir(gpu: &Gpu, head_dim: usize) -> bool {
    head_dim == 64 && gpu.device.arch == GpuArch::SM_90 && FORCE_ROWS.load(Ordering::Relaxed) == 0
}

/// Shared memory of `flash_bidir_wgmma_d64`: the Q tile, the K and V stages (rows of 128 bytes),
/// and 1 KiB to align them to the swizzle's period.
const fn wgmma_smem_bytes() -> usize {
    1024 + WGMMA_BM * 128 + WGMMA_STAGES * WGMMA_BN * 128 * 2
}

/// `flash_bidir_wgmma_d64` over the bf16 Q, K and V in `scratch` (heads of 64).
fn wgmma_bidirectional(
    gpu: &Gpu,
    scratch: &FlashScratch,
    batch: Varlen<'_, CudaSlice<u32>>,
    heads: usize,
    mut out: OutBuf<'_>,
) -> KernelResult<()> {
    const OP: &str = "attention_bidirectional";
    const KERNEL: &str = "flash_bidir_wgmma_d64";
    let smem = wgmma_smem_bytes();
    opt_in(gpu, OP, KERNEL, true, smem)?;
    let tiles = batch.rows.div_ceil(WGMMA_BM) + batch.num_seqs;
    let cfg = LaunchConfig {
        grid_dim: (
            to_u32(OP, "query tiles", tiles)?,
            to_u32(OP, "heads", heads)?,
            1,
        ),
        block_dim: (WGMMA_THREADS, 1, 1),
        shared_mem_bytes: to_u32(OP, "shared memory", smem)?,
    };
    let rows = to_u32(OP, "rows", batch.rows)?;
    let num_seqs = to_i32(OP, "num_seqs", batch.num_seqs)?;
    let heads_a = to_i32(OP, "heads", heads)?;
    let out_bf16 = i32::from(out.is_bf16());
    // SAFETY: argument types match the kernel; it clamps every segment to `rows`, which the
    // scratch (rows·heads·64 values of each) and `out` (checked by the caller) hold.
    unsafe {
        gpu.launch(OP, KERNEL, cfg, |launch| {
            launch
                .arg(&scratch.q)
                .arg(&scratch.k)
                .arg(&scratch.v)
                .arg(batch.cu_seqlens)
                .arg(&num_seqs)
                .arg(&rows);
            out.push(launch);
            launch.arg(&out_bf16).arg(&heads_a);
        })
    }
}

/// The flash kernels' bf16 Q, K and V scratch and partial rows, holding at least `need` (values of
/// Q, of K or V, of the partial rows).
pub(crate) fn flash_scratch<'g>(
    gpu: &'g Gpu,
    op: &'static str,
    need: (usize, usize, usize),
) -> KernelResult<ScratchGuard<'g, FlashScratch>> {
    let stream = &gpu.device.stream;
    gpu.workspace
        .flash
        .get(&gpu.workspace, op, need, |(q_len, kv_len, partial_len)| {
            let alloc = |n: usize| {
                stream
                    .alloc_zeros::<bf16>(n)
                    .map_err(|e| driver_err("attention bf16 scratch", e))
            };
            Ok(FlashScratch {
                q: alloc(q_len)?,
                k: alloc(kv_len)?,
                v: alloc(kv_len)?,
                // Splits fill at most two blocks per SM beyond the unsplit blocks: sized for that
                // at the largest head size, so it need not grow with the batch.
                partial: stream
                    .alloc_zeros::<f32>(partial_len.max(4 * gpu.device.sm_count * (256 + 2)))
                    .map_err(|e| driver_err("attention partial rows", e))?,
            })
        })
}

/// Where the flash kernels' inputs come from.
pub(crate) enum FlashInputs<'a> {
    /// Separate f32 `qg`, `k`, `v` (rows as [`AttentionDims`] says), q and k already normed and
    /// rotated: `flash_bf16_inputs` rounds them to bf16.
    Dense {
        qg: &'a CudaSlice<f32>,
        k: &'a CudaSlice<f32>,
        v: &'a CudaSlice<f32>,
    },
    /// One stacked projection ([`AttentionDims::stacked_width`]) before the q/k head norms and
    /// rope, which `attention_prologue` applies as it rounds to bf16 (q and k in `qkv` stay as
    /// they were; the gates become their sigmoid).
    Stacked {
        qkv: &'a mut CudaSlice<f32>,
        norms: (&'a CudaSlice<bf16>, &'a CudaSlice<bf16>),
        positions: &'a CudaSlice<u32>,
        /// The rope kernel's table and its number of pairs.
        rope: (&'a RopeTable, usize),
        eps: f32,
        /// A batch carrying prefix states: the prefix form of the kernels, k normed and roped
        /// written back into `qkv` (for the snapshots).
        carried: Option<Carried<'a>>,
    },
}

/// The prefix keys of a carrying batch: sequence s's are rows `cu_prefix[s]..cu_prefix[s + 1]`
/// of `keys` (f32, `kv_heads·head_dim` wide, k normed and roped), `rows` in all (0, with `keys`
/// `None`, for a batch that only takes snapshots).
#[derive(Clone, Copy)]
pub(crate) struct Carried<'a> {
    pub cu_prefix: &'a CudaSlice<u32>,
    pub keys: Option<(&'a CudaSlice<f32>, &'a CudaSlice<f32>)>,
    pub rows: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_dims_route_to_the_smallest_layout_that_holds_them() {
        assert_eq!(flash_variant(256), Some(("flash_attention_d256", 256)));
        assert_eq!(flash_variant(144), Some(("flash_attention_d256", 256)));
        assert_eq!(flash_variant(128), Some(("flash_attention_d128", 128)));
        assert_eq!(flash_variant(80), Some(("flash_attention_d128", 128)));
        assert_eq!(flash_variant(64), Some(("flash_attention_d64", 64)));
        assert_eq!(flash_variant(16), Some(("flash_attention_d64", 64)));
        for naive in [0, 8, 24, 40, 100, 255, 272, 512] {
            assert_eq!(flash_variant(naive), None, "head_dim {naive}");
        }
        for d in [64, 128, 256] {
            let (wide, _) = flash_variant(d).unwrap();
            assert_eq!(WIDE.kernel(d), wide);
            assert_eq!(NARROW.kernel(d), format!("flash_attention_narrow_d{d}"));
            assert_eq!(LAST_ROW.kernel(d), format!("flash_attention_last_d{d}"));
            assert_eq!(
                LAST_SPLIT.kernel(d),
                format!("flash_attention_last_split_d{d}")
            );
            assert_eq!(
                PREFIX_NARROW.kernel(d),
                format!("flash_attention_prefix_d{d}")
            );
            assert_eq!(
                PREFIX_LAST.kernel(d),
                format!("flash_attention_prefix_last_d{d}")
            );
            assert_eq!(
                PREFIX_LAST_SPLIT.kernel(d),
                format!("flash_attention_prefix_last_split_d{d}")
            );
            assert_eq!(BIDIR.kernel(d), format!("flash_attention_bidir_d{d}"));
            assert_eq!(
                BIDIR_WIDE.kernel(d),
                format!("flash_attention_bidir_wide_d{d}")
            );
        }
        // Every entry point is compiled from its source.
        let listed = crate::cuda::sources::KERNEL_SOURCES
            .iter()
            .flat_map(|src| src.functions.iter().copied())
            .collect::<Vec<_>>();
        for shape in [
            WIDE,
            NARROW,
            LAST_ROW,
            LAST_SPLIT,
            PREFIX_NARROW,
            PREFIX_LAST,
            PREFIX_LAST_SPLIT,
            BIDIR,
            BIDIR_WIDE,
        ] {
            for d in [64, 128, 256] {
                assert!(listed.contains(&shape.kernel(d)), "{}", shape.kernel(d));
            }
        }
        assert!(listed.contains(&"flash_prefix_rows"));
    }

    #[test]
    fn long_images_take_the_wide_bidirectional_layout() {
        // One 1024x1024 screenshot: 4,096 patches in one segment.
        assert_eq!(bidir_shape(4096, 1), BIDIR_WIDE);
        // Small images (the tiny model's, thumbnails) stay narrow.
        assert_eq!(bidir_shape(64, 1), BIDIR);
        assert_eq!(bidir_shape(3000, 4), BIDIR);
    }

    #[test]
    fn last_rows_split_their_keys_until_two_blocks_per_sm() {
        // One 712-row question on 132 SMs: 16 heads, 12 key tiles, one tile per split.
        assert_eq!(last_row_split(712, 16, 132), (12, 1));
        // 15,446 rows: 17 splits wanted, 242 tiles: 15 per split, 17 splits.
        assert_eq!(last_row_split(15_446, 16, 132), (17, 15));
        // One key tile: nothing to split.
        assert_eq!(last_row_split(64, 16, 132), (1, 1));
        assert_eq!(last_row_split(1, 16, 132), (1, 1));
        // Enough sequences to fill the GPU: no split.
        assert_eq!(last_row_split(128 * 300, 16 * 128, 132).0, 1);
        assert_eq!(last_row_split(32 * 300, 16 * 32, 132).0, 1);
        // A few sequences: some splits, every tile of the longest possible sequence covered.
        for (rows, blocks) in [(2_537, 32), (1_270, 96), (700, 48), (5, 16)] {
            let (splits, per_split) = last_row_split(rows, blocks, 132);
            assert!(splits * per_split >= rows.div_ceil(BN), "{rows} rows");
            assert!(
                (splits - 1) * per_split < rows.div_ceil(BN),
                "{rows} rows: an empty split"
            );
            assert!(
                splits * blocks <= 2 * 132 + blocks,
                "{rows} rows: too many blocks"
            );
        }
    }

    #[test]
    fn invariant_last_rows_split_by_their_own_length() {
        // Four key tiles per split whatever the batch: enough splits for its longest possible
        // sequence, so a sequence of n tiles finds its ceil(n / 4) splits in any batch.
        assert_eq!(invariant_last_row_split(1), (1, 4));
        assert_eq!(invariant_last_row_split(256), (1, 4));
        assert_eq!(invariant_last_row_split(257), (2, 4));
        assert_eq!(invariant_last_row_split(712), (3, 4));
        assert_eq!(invariant_last_row_split(15_446), (61, 4));
        for rows in [1, 63, 64, 65, 700, 9_600, 16_384, 38_400] {
            let (splits, per_split) = invariant_last_row_split(rows);
            let tiles = rows.div_ceil(BN);
            assert!(splits * per_split >= tiles, "{rows} rows: keys left out");
            assert!(
                (splits - 1) * per_split < tiles,
                "{rows} rows: an empty split"
            );
            // Any one sequence of the batch uses the splits its own tiles need.
            for len in [1, 64, 65, 256, 257, rows] {
                let own = len.min(rows).div_ceil(BN).div_ceil(per_split);
                assert!(own <= splits, "{rows} rows, a {len}-row sequence");
            }
        }
    }

    #[test]
    fn shared_memory_fits_one_wide_or_two_narrow_blocks_per_sm() {
        // H200 allows 227 KiB per block and 228 KiB per SM (1 KiB of each block reserved), A100
        // 163 / 164 KiB.
        assert_eq!(WIDE.smem_bytes(256), 135_168);
        assert!(WIDE.smem_bytes(256) <= 163 * 1024);
        assert_eq!(NARROW.smem_bytes(256), 101_376);
        assert!(2 * (NARROW.smem_bytes(256) + 1024) <= 228 * 1024);
        assert_eq!(WIDE.threads(), 256);
        assert_eq!(NARROW.threads(), 128);
    }

    #[test]
    fn short_sequences_take_the_narrow_kernel() {
        // The override is process-wide; these tests never set it.
        assert_eq!(flash_shape(15_446, 1), WIDE);
        assert_eq!(flash_shape(139, 1), NARROW);
        assert_eq!(flash_shape(712, 1), NARROW);
        assert_eq!(flash_shape(128 * 300, 128), NARROW);
        assert_eq!(flash_shape(1023, 1), NARROW);
        assert_eq!(flash_shape(1024, 1), WIDE);
        assert_eq!(flash_shape(4 * 2_000, 4), WIDE);
        // A grid that would not fit grid y stays wide.
        assert_eq!(flash_shape(70_000, 70_000), WIDE);
    }

    #[test]
    fn the_grid_bounds_the_tiles_of_any_split() {
        // Σ ceil(len / BM) over any split of `rows` into `n` sequences is at most this.
        for lens in [
            &[1usize][..],
            &[128],
            &[129],
            &[1, 127, 128, 129, 300],
            &[15_446],
        ] {
            let rows: usize = lens.iter().sum();
            for shape in [WIDE, NARROW] {
                let tiles: usize = lens.iter().map(|l| l.div_ceil(shape.rows)).sum();
                assert!(tiles <= shape.tiles(rows, lens.len()), "{lens:?}");
            }
            assert_eq!(LAST_ROW.tiles(rows, lens.len()), lens.len());
        }
    }
}
