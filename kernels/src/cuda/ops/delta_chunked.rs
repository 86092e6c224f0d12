//! The chunked gated delta rule (`delta_chunked.cu`) in two kernels: `gdr_prepare` computes every
//! chunk's state-independent quantities at once (products on TF32 tensor cores, the triangular
//! inverse in f32), `gdr_state_pass` walks each sequence's
//! chunks in order doing only the state products, on bf16 tensor cores with f32 accumulation.
//! `gdr_prepare_conv` is the first kernel reading a Gated DeltaNet layer's bf16 input projection
//! instead of its conv output: it does the conv, the q/k L2 norms and the gates on the way in
//! ([`crate::Backend::delta_net_core`]).
//!
//! Earlier designs, measured on the H200 and dropped: one f32 SIMT kernel walking the chunks and
//! recomputing everything per slice of value columns (8.2 ms per layer at 15,446 tokens, 12.2 at
//! 128 × 300), and a 3xTF32 variant of it (9.7 and 14.3 ms).

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use half::bf16;

use super::super::buffers::{act, weight, CudaBuf, DType, InBuf};
use super::super::launch::{to_i32, to_u32, Gpu};
use super::super::workspace::{DeltaScratch, DELTA_CHUNK as CHUNK, DELTA_MAX_HEAD as MAX_HEAD};
use super::conv::{conv_window_out, WindowAt};
use super::shared::{opt_in_smem, CudaBuffers, DeltaArgs, GateInputs};
use crate::backend::{
    ConvWindow, DeltaDims, DeltaInputs, DeltaNetInput, DeltaNetScratch, DeltaState, KernelResult,
    Varlen,
};
use crate::error::KernelError;

/// Conv taps `gdr_prepare_conv` computes (`DC_KW`); other widths run the conv kernel.
const PROJECTION_CONV_TAPS: usize = 4;

/// What `gdr_prepare_conv` reads instead of the conv output and the gates: the q|k|v block of the
/// stacked in-projection (row stride and offset even, as its pair loads need), the conv weight
/// `[q|k|v channels][PROJECTION_CONV_TAPS]`, the gates' inputs, the L2 norm's epsilon, and the
/// windows the sequences resume from (`None`: zeros before each sequence).
pub(crate) struct DeltaProjection<'a> {
    x: &'a CudaSlice<bf16>,
    x_stride: i32,
    x_offset: i32,
    conv_weight: &'a CudaSlice<bf16>,
    gates: GateInputs<'a>,
    l2_eps: f32,
    window_in: Option<&'a CudaSlice<f32>>,
}
/// Threads of `gdr_prepare` (`DC_THREADS`).
const PREPARE_THREADS: u32 = 512;
/// Dynamic shared memory of `gdr_prepare`: q and k tiles (row stride 132), A and T (stride 68),
/// three 16×16 blocks, five per-token vectors; f32. Two blocks fit on an SM.
const PREPARE_SMEM: usize = 4 * (2 * CHUNK * 132 + 2 * CHUNK * 68 + 3 * 256 + 5 * CHUNK);

/// Dynamic shared memory of `gdr_state_pass` with `sv` value columns per block: two stages of
/// (W, q, k tiles of row stride 136, P of stride 72 in bf16; U of stride sv + 4 in f32; one γ,
/// padded to 16 bytes), then bf16 copies of the state and V' with row stride sv + 8 (`GsStage`).
const fn pass_smem_bytes(sv: usize) -> usize {
    let stage = 3 * CHUNK * 136 * 2 + CHUNK * 72 * 2 + CHUNK * (sv + 4) * 4 + 16;
    2 * stage + (MAX_HEAD + CHUNK) * (sv + 8) * 2
}

/// The state-pass kernel for `sv`-column slices: name, shared memory, threads (4 warps per 32
/// columns).
fn pass_kernel(sv: usize) -> (&'static str, usize, u32) {
    match sv {
        64 => ("gdr_state_pass_v64", pass_smem_bytes(64), 256),
        _ => ("gdr_state_pass_v32", pass_smem_bytes(32), 128),
    }
}

/// Whether 64-column slices suit `pairs` (sequence, head) pairs on `sms` SMs (one block per SM
/// fits, by shared memory). A 64-column block has twice the warps of a 32-column one and takes
/// about as long per chunk, so it halves the waves of a large batch; when the 32-column blocks all
/// fit in one wave (one long prompt: 32 pairs, 128 blocks) they spread the work over more SMs.
fn wide_slices_win(pairs: usize, v_dim: usize, sms: usize) -> bool {
    v_dim > 32 && pairs * v_dim.div_ceil(32) > sms
}

