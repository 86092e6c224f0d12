//! The causal depthwise conv + SiLU (`kernels/cuda/conv.cu`), with the L2 norm of the q and k heads
//! and the delta rule's gates fused in where the layout allows, and the carried window's copy.

use cudarc::driver::{CudaSlice, LaunchArgs, LaunchConfig, PushKernelArg};

use super::super::buffers::{act, act_mut, idx, in_buf, weight, CudaBuf, InBuf};
use super::super::launch::{linear, to_i32, to_u32, Gpu, BLOCK};
use super::shared::{check_batch, GateInputs};
use crate::backend::{
    Conv1d, ConvWindow, DeltaGates, GateOutputs, HeadLayout, KernelResult, Varlen,
};
use crate::error::KernelError;

/// The conv1d block's tile (rows x channels), its threads, and the widest kernel it holds
/// (`CONV_TILE_ROWS`, `CONV_TILE_CH`, `CONV_THREADS`, `CONV_MAX_KERNEL` in conv.cu).
const CONV_TILE_ROWS: usize = 32;
const CONV_TILE_CH: usize = 128;
const CONV_THREADS: u32 = 256;
const CONV_MAX_KERNEL: usize = 8;

/// The delta rule's gates for the conv kernel to compute alongside: their inputs, then beta and g.
pub(crate) type GatesOut<'a> = (DeltaGates<'a, CudaBuf>, GateOutputs<'a, CudaBuf>);

/// The channels the conv kernel L2-normalises itself for `l2` (heads that are whole channel
/// tiles from channel 0 of a dense output), or `None` where the layout needs the separate kernel.
pub(crate) fn l2_channels(l2: HeadLayout, channels: usize) -> Option<usize> {
    let l2_channels = l2.heads * l2.head_dim;
    (l2.head_dim == CONV_TILE_CH
        && l2.head_stride == l2.head_dim
        && l2.offset == 0
        && l2.row_stride == channels
        && l2_channels <= channels)
        .then_some(l2_channels)
}

/// Pushes `buf`, or (absent) a null pointer in its place, for an optional input the kernel then
/// does not read.
fn push_or_null<'a>(launch: &mut LaunchArgs<'a>, buf: Option<&'a CudaSlice<f32>>, null: &'a u64) {
    match buf {
        Some(buf) => launch.arg(buf),
        None => launch.arg(null),
    };
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
        (gates, out): GatesOut<'a>,
        rows: usize,
        x_bf16: bool,
    ) -> KernelResult<Self> {
        let heads = gates.heads;
        Ok(Self {
            inputs: GateInputs::new(op, &gates, rows, x_bf16)?,
            beta: act_mut(op, "beta", out.beta, rows * heads)?,
            g: act_mut(op, "g", out.g, rows * heads)?,
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
                    .arg(c.inputs.heads());
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

/// Where the conv's input sits, as [`conv_window_out`] reads it: the row stride and offset of its
/// channels in `x`, its channels and taps, and the rows `x` holds.
pub(crate) struct WindowAt {
    pub x_stride: i32,
    pub x_offset: i32,
    pub channels: usize,
    pub kernel: usize,
    pub rows_cap: usize,
}

/// Writes each sequence's window to resume from into `window_out` (`conv1d_window_out`): its
/// last `kernel − 1` conv inputs, or those before `output_at[s]` where given, reaching back into
/// `window_in` for a sequence shorter than that.
pub(crate) fn conv_window_out(
    gpu: &Gpu,
    op: &'static str,
    (x, at): (InBuf<'_>, WindowAt),
    batch: Varlen<'_, CudaSlice<u32>>,
    window_in: Option<&CudaSlice<f32>>,
    (window_out, output_at): (&mut CudaBuf, Option<&CudaSlice<u32>>),
) -> KernelResult<()> {
    let win_len = batch.num_seqs * at.kernel.saturating_sub(1) * at.channels;
    let window_out = act_mut(op, "window_out", window_out, win_len)?;
    let output_at = output_at
        .map(|a| idx(op, "output_at", a, batch.num_seqs))
        .transpose()?;
    if win_len == 0 {
        return Ok(());
    }
    let kernel_name = match x {
        InBuf::F32(_) => "conv1d_window_out",
        InBuf::Bf16(_) => "conv1d_window_out_bf16x",
    };
    let null = 0u64;
    let has_window = i32::from(window_in.is_some());
    let has_output_at = i32::from(output_at.is_some());
    let num_seqs = to_i32(op, "num_seqs", batch.num_seqs)?;
    let channels = to_i32(op, "channels", at.channels)?;
    let kernel = to_i32(op, "kernel", at.kernel)?;
    let rows_cap = to_u32(op, "rows", at.rows_cap)?;
    // SAFETY: argument types match the kernel; window_out holds win_len values, window_in (where
    // present) as many (checked by the caller), and the kernel reads no row of x at or past
    // rows_cap.
    unsafe {
        gpu.launch(op, kernel_name, linear(op, win_len, BLOCK)?, |launch| {
            x.push(launch);
            launch
                .arg(&at.x_stride)
                .arg(&at.x_offset)
                .arg(batch.cu_seqlens)
                .arg(&num_seqs);
            push_or_null(launch, window_in, &null);
            launch
                .arg(&has_window)
                .arg(output_at.unwrap_or(batch.cu_seqlens))
                .arg(&has_output_at)
                .arg(window_out)
                .arg(&channels)
                .arg(&kernel)
                .arg(&rows_cap);
        })
    }
}

/// conv1d_silu, with the L2 norm of each head of the first `l2_channels` output channels
/// (whole CONV_TILE_CH-wide heads; 0 for none) and the gates (if given) fused in.
pub(crate) fn conv1d_silu(
    gpu: &Gpu,
    conv: Conv1d<'_, CudaBuf>,
    batch: Varlen<'_, CudaSlice<u32>>,
    window: ConvWindow<'_, CudaBuf, CudaSlice<u32>>,
    (l2_channels, l2_eps): (usize, f32),
    out: &mut CudaBuf,
    gates: Option<GatesOut<'_>>,
) -> KernelResult<()> {
    const OP: &str = "conv1d_silu";
    let (x, x_at, weight_buf, channels, kernel) =
        (conv.x, conv.x_at, conv.weight, conv.channels, conv.kernel);
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
    let conv_kernel = match x {
        InBuf::F32(_) => "conv1d_silu",
        InBuf::Bf16(_) => "conv1d_silu_bf16x",
    };
    let w = weight(OP, "weight", weight_buf, channels * kernel)?;
    let out = act_mut(OP, "out", out, 0)?;
    let window_in = window
        .input
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
        unsafe {
            gpu.launch(OP, conv_kernel, cfg, |launch| {
                x.push(launch);
                launch
                    .arg(&x_stride)
                    .arg(&x_offset)
                    .arg(w)
                    .arg(batch.cu_seqlens)
                    .arg(&num_seqs);
                push_or_null(launch, window_in, &null);
                launch
                    .arg(&has_window)
                    .arg(&mut *out)
                    .arg(&channels_a)
                    .arg(&kernel_a)
                    .arg(&rows_cap_a)
                    .arg(&l2_channels)
                    .arg(&l2_eps);
                ConvGates::push(gate_args.as_mut(), launch, &null);
            })?;
        }
    }
    if let Some(output) = window.output {
        let at = WindowAt {
            x_stride,
            x_offset,
            channels,
            kernel,
            rows_cap,
        };
        let output = (output, window.output_at);
        conv_window_out(gpu, OP, (x, at), batch, window_in, output)?;
    }
    Ok(())
}
