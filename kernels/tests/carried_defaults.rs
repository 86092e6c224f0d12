//! The trait's defaults for carried prefix states, as a backend that does not implement them
//! gets them: a clear refusal whenever a state is carried, and the
//! plain op, bit for bit, when none is.

use instinct_kernels::{
    AttentionDims, AttentionOutput, Backend, Buffers, Conv1d, ConvWindow, CpuBackend, DeltaCarry,
    DeltaDims, DeltaGates, DeltaInputs, DeltaNetInput, DeltaNetScratch, DeltaState, GateOutputs,
    GatedNorm, GemmShape, HeadLayout, KernelError, KernelResult, PrefixKv, QkPrologue, Rope,
    RowNorm, Store, Strided, Varlen,
};
use rand::rngs::StdRng;
use rand::SeedableRng;

mod common;
use common::rand_unit;

/// The CPU backend with only the ops a backend must write: every default of the trait stays.
struct Plain(CpuBackend);

type V = Vec<f32>;
type I = Vec<u32>;

impl Buffers for Plain {
    type Buf = V;
    type Idx = I;
}

impl Backend for Plain {
    fn name(&self) -> String {
        "plain".into()
    }
    fn alloc(&self, len: usize) -> KernelResult<V> {
        self.0.alloc(len)
    }
    fn alloc_idx(&self, len: usize) -> KernelResult<I> {
        self.0.alloc_idx(len)
    }
    fn upload(&self, data: &[f32]) -> KernelResult<V> {
        self.0.upload(data)
    }
    fn write(&self, dst: &mut V, data: &[f32]) -> KernelResult<()> {
        self.0.write(dst, data)
    }
    fn write_idx(&self, dst: &mut I, data: &[u32]) -> KernelResult<()> {
        self.0.write_idx(dst, data)
    }
    fn read(&self, src: &V, len: usize) -> KernelResult<Vec<f32>> {
        self.0.read(src, len)
    }
    fn copy(
        &self,
        src: &V,
        src_at: usize,
        dst: &mut V,
        dst_at: usize,
        len: usize,
    ) -> KernelResult<()> {
        self.0.copy(src, src_at, dst, dst_at, len)
    }
    fn embedding(
        &self,
        table: &V,
        vocab: usize,
        ids: &I,
        rows: usize,
        dim: usize,
        out: &mut V,
    ) -> KernelResult<()> {
        self.0.embedding(table, vocab, ids, rows, dim, out)
    }
    fn rms_norm(&self, x: &V, norm: RowNorm<'_, V>, out: &mut V) -> KernelResult<()> {
        self.0.rms_norm(x, norm, out)
    }
    fn add_rms_norm(
        &self,
        residual: &mut V,
        delta: &V,
        norm: RowNorm<'_, V>,
        out: &mut V,
    ) -> KernelResult<()> {
        self.0.add_rms_norm(residual, delta, norm, out)
    }
    fn gemm_to(&self, x: &V, w: &V, shape: GemmShape, store: Store, y: &mut V) -> KernelResult<()> {
        self.0.gemm_to(x, w, shape, store, y)
    }
    fn head_rms_norm(
        &self,
        x: &mut V,
        weight: &V,
        layout: HeadLayout,
        rows: usize,
        eps: f32,
    ) -> KernelResult<()> {
        self.0.head_rms_norm(x, weight, layout, rows, eps)
    }
    fn rope(
        &self,
        x: &mut V,
        layout: HeadLayout,
        positions: &I,
        rows: usize,
        rope: &Rope,
    ) -> KernelResult<()> {
        self.0.rope(x, layout, positions, rows, rope)
    }
    fn attention(
        &self,
        qg: &V,
        k: &V,
        v: &V,
        batch: Varlen<'_, I>,
        dims: AttentionDims,
        out: &mut V,
    ) -> KernelResult<()> {
        self.0.attention(qg, k, v, batch, dims, out)
    }
    fn attention_last(
        &self,
        qg: &V,
        k: &V,
        v: &V,
        batch: Varlen<'_, I>,
        dims: AttentionDims,
        out: &mut V,
    ) -> KernelResult<()> {
        self.0.attention_last(qg, k, v, batch, dims, out)
    }
    fn gated_attention(
        &self,
        qkv: &mut V,
        prologue: QkPrologue<'_, Self>,
        batch: Varlen<'_, I>,
        dims: AttentionDims,
        last_only: bool,
        out: &mut V,
    ) -> KernelResult<()> {
        let prologue = QkPrologue {
            q_norm: prologue.q_norm,
            k_norm: prologue.k_norm,
            positions: prologue.positions,
            rope: prologue.rope,
            eps: prologue.eps,
        };
        self.0
            .gated_attention(qkv, prologue, batch, dims, last_only, out)
    }
    fn conv1d_silu(
        &self,
        conv: Conv1d<'_, V>,
        batch: Varlen<'_, I>,
        window: ConvWindow<'_, V, I>,
        out: &mut V,
    ) -> KernelResult<()> {
        self.0.conv1d_silu(conv, batch, window, out)
    }
    fn l2_norm(&self, x: &mut V, layout: HeadLayout, rows: usize, eps: f32) -> KernelResult<()> {
        self.0.l2_norm(x, layout, rows, eps)
    }
    fn delta_gates(
        &self,
        gates: DeltaGates<'_, V>,
        rows: usize,
        out: GateOutputs<'_, V>,
    ) -> KernelResult<()> {
        self.0.delta_gates(gates, rows, out)
    }
    fn gated_delta_rule_chunked(
        &self,
        inputs: DeltaInputs<'_, V>,
        batch: Varlen<'_, I>,
        dims: DeltaDims,
        state: DeltaState<'_, Self>,
        out: &mut V,
    ) -> KernelResult<()> {
        self.0
            .gated_delta_rule_chunked(inputs, batch, dims, on_cpu(state), out)
    }
    fn gated_delta_rule_recurrent(
        &self,
        inputs: DeltaInputs<'_, V>,
        batch: Varlen<'_, I>,
        dims: DeltaDims,
        state: DeltaState<'_, Self>,
        out: &mut V,
    ) -> KernelResult<()> {
        self.0
            .gated_delta_rule_recurrent(inputs, batch, dims, on_cpu(state), out)
    }
    fn gated_rms_norm(&self, x: &mut V, norm: GatedNorm<'_, V>) -> KernelResult<()> {
        self.0.gated_rms_norm(x, norm)
    }
    fn swiglu(&self, gate_up: &V, rows: usize, inter: usize, out: &mut V) -> KernelResult<()> {
        self.0.swiglu(gate_up, rows, inter, out)
    }
    fn scatter_rows(
        &self,
        rows: &V,
        slots: &I,
        count: usize,
        width: usize,
        out: &mut V,
    ) -> KernelResult<()> {
        self.0.scatter_rows(rows, slots, count, width, out)
    }
    fn gather_last(
        &self,
        x: &V,
        batch: Varlen<'_, I>,
        dim: usize,
        out: &mut V,
    ) -> KernelResult<()> {
        self.0.gather_last(x, batch, dim, out)
    }
}