/// Whether [`delta_rule_chunked`] takes `dims` on this GPU (else the recurrent kernel runs,
/// which also reports invalid dims).
pub(crate) fn supports(gpu: &Gpu, dims: DeltaDims) -> bool {
    let (k_heads, v_heads, k_dim, v_dim) = (dims.k_heads, dims.v_heads, dims.k_dim, dims.v_dim);
    let shapes = k_heads > 0
        && v_heads.is_multiple_of(k_heads)
        && (1..=MAX_HEAD).contains(&k_dim)
        && (1..=MAX_HEAD).contains(&v_dim);
    // Opt-in shared memory per block: 227 KB on Hopper, 163 KB on A100.
    shapes && gpu.device.max_smem_optin >= pass_kernel(32).1.max(PREPARE_SMEM)
}

/// The gated delta rule by 64-token chunks; the caller checked [`supports`]. With `proj`, the
/// first kernel reads the projection (`gdr_prepare_conv`) and `qkv`, `beta` and `g` are only
/// checked (they stand in for absent states): the inputs and where the first kernel reads them.
pub(crate) fn delta_rule_chunked<B: CudaBuffers + ?Sized>(
    gpu: &Gpu,
    (inputs, proj): (DeltaInputs<'_, CudaBuf>, Option<DeltaProjection<'_>>),
    (batch, dims): (Varlen<'_, CudaSlice<u32>>, DeltaDims),
    state: DeltaState<'_, B>,
    out: &mut CudaBuf,
) -> KernelResult<()> {
    const OP: &str = "gated_delta_rule_chunked";
    if !supports(gpu, dims) {
        return Err(KernelError::invalid(
            OP,
            format!(
                "unsupported dims {dims:?} (k_dim, v_dim ≤ 128, v_heads a multiple of k_heads)"
            ),
        ));
    }
    let (k_heads, v_heads, k_dim, v_dim) = (dims.k_heads, dims.v_heads, dims.k_dim, dims.v_dim);
    let Some(mut args) = DeltaArgs::check(OP, inputs, batch, dims, state, out)? else {
        return Ok(());
    };
    let rows = args.rows_cap;
    // With no rows the state pass only copies the initial states (or zeros) out.
    let stream = &gpu.device.stream;
    let mut guard =
        gpu.workspace
            .delta
            .get(&gpu.workspace, OP, rows.max(1) * v_heads, |pairs| {
                DeltaScratch::new(stream, pairs)
            })?;
    let scratch = guard.scratch();

    let num_seqs_a = to_i32(OP, "num_seqs", batch.num_seqs)?;
    let k_heads_a = to_i32(OP, "k_heads", k_heads)?;
    let v_heads_a = to_i32(OP, "v_heads", v_heads)?;
    let k_dim_a = to_i32(OP, "k_dim", k_dim)?;
    let v_dim_a = to_i32(OP, "v_dim", v_dim)?;
    let scale = (k_dim as f64).powf(-0.5) as f32;
    let rows_a = to_u32(OP, "rows", rows)?;

    // 1. Every chunk at once. Chunk slots: Σ ceil(len / 64) ≤ ceil(rows / 64) + num_seqs.
    if rows > 0 {
        let slots = rows.div_ceil(CHUNK) + batch.num_seqs;
        let kernel = match proj {
            Some(_) => "gdr_prepare_conv",
            None => "gdr_prepare",
        };
        opt_in_smem(gpu, OP, kernel, PREPARE_SMEM)?;
        let cfg = LaunchConfig {
            grid_dim: (
                to_u32(OP, "chunk slots", slots)?,
                to_u32(OP, "v_heads", v_heads)?,
                1,
            ),
            block_dim: (PREPARE_THREADS, 1, 1),
            shared_mem_bytes: to_u32(OP, "shared memory", PREPARE_SMEM)?,
        };
        // SAFETY: argument types match the kernel; the inputs hold `rows` rows (DeltaArgs) and
        // the scratch rows · v_heads pairs; the kernel clamps every sequence to `rows`.
        unsafe {
            gpu.launch(OP, kernel, cfg, |launch| {
                match &proj {
                    Some(p) => {
                        launch
                            .arg(p.x)
                            .arg(&p.x_stride)
                            .arg(&p.x_offset)
                            .arg(p.conv_weight);
                        p.gates.push(launch);
                        launch.arg(&p.l2_eps);
                        match p.window_in {
                            Some(window) => launch.arg(window).arg(&1i32),
                            // Never read (has_window 0): the projection stands in.
                            None => launch.arg(p.x).arg(&0i32),
                        };
                    }
                    None => {
                        launch.arg(args.qkv).arg(args.beta).arg(args.g);
                    }
                }
                launch
                    .arg(args.cu_seqlens)
                    .arg(&num_seqs_a)
                    .arg(&k_heads_a)
                    .arg(&v_heads_a)
                    .arg(&k_dim_a)
                    .arg(&v_dim_a)
                    .arg(&scale)
                    .arg(&rows_a)
                    .arg(&mut scratch.w)
                    .arg(&mut scratch.u)
                    .arg(&mut scratch.q)
                    .arg(&mut scratch.k)
                    .arg(&mut scratch.p)
                    .arg(&mut scratch.gam);
            })?;
        }
    }

    // 2. The state pass.
    let sms = gpu.device.sm_count.max(1);
    let fits_64 = gpu.device.max_smem_optin >= pass_kernel(64).1;
    let sv = if fits_64 && wide_slices_win(batch.num_seqs * v_heads, v_dim, sms) {
        64
    } else {
        32
    };
    let (kernel, smem, threads) = pass_kernel(sv);
    opt_in_smem(gpu, OP, kernel, smem)?;
    let cfg = LaunchConfig {
        grid_dim: (
            to_u32(OP, "num_seqs", batch.num_seqs)?,
            to_u32(OP, "v_heads", v_heads)?,
            to_u32(OP, "value slices", v_dim.div_ceil(sv))?,
        ),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: to_u32(OP, "shared memory", smem)?,
    };
    // SAFETY: argument types match the kernel; state buffers hold num_seqs states (checked
    // by DeltaArgs); the scratch holds the rows the first kernel wrote; the kernel clamps every
    // sequence to `rows` and sizes its launch as `pass_kernel` says.
    unsafe {
        gpu.launch(OP, kernel, cfg, |launch| {
            launch
                .arg(&scratch.w)
                .arg(&scratch.u)
                .arg(&scratch.q)
                .arg(&scratch.k)
                .arg(&scratch.p)
                .arg(&scratch.gam);
            args.push_states_and_out(launch);
            launch
                .arg(&v_heads_a)
                .arg(&k_dim_a)
                .arg(&v_dim_a)
                .arg(&rows_a);
        })
    }
}

/// Whether [`delta_net_core`] takes this layer: the conv of `PROJECTION_CONV_TAPS` taps over a
/// bf16 projection whose gates are bf16 too, one gate head per value head, row stride, offset and
/// head sizes even (the pair loads), and dims the chunked form takes.
pub(crate) fn fuses(gpu: &Gpu, input: &DeltaNetInput<'_, CudaBuf>, dims: DeltaDims) -> bool {
    let even = |v: usize| v.is_multiple_of(2);
    let (x_at, gates) = (input.x_at, &input.gates);
    input.kernel == PROJECTION_CONV_TAPS
        && [input.x, gates.b, gates.a]
            .into_iter()
            .all(|b| b.dtype() == DType::Bf16)
        && gates.heads == dims.v_heads
        && [x_at.row_stride, x_at.offset, dims.k_dim, dims.v_dim]
            .into_iter()
            .all(even)
        && supports(gpu, dims)
}

/// [`crate::Backend::delta_net_core_carried`] with the first kernel reading the bf16 projection
/// and doing the conv (from the carried windows, where given), the L2 norms and the gates itself
/// (`gdr_prepare_conv`, the same bits as the ops apart), and the windows to resume from copied out
/// by the conv's own kernel; the caller checked [`fuses`].
pub(crate) fn delta_net_core<B: CudaBuffers + ?Sized>(
    gpu: &Gpu,
    input: DeltaNetInput<'_, CudaBuf>,
    (batch, dims): (Varlen<'_, CudaSlice<u32>>, DeltaDims),
    (state, window): (DeltaState<'_, B>, ConvWindow<'_, CudaBuf, CudaSlice<u32>>),
    scratch: DeltaNetScratch<'_, CudaBuf>,
    out: &mut CudaBuf,
) -> KernelResult<()> {
    const OP: &str = "delta_net_core";
    let x_at = input.x_at;
    let width = dims.qkv_width();
    let CudaBuf::Bf16(x) = input.x else {
        unreachable!("checked bf16 by `fuses`")
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
    let win_len = batch.num_seqs * (PROJECTION_CONV_TAPS - 1) * width;
    let window_in = window
        .input
        .map(|w| act(OP, "window_in", w, win_len))
        .transpose()?;
    let proj = DeltaProjection {
        x,
        x_stride: to_i32(OP, "x row stride", x_at.row_stride)?,
        x_offset: to_i32(OP, "x offset", x_at.offset)?,
        conv_weight: weight(OP, "conv weight", input.conv_weight, width * input.kernel)?,
        gates: GateInputs::new(OP, &input.gates, batch.rows, true)?,
        l2_eps: input.l2_eps,
        window_in,
    };
    if let Some(output) = window.output {
        let at = WindowAt {
            x_stride: proj.x_stride,
            x_offset: proj.x_offset,
            channels: width,
            kernel: PROJECTION_CONV_TAPS,
            rows_cap: x_rows,
        };
        let output = (output, window.output_at);
        conv_window_out(gpu, OP, (InBuf::Bf16(x), at), batch, window_in, output)?;
    }
    // The scratch is the plain form's input; here it only stands in for absent states.
    let inputs = DeltaInputs {
        qkv: &*scratch.conv,
        beta: &*scratch.beta,
        g: &*scratch.g,
    };
    delta_rule_chunked(gpu, (inputs, Some(proj)), (batch, dims), state, out)
}
