//! [`CudaBackend`]: the [`Backend`] ops as CUDA kernels (bf16 weights, f32 activations, f32
//! accumulation), launched on one stream.
//!
//! This file is the facade: memory (allocation, upload, copies) and the routing of each op to its
//! file under `ops/` (and, where a fused kernel does not take a shape, to the op's parts). The
//! ops borrow the [`Gpu`] context; nothing below imports this file.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaSlice};
use half::bf16;

use super::blas::{row_bucket, Blas};
use super::buffers::{check_copy, idx, CudaBuf};
use super::compile::GpuArch;
use super::device::{driver_err, CudaOptions, Device};
use super::graphs::{GraphProbe, Graphs};
use super::launch::Gpu;
use super::lock;
use super::ops::{
    attention, conv, delta, delta_chunked, elementwise, flash_attention, gemm, norms, rope, vision,
};
use super::tuning::TuningFile;
use super::upload::{IndexStaging, Staging};
use super::workspace::Workspace;
use crate::backend::{
    bias_rope_attention_apart, captured_shape, conv1d_silu_then_l2, delta_net_core_apart,
    delta_net_core_carried_apart, gemm_bias_gelu_apart, gemm_bias_residual_apart,
    qk_norm_then_rope, stacked_norm_rope, AttentionDims, AttentionOutput, Backend, Buffers, Conv1d,
    ConvWindow, CopyPart, DeltaCarry, DeltaDims, DeltaGates, DeltaInputs, DeltaNetInput,
    DeltaNetScratch, DeltaState, GateOutputs, GatedNorm, Gelu, GemmShape, HeadLayout, KernelResult,
    L2Heads, PassShape, PrefixKv, Projection, QkPrologue, Rope, RowNorm, Store, Varlen,
    VisionBackend,
};
use crate::error::KernelError;
use crate::patches::PatchRows;