/// The same state, typed for the wrapped CPU backend (the buffers are the same `Vec`s).
fn on_cpu<'a>(state: DeltaState<'a, Plain>) -> DeltaState<'a, CpuBackend> {
    DeltaState {
        initial: state.initial,
        final_out: state.final_out,
        final_at: None,
    }
}

fn refused(result: KernelResult<()>) -> String {
    match result {
        Err(e @ KernelError::Invalid { .. }) => e.to_string(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_backend_without_carried_attention_refuses_a_prefix_and_runs_the_plain_op_without() {
    let plain = Plain(CpuBackend::new());
    let mut rng = StdRng::seed_from_u64(5);
    let dims = AttentionDims {
        q_heads: 2,
        kv_heads: 1,
        head_dim: 8,
        scale: 8f32.powf(-0.5),
    };
    let rope = Rope {
        rotary_dim: 4,
        theta: 10_000.0,
        section: [1, 1, 0],
        interleaved: true,
    };
    let rows = 3;
    let qkv = rand_unit(&mut rng, rows * dims.stacked_width());
    let norm = rand_unit(&mut rng, 8);
    let positions: Vec<u32> = (0..rows as u32).flat_map(|p| [p, p, p]).collect();
    let cu = vec![0u32, rows as u32];
    let prologue = QkPrologue {
        q_norm: &norm,
        k_norm: &norm,
        positions: &positions,
        rope: &rope,
        eps: 1e-6,
    };
    let batch = Varlen {
        cu_seqlens: &cu,
        num_seqs: 1,
        rows,
    };
    let (prefix_k, prefix_v, cu_prefix) = (vec![0.5; 8], vec![0.5; 8], vec![0u32, 1]);
    let prefix = PrefixKv {
        k: &prefix_k,
        v: &prefix_v,
        cu_prefix: &cu_prefix,
        rows: 1,
    };
    let mut out = vec![0.0; rows * 16];
    let output = AttentionOutput {
        out: &mut out,
        last_only: false,
        kv: None,
    };
    let err = refused(plain.gated_attention_carried(
        &mut qkv.clone(),
        prologue,
        batch,
        dims,
        Some(prefix),
        output,
    ));
    assert!(
        err.contains("prefix states are not implemented on plain yet"),
        "{err}"
    );
    let (mut k, mut v) = (vec![0.0; rows * 8], vec![0.0; rows * 8]);
    let output = AttentionOutput {
        out: &mut out,
        last_only: false,
        kv: Some((&mut k, &mut v)),
    };
    refused(plain.gated_attention_carried(&mut qkv.clone(), prologue, batch, dims, None, output));

    let output = AttentionOutput {
        out: &mut out,
        last_only: true,
        kv: None,
    };
    plain
        .gated_attention_carried(&mut qkv.clone(), prologue, batch, dims, None, output)
        .unwrap();
    let mut want = vec![0.0; 16];
    plain
        .gated_attention(&mut qkv.clone(), prologue, batch, dims, true, &mut want)
        .unwrap();
    assert_eq!(out[..16], want[..]);
}

#[test]
fn a_backend_without_carried_delta_net_refuses_a_window() {
    let plain = Plain(CpuBackend::new());
    let mut rng = StdRng::seed_from_u64(6);
    let dims = DeltaDims {
        k_heads: 1,
        v_heads: 2,
        k_dim: 4,
        v_dim: 4,
    };
    let (rows, kernel, qkv_w) = (2, 3, dims.qkv_width());
    let width = qkv_w + 2 * dims.v_heads;
    let x = rand_unit(&mut rng, rows * width);
    let conv_w = rand_unit(&mut rng, qkv_w * kernel);
    let (a_log, dt_bias) = (rand_unit(&mut rng, 2), rand_unit(&mut rng, 2));
    let input = DeltaNetInput {
        x: &x,
        x_at: Strided::cols(width, 0),
        conv_weight: &conv_w,
        kernel,
        l2_eps: 1e-6,
        gates: DeltaGates {
            b: &x,
            b_at: Strided::cols(width, qkv_w),
            a: &x,
            a_at: Strided::cols(width, qkv_w + 2),
            a_log: &a_log,
            dt_bias: &dt_bias,
            heads: 2,
        },
    };
    let cu = vec![0u32, rows as u32];
    let batch = Varlen {
        cu_seqlens: &cu,
        num_seqs: 1,
        rows,
    };
    let window = vec![0.0; (kernel - 1) * qkv_w];
    let (mut conv, mut beta, mut g) = (vec![0.0; rows * qkv_w], vec![0.0; 4], vec![0.0; 4]);
    let mut out = vec![0.0; rows * 8];
    let carry = DeltaCarry {
        state: DeltaState {
            initial: None,
            final_out: None,
            final_at: None,
        },
        window: ConvWindow {
            input: Some(&window),
            output: None,
            output_at: None,
        },
    };
    let scratch = DeltaNetScratch {
        conv: &mut conv,
        beta: &mut beta,
        g: &mut g,
    };
    let err = refused(plain.delta_net_core_carried(input, batch, dims, carry, scratch, &mut out));
    assert!(err.contains("delta_net_core_carried"), "{err}");
    assert!(err.contains("not implemented on plain"), "{err}");
}