/// The CUDA backend on one GPU.
pub struct CudaBackend {
    /// The device, cuBLASLt and the ops' scratch (with the activation byte count): what the op
    /// files borrow.
    gpu: Gpu,
    ordinal: usize,
    /// Bytes uploaded as weights (for metrics).
    weight_bytes: AtomicU64,
    /// The pinned buffer weights are uploaded through.
    staging: Staging,
    /// The pinned halves each pass's ids, positions and offsets go up through.
    index_staging: IndexStaging,
    /// Captured passes, with `cuda_graphs` on.
    graphs: Option<Graphs>,
    /// The device table of `copy_many`'s parts (grown as needed).
    copy_table: Mutex<Option<CudaSlice<u64>>>,
    /// Where `write_patch_rows` stages the images' bytes (grown as needed).
    patch_staging: Mutex<vision::PatchStaging>,
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
                let identity = Blas::tuning_identity(
                    &name,
                    &device.arch.nvrtc_target(),
                    options.batch_invariant,
                );
                Some(TuningFile::new(dir, &identity))
            }
            None => None,
        };
        let workspace = Workspace::default();
        let blas = Blas::new(
            device.stream.clone(),
            tuning_file,
            options.batch_invariant,
            workspace.capture.clone(),
        )?;
        let graphs = options
            .cuda_graphs
            .then(|| Graphs::new(device.ctx.clone(), device.stream.clone()));
        Ok(Self {
            gpu: Gpu {
                device,
                blas,
                workspace,
            },
            graphs,
            ordinal: options.ordinal,
            weight_bytes: AtomicU64::new(0),
            staging: Staging::default(),
            index_staging: IndexStaging::default(),
            copy_table: Mutex::new(None),
            patch_staging: Mutex::default(),
        })
    }

    /// The architecture the kernels were compiled for.
    pub fn arch(&self) -> GpuArch {
        self.gpu.device.arch
    }

    /// The first `len` values of an index buffer, read back once everything queued has run (for
    /// tests and diagnostics: a pass never reads its indices back).
    pub fn read_idx(&self, src: &CudaSlice<u32>, len: usize) -> KernelResult<Vec<u32>> {
        const OP: &str = "read_idx";
        self.gpu.workspace.capture.refuse(OP)?;
        idx(OP, "source", src, len)?;
        let stream = &self.gpu.device.stream;
        stream
            .clone_dtoh(&src.slice(..len))
            .map_err(|e| driver_err(OP, e))
    }

    /// GEMM shapes timed since start; shapes whose winner was in the tuning file (or timed
    /// earlier in the same row bucket) are not counted.
    pub fn gemm_tunings(&self) -> usize {
        self.gpu.blas.tunings()
    }

    /// The file the GEMM algorithms picked by timing are kept in across starts (`None` without a
    /// cache directory or with `no_cache`).
    pub fn gemm_tuning_file(&self) -> Option<&std::path::Path> {
        self.gpu.blas.tuning_path()
    }

    /// (free, total) device memory in bytes.
    pub fn memory_info(&self) -> KernelResult<(usize, usize)> {
        self.memory_probe().read()
    }

    /// A handle that reads this device's free and total memory from any thread (for metrics).
    pub fn memory_probe(&self) -> MemoryProbe {
        MemoryProbe {
            ctx: self.gpu.device.ctx.clone(),
        }
    }

    /// Device bytes this backend has allocated so far: (weights uploaded, everything else:
    /// activation and index buffers, GEMM workspace and scratch).
    pub fn allocated_bytes(&self) -> (u64, u64) {
        let weights = self.weight_bytes.load(Ordering::Relaxed);
        let buffers = self.gpu.workspace.bytes() + self.gpu.blas.bytes();
        (weights, buffers)
    }

    /// Forces the flash attention kernel shape for every later call in this process, for tests
    /// and benchmarks: `Some(128)` the wide kernel, `Some(64)` the narrow one (unless a batch's
    /// grid would not fit it), `None` (or any other value) back to choosing by batch shape.
    pub fn force_flash_query_rows(rows: Option<usize>) {
        flash_attention::force_query_rows(rows);
    }

    /// Reads what the captured passes did since start, from any thread; `None` with
    /// `cuda_graphs` off.
    pub fn graph_probe(&self) -> Option<GraphProbe> {
        self.graphs.as_ref().map(Graphs::probe)
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

    /// The chunked delta rule holds a sequence's state only between its 64-token chunks.
    fn snapshot_grid(&self) -> usize {
        super::DELTA_CHUNK_TOKENS
    }

    /// One forward per GEMM tuning bucket ([`row_bucket`]).
    fn warm_rows(&self, max_rows: usize) -> Vec<usize> {
        crate::backend::bucket_tops(max_rows, row_bucket)
    }

    /// A bucket whose winners are all stored (a tuning file from an earlier start) needs no
    /// forward: the GEMM tuning is all that a forward per bucket is for.
    fn warm_like(&self, rows: usize, like: usize) -> bool {
        self.gpu.blas.has_winners_like(rows, like)
    }

    fn reload_warm_state(&self) {
        self.gpu.blas.reload_winners();
    }

    fn pass_shape(&self, rows: usize, seqs: usize) -> Option<PassShape> {
        self.graphs.as_ref().and(captured_shape(rows, seqs))
    }

    fn run_layers(
        &self,
        shape: PassShape,
        layers: &mut dyn FnMut() -> KernelResult<()>,
    ) -> KernelResult<()> {
        match &self.graphs {
            Some(graphs) => graphs.run(shape, &self.gpu.workspace.capture, layers),
            None => layers(),
        }
    }

    fn alloc(&self, len: usize) -> KernelResult<CudaBuf> {
        self.gpu.workspace.capture.refuse("alloc")?;
        let slice = self.gpu.device.stream.alloc_zeros::<f32>(len);
        let slice = slice.map_err(|e| driver_err("alloc", e))?;
        self.gpu.workspace.add_bytes(4 * len as u64);
        Ok(CudaBuf::F32(slice))
    }

    /// A bf16 buffer: the norms write GEMM inputs in the precision the GEMM reads them.
    fn alloc_gemm_input(&self, len: usize) -> KernelResult<CudaBuf> {
        self.gpu.workspace.capture.refuse("alloc_gemm_input")?;
        let slice = self.gpu.device.stream.alloc_zeros::<bf16>(len);
        let slice = slice.map_err(|e| driver_err("alloc_gemm_input", e))?;
        self.gpu.workspace.add_bytes(2 * len as u64);
        Ok(CudaBuf::Bf16(slice))
    }

    fn alloc_idx(&self, len: usize) -> KernelResult<CudaSlice<u32>> {
        self.gpu.workspace.capture.refuse("alloc_idx")?;
        let slice = self.gpu.device.stream.alloc_zeros::<u32>(len);
        let slice = slice.map_err(|e| driver_err("alloc_idx", e))?;
        self.gpu.workspace.add_bytes(4 * len as u64);
        Ok(slice)
    }

    fn synchronize(&self) -> KernelResult<()> {
        self.gpu.workspace.capture.refuse("synchronize")?;
        self.gpu
            .device
            .stream
            .synchronize()
            .map_err(|e| driver_err("synchronize", e))
    }

    /// A buffer of this device, whichever backend allocated it: every backend of a device shares
    /// its primary context.
    fn can_read(&self, buf: &CudaBuf) -> bool {
        buf.ordinal() == self.ordinal
    }

    /// Uploads a weight in bf16 (the model stores its weights in bf16), rounded on every core into
    /// the pinned staging buffer (upload.rs): a 4B model is 4.2 G values.
    fn upload(&self, data: &[f32]) -> KernelResult<CudaBuf> {
        self.upload_stacked(&[data])
    }

    fn upload_stacked(&self, parts: &[&[f32]]) -> KernelResult<CudaBuf> {
        self.gpu.workspace.capture.refuse("upload")?;
        let slice = self
            .staging
            .upload(&self.gpu.device.ctx, &self.gpu.device.stream, parts)?;
        self.weight_bytes
            .fetch_add(2 * slice.len() as u64, Ordering::Relaxed);
        Ok(CudaBuf::Bf16(slice))
    }

    fn write(&self, dst: &mut CudaBuf, data: &[f32]) -> KernelResult<()> {
        self.write_parts(dst, &[data])
    }

    /// Into f32, one copy per part; into bf16 (a GEMM input), rounded by every core into the
    /// pinned staging buffer and copied from there at the bus's speed (the same bits as the
    /// GEMM's own rounding of an f32 input), returning once the values are on the device.
    fn write_parts(&self, dst: &mut CudaBuf, parts: &[&[f32]]) -> KernelResult<()> {
        const OP: &str = "write";
        self.gpu.workspace.capture.refuse(OP)?;
        let total: usize = parts.iter().map(|p| p.len()).sum();
        if dst.len() < total {
            return Err(KernelError::invalid(
                OP,
                format!("destination holds {} values, needs {total}", dst.len()),
            ));
        }
        let device = &self.gpu.device;
        match dst {
            CudaBuf::F32(s) => {
                let mut at = 0;
                for part in parts.iter().filter(|p| !p.is_empty()) {
                    device
                        .stream
                        .memcpy_htod(*part, &mut s.slice_mut(at..at + part.len()))
                        .map_err(|e| driver_err(OP, e))?;
                    at += part.len();
                }
                Ok(())
            }
            CudaBuf::Bf16(s) => self.staging.write(&device.ctx, &device.stream, s, parts),
        }
    }

    fn write_idx(&self, dst: &mut CudaSlice<u32>, data: &[u32]) -> KernelResult<()> {
        const OP: &str = "write_idx";
        self.gpu.workspace.capture.refuse(OP)?;
        idx(OP, "destination", dst, data.len())?;
        let device = &self.gpu.device;
        self.index_staging
            .write(&device.ctx, &device.stream, dst, data)
    }

    fn read(&self, src: &CudaBuf, len: usize) -> KernelResult<Vec<f32>> {
        const OP: &str = "read";
        self.gpu.workspace.capture.refuse(OP)?;
        if src.len() < len {
            return Err(KernelError::invalid(
                OP,
                format!("source holds {} values, needs {len}", src.len()),
            ));
        }
        if len == 0 {
            return Ok(Vec::new());
        }
        let stream = &self.gpu.device.stream;
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

    fn copy(
        &self,
        src: &CudaBuf,
        src_at: usize,
        dst: &mut CudaBuf,
        dst_at: usize,
        len: usize,
    ) -> KernelResult<()> {
        const OP: &str = "copy";
        let (CudaBuf::F32(src), CudaBuf::F32(dst)) = (src, dst) else {
            return Err(KernelError::invalid(OP, "copies f32 buffers only"));
        };
        check_copy(OP, (src.len(), src_at), (dst.len(), dst_at), len)?;
        if len == 0 {
            return Ok(());
        }
        self.gpu
            .device
            .stream
            .memcpy_dtod(
                &src.slice(src_at..src_at + len),
                &mut dst.slice_mut(dst_at..dst_at + len),
            )
            .map_err(|e| driver_err(OP, e))
    }

    fn copy_many(
        &self,
        dsts: &mut [&mut CudaBuf],
        parts: &[CopyPart<'_, CudaBuf>],
    ) -> KernelResult<()> {
        let mut table = lock(&self.copy_table);
        elementwise::copy_parts(&self.gpu, &mut table, dsts, parts)
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
        elementwise::embedding(&self.gpu, table, vocab, ids, (rows, dim), out)
    }

    fn rms_norm(
        &self,
        x: &CudaBuf,
        norm: RowNorm<'_, CudaBuf>,
        out: &mut CudaBuf,
    ) -> KernelResult<()> {
        norms::rms_norm(&self.gpu, x, norm, out)
    }

    fn add_rms_norm(
        &self,
        residual: &mut CudaBuf,
        delta: &CudaBuf,
        norm: RowNorm<'_, CudaBuf>,
        out: &mut CudaBuf,
    ) -> KernelResult<()> {
        norms::add_rms_norm(&self.gpu, residual, delta, norm, out)
    }

    fn gemm_to(
        &self,
        x: &CudaBuf,
        w: &CudaBuf,
        shape: GemmShape,
        store: Store,
        y: &mut CudaBuf,
    ) -> KernelResult<()> {
        gemm::gemm_to(&self.gpu, (x, w), shape, store, y)
    }

    fn reserve_gemm_input(&self, values: usize) -> KernelResult<()> {
        self.gpu.blas.reserve(values)
    }

    fn head_rms_norm(
        &self,
        x: &mut CudaBuf,
        weight: &CudaBuf,
        layout: HeadLayout,
        rows: usize,
        eps: f32,
    ) -> KernelResult<()> {
        norms::head_rms_norm(&self.gpu, (x, weight), layout, (rows, eps))
    }

    fn rope(
        &self,
        x: &mut CudaBuf,
        layout: HeadLayout,
        positions: &CudaSlice<u32>,
        rows: usize,
        rope: &Rope,
    ) -> KernelResult<()> {
        rope::rope(&self.gpu, x, layout, (positions, rows), rope)
    }

    fn qk_norm_rope(
        &self,
        q: (&mut CudaBuf, &CudaBuf, HeadLayout),
        k: (&mut CudaBuf, &CudaBuf, HeadLayout),
        positions: &CudaSlice<u32>,
        rows: usize,
        rope: &Rope,
        eps: f32,
    ) -> KernelResult<()> {
        if k.2.head_dim != q.2.head_dim {
            // One kernel serves one head size; other shapes take the four kernels.
            return qk_norm_then_rope(self, q, k, (positions, rows), (rope, eps));
        }
        rope::qk_norm_rope(&self.gpu, q, k, (positions, rows), rope, eps)
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
        attention::attention(&self.gpu, (qg, k, v), batch, dims, out)
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
        attention::attention_last(&self.gpu, (qg, k, v), (batch, dims), out)
    }

    fn gated_attention(
        &self,
        qkv: &mut CudaBuf,
        prologue: QkPrologue<'_, Self>,
        batch: Varlen<'_, CudaSlice<u32>>,
        dims: AttentionDims,
        last_only: bool,
        out: &mut CudaBuf,
    ) -> KernelResult<()> {
        attention::gated_attention(&self.gpu, qkv, prologue, batch, (dims, last_only), out)
    }

    fn gated_attention_carried(
        &self,
        qkv: &mut CudaBuf,
        prologue: QkPrologue<'_, Self>,
        batch: Varlen<'_, CudaSlice<u32>>,
        dims: AttentionDims,
        prefix: Option<PrefixKv<'_, Self>>,
        output: AttentionOutput<'_, CudaBuf>,
    ) -> KernelResult<()> {
        if prefix.is_none() && output.kv.is_none() {
            return self.gated_attention(qkv, prologue, batch, dims, output.last_only, output.out);
        }
        let prefix = prefix.map(|p| attention::PrefixRows {
            k: p.k,
            v: p.v,
            cu_prefix: p.cu_prefix,
            rows: p.rows,
        });
        // The flash kernels' prefix form where they take the heads (as a whole prompt runs);
        // else the prologue as its four kernels (the snapshot keeps k after them) and the naive
        // kernel that reads prefix rows before a sequence's own.
        if dims.kv_heads > 0
            && dims.q_heads.is_multiple_of(dims.kv_heads)
            && super::ops::flash_attention::flash_variant(dims.head_dim).is_some()
        {
            return attention::gated_attention_carried_flash(
                &self.gpu,
                qkv,
                prologue,
                (batch, dims),
                prefix,
                output,
            );
        }
        stacked_norm_rope(self, qkv, prologue, (dims, batch.rows))?;
        attention::attention_carried(&self.gpu, qkv, (batch, dims), prefix, output)
    }

    fn conv1d_silu(
        &self,
        conv: Conv1d<'_, CudaBuf>,
        batch: Varlen<'_, CudaSlice<u32>>,
        window: ConvWindow<'_, CudaBuf, CudaSlice<u32>>,
        out: &mut CudaBuf,
    ) -> KernelResult<()> {
        conv::conv1d_silu(&self.gpu, conv, batch, window, (0, 0.0), out, None)
    }

    fn conv1d_silu_l2(
        &self,
        conv: Conv1d<'_, CudaBuf>,
        batch: Varlen<'_, CudaSlice<u32>>,
        l2: L2Heads,
        out: &mut CudaBuf,
    ) -> KernelResult<()> {
        // The conv kernel normalises heads that are whole channel tiles from channel 0 of a dense
        // output; any other layout takes the two kernels.
        match conv::l2_channels(l2.layout, conv.channels) {
            Some(l2_channels) => {
                let l2 = (l2_channels, l2.eps);
                conv::conv1d_silu(&self.gpu, conv, batch, ConvWindow::none(), l2, out, None)
            }
            None => conv1d_silu_then_l2(self, conv, batch, l2, out),
        }
    }

    fn conv1d_silu_l2_gates(
        &self,
        conv: Conv1d<'_, CudaBuf>,
        batch: Varlen<'_, CudaSlice<u32>>,
        l2: L2Heads,
        out: &mut CudaBuf,
        gates: DeltaGates<'_, CudaBuf>,
        gates_out: GateOutputs<'_, CudaBuf>,
    ) -> KernelResult<()> {
        // One launch where the conv kernel takes the L2 layout and reads b and a as it reads x.
        let x_type = conv.x.dtype();
        let same_type = gates.b.dtype() == x_type && gates.a.dtype() == x_type;
        match conv::l2_channels(l2.layout, conv.channels) {
            Some(l2_channels) if same_type => conv::conv1d_silu(
                &self.gpu,
                conv,
                batch,
                ConvWindow::none(),
                (l2_channels, l2.eps),
                out,
                Some((gates, gates_out)),
            ),
            _ => {
                self.conv1d_silu_l2(conv, batch, l2, out)?;
                self.delta_gates(gates, batch.rows, gates_out)
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
        norms::l2_norm(&self.gpu, x, layout, (rows, eps))
    }

    fn delta_gates(
        &self,
        gates: DeltaGates<'_, CudaBuf>,
        rows: usize,
        out: GateOutputs<'_, CudaBuf>,
    ) -> KernelResult<()> {
        elementwise::delta_gates(&self.gpu, gates, rows, out)
    }

    /// The chunked kernel (delta_chunked.cu) where it takes the dims, else the token-by-token one.
    fn gated_delta_rule_chunked(
        &self,
        inputs: DeltaInputs<'_, CudaBuf>,
        batch: Varlen<'_, CudaSlice<u32>>,
        dims: DeltaDims,
        state: DeltaState<'_, Self>,
        out: &mut CudaBuf,
    ) -> KernelResult<()> {
        if delta_chunked::supports(&self.gpu, dims) {
            let batch = (batch, dims);
            delta_chunked::delta_rule_chunked(&self.gpu, (inputs, None), batch, state, out)
        } else {
            delta::delta_rule(&self.gpu, inputs, (batch, dims), state, out)
        }
    }

    /// The chunked rule's first kernel reads the bf16 projection and does the conv, the L2 norms and
    /// the gates itself (`gdr_prepare_conv`, the same bits) where the shapes allow; else the ops
    /// one after the other.
    fn delta_net_core(
        &self,
        input: DeltaNetInput<'_, CudaBuf>,
        batch: Varlen<'_, CudaSlice<u32>>,
        dims: DeltaDims,
        state: DeltaState<'_, Self>,
        scratch: DeltaNetScratch<'_, CudaBuf>,
        out: &mut CudaBuf,
    ) -> KernelResult<()> {
        if delta_chunked::fuses(&self.gpu, &input, dims) {
            let (batch, carry) = ((batch, dims), (state, ConvWindow::none()));
            delta_chunked::delta_net_core(&self.gpu, input, batch, carry, scratch, out)
        } else {
            delta_net_core_apart(self, input, (batch, dims), state, scratch, out)
        }
    }

    fn gated_delta_rule_recurrent(
        &self,
        inputs: DeltaInputs<'_, CudaBuf>,
        batch: Varlen<'_, CudaSlice<u32>>,
        dims: DeltaDims,
        state: DeltaState<'_, Self>,
        out: &mut CudaBuf,
    ) -> KernelResult<()> {
        delta::delta_rule(&self.gpu, inputs, (batch, dims), state, out)
    }

    fn gated_rms_norm(&self, x: &mut CudaBuf, norm: GatedNorm<'_, CudaBuf>) -> KernelResult<()> {
        norms::gated_rms_norm(&self.gpu, x, norm)
    }

    fn swiglu(
        &self,
        gate_up: &CudaBuf,
        rows: usize,
        inter: usize,
        out: &mut CudaBuf,
    ) -> KernelResult<()> {
        elementwise::swiglu(&self.gpu, gate_up, (rows, inter), out)
    }

    fn gated_rms_norm_gemm(
        &self,
        x: &mut CudaBuf,
        norm: GatedNorm<'_, CudaBuf>,
        proj: Projection<'_, CudaBuf>,
        y: &mut CudaBuf,
    ) -> KernelResult<()> {
        if norms::gated_rms_norm_gemm(&self.gpu, x, norm, proj, y)? {
            return Ok(());
        }
        // No cuBLASLt plan for the shape: the two-step form.
        self.gated_rms_norm(x, norm)?;
        let shape = proj.shape(norm.rows, norm.width());
        self.gemm_to(x, proj.w, shape, proj.store, y)
    }

    fn swiglu_gemm(
        &self,
        gate_up: &CudaBuf,
        rows: usize,
        inter: usize,
        proj: Projection<'_, CudaBuf>,
        act: &mut CudaBuf,
        y: &mut CudaBuf,
    ) -> KernelResult<()> {
        if elementwise::swiglu_gemm(&self.gpu, gate_up, (rows, inter), proj, y)? {
            return Ok(());
        }
        // No cuBLASLt plan for the shape: the two-step form.
        self.swiglu(gate_up, rows, inter, act)?;
        self.gemm_to(act, proj.w, proj.shape(rows, inter), proj.store, y)
    }

    fn delta_net_core_carried(
        &self,
        input: DeltaNetInput<'_, CudaBuf>,
        batch: Varlen<'_, CudaSlice<u32>>,
        dims: DeltaDims,
        carry: DeltaCarry<'_, Self>,
        scratch: DeltaNetScratch<'_, CudaBuf>,
        out: &mut CudaBuf,
    ) -> KernelResult<()> {
        if delta_chunked::fuses(&self.gpu, &input, dims) {
            let (batch, carry) = ((batch, dims), (carry.state, carry.window));
            return delta_chunked::delta_net_core(&self.gpu, input, batch, carry, scratch, out);
        }
        delta_net_core_carried_apart(self, input, (batch, dims), carry, scratch, out)
    }

    fn scatter_rows(
        &self,
        rows: &CudaBuf,
        slots: &CudaSlice<u32>,
        count: usize,
        width: usize,
        out: &mut CudaBuf,
    ) -> KernelResult<()> {
        elementwise::scatter_rows(&self.gpu, rows, slots, (count, width), out)
    }

    fn gather_last(
        &self,
        x: &CudaBuf,
        batch: Varlen<'_, CudaSlice<u32>>,
        dim: usize,
        out: &mut CudaBuf,
    ) -> KernelResult<()> {
        elementwise::gather_last(&self.gpu, x, (batch, dim), out)
    }
}

impl VisionBackend for CudaBackend {
    /// The images' bytes staged in pinned memory and copied up (a quarter of the bf16 rows'
    /// bytes); a kernel packs the rows, each value rounded as the host rounds it.
    fn write_patch_rows(&self, dst: &mut CudaBuf, images: &[PatchRows<'_>]) -> KernelResult<()> {
        let mut staging = lock(&self.patch_staging);
        vision::write_patch_rows(&self.gpu, &mut staging, dst, images)
    }

    fn layer_norm(
        &self,
        x: &CudaBuf,
        norm: RowNorm<'_, CudaBuf>,
        bias: &CudaBuf,
        out: &mut CudaBuf,
    ) -> KernelResult<()> {
        vision::layer_norm(&self.gpu, x, norm, bias, out)
    }

    fn add_bias(
        &self,
        x: &mut CudaBuf,
        bias: &CudaBuf,
        rows: usize,
        dim: usize,
    ) -> KernelResult<()> {
        vision::add_bias(&self.gpu, x, bias, (rows, dim))
    }

    fn add_in_place(&self, x: &mut CudaBuf, delta: &CudaBuf, len: usize) -> KernelResult<()> {
        vision::add_in_place(&self.gpu, x, delta, len)
    }

    fn gelu(&self, x: &mut CudaBuf, len: usize, kind: Gelu) -> KernelResult<()> {
        vision::gelu(&self.gpu, x, len, kind)
    }

    /// One pass, `x` left as it was.
    fn bias_gelu(
        &self,
        x: &mut CudaBuf,
        bias: &CudaBuf,
        shape: (usize, usize),
        kind: Gelu,
        out: &mut CudaBuf,
    ) -> KernelResult<()> {
        vision::bias_gelu(&self.gpu, (x, bias), shape, kind, out)
    }

    /// One pass, `x` left as it was.
    fn add_bias_residual(
        &self,
        residual: &mut CudaBuf,
        x: &mut CudaBuf,
        bias: &CudaBuf,
        shape: (usize, usize),
    ) -> KernelResult<()> {
        vision::add_bias_residual(&self.gpu, residual, (x, bias), shape)
    }

    /// The tanh GELU into a bf16 `out` in cuBLASLt's GELU_BIAS epilogue (the bias as uploaded,
    /// bf16), else the GEMM and `bias_gelu` apart.
    fn gemm_bias_gelu(
        &self,
        x: &CudaBuf,
        (w, bias): (&CudaBuf, &CudaBuf),
        shape: GemmShape,
        kind: Gelu,
        (scratch, out): (&mut CudaBuf, &mut CudaBuf),
    ) -> KernelResult<()> {
        let how = (Store::Replace, true);
        if kind == Gelu::Tanh && gemm::gemm_epilogue(&self.gpu, (x, w, bias), shape, how, out)? {
            return Ok(());
        }
        gemm_bias_gelu_apart(self, x, (w, bias), shape, kind, (scratch, out))
    }

    /// Both adds in cuBLASLt's BIAS epilogue, the GEMM adding to `residual` (the same f32 adds in
    /// the same order as `add_bias_residual`: the same bits), else the GEMM and that op apart.
    fn gemm_bias_residual(
        &self,
        x: &CudaBuf,
        (w, bias, bias_f32): (&CudaBuf, &CudaBuf, &CudaBuf),
        shape: GemmShape,
        scratch: &mut CudaBuf,
        residual: &mut CudaBuf,
    ) -> KernelResult<()> {
        let how = (Store::Add, false);
        if gemm::gemm_epilogue(&self.gpu, (x, w, bias_f32), shape, how, residual)? {
            return Ok(());
        }
        gemm_bias_residual_apart(self, x, (w, bias), shape, scratch, residual)
    }

    fn rope_axial(
        &self,
        x: &mut CudaBuf,
        layout: HeadLayout,
        positions: &CudaSlice<u32>,
        rows: usize,
        theta: f32,
    ) -> KernelResult<()> {
        vision::rope_axial(&self.gpu, x, layout, (positions, rows), theta)
    }

    fn attention_bidirectional(
        &self,
        qkv: &CudaBuf,
        batch: Varlen<'_, CudaSlice<u32>>,
        heads: usize,
        head_dim: usize,
        scale: f32,
        out: &mut CudaBuf,
    ) -> KernelResult<()> {
        vision::attention_bidirectional(&self.gpu, qkv, batch, (heads, head_dim, scale), out)
    }

    /// The bias and the rotary applied as the flash kernel's inputs are written (one pass over
    /// qkv instead of four, the same bits) where it takes the head size; the four ops elsewhere.
    fn bias_rope_attention(
        &self,
        (qkv, bias): (&mut CudaBuf, &CudaBuf),
        (positions, theta): (&CudaSlice<u32>, f32),
        batch: Varlen<'_, CudaSlice<u32>>,
        dims: (usize, usize, f32),
        out: &mut CudaBuf,
    ) -> KernelResult<()> {
        if vision::bias_rope_attention(
            &self.gpu,
            (qkv, bias),
            (positions, theta),
            batch,
            dims,
            out,
        )? {
            return Ok(());
        }
        bias_rope_attention_apart(self, (qkv, bias), (positions, theta), batch, dims, out)
    }
}
