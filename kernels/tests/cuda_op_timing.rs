//! Where the time of one Qwen3.5-4B forward goes: every CUDA op at the real shapes, timed alone,
//! and the per-forward total it implies (24 Gated DeltaNet + 8 attention layers). Needs a GPU:
//! run with `cargo test --release -p instinct-kernels --test cuda_op_timing -- --ignored
//! --nocapture`. Prints a table; asserts only that every op ran.
//!
//! Times are host wall time over back-to-back launches followed by one synchronize, so a tiny op
//! shows its launch cost, as it does inside a forward pass.

mod common;
use common::mean_seconds as time;

use instinct_kernels::cuda::{CudaBackend, CudaBuf, CudaOptions};
use instinct_kernels::{
    AttentionDims, Backend, DeltaDims, DeltaGates, DeltaState, Rope, Store, Strided, Varlen,
};
use instinct_kernels::{
    DeltaNetInput, DeltaNetScratch, GatedNorm, GemmShape, Projection, QkPrologue, RowNorm,
};

const HIDDEN: usize = 2560;
const INTER: usize = 9216;
const DELTA: DeltaDims = DeltaDims {
    k_heads: 16,
    v_heads: 32,
    k_dim: 128,
    v_dim: 128,
};
const ATTN: AttentionDims = AttentionDims {
    q_heads: 16,
    kv_heads: 4,
    head_dim: 256,
    scale: 0.0625,
};
const DELTA_LAYERS: usize = 24;
const ATTN_LAYERS: usize = 8;

fn filled(gpu: &CudaBackend, len: usize, value: f32) -> CudaBuf {
    let mut b = gpu.alloc(len).unwrap();
    gpu.write(&mut b, &vec![value; len]).unwrap();
    b
}

fn weight(gpu: &CudaBackend, len: usize) -> CudaBuf {
    let host: Vec<f32> = (0..len)
        .map(|i| ((i * 2_654_435_761) % 1000) as f32 * 1e-5 - 5e-3)
        .collect();
    gpu.upload(&host).unwrap()
}

struct Row {
    op: &'static str,
    per_call_ms: f64,
    calls: usize,
}

fn profile(gpu: &CudaBackend, lens: &[usize]) -> Vec<Row> {
    let rows: usize = lens.iter().sum();
    let num_seqs = lens.len();
    let mut cu = vec![0u32];
    for &l in lens {
        cu.push(cu.last().unwrap() + l as u32);
    }
    let mut cu_d = gpu.alloc_idx(cu.len()).unwrap();
    gpu.write_idx(&mut cu_d, &cu).unwrap();
    let positions: Vec<u32> = lens
        .iter()
        .flat_map(|&l| (0..l as u32).flat_map(|p| [p, p, p]))
        .collect();
    let mut pos_d = gpu.alloc_idx(positions.len()).unwrap();
    gpu.write_idx(&mut pos_d, &positions).unwrap();
    let batch = || Varlen {
        cu_seqlens: &cu_d,
        num_seqs,
        rows,
    };
    let runs = if rows > 10_000 { 5 } else { 20 };
    let qkv_w = DELTA.qkv_width();
    let vw = DELTA.v_heads * DELTA.v_dim;
    let hv = DELTA.v_heads;
    // The stacked in-projection output row, [qkv | z | b | a], as the model runs it.
    let in_w = qkv_w + vw + 2 * hv;
    let [qkv_at, z_at, b_at, a_at] =
        [0, qkv_w, qkv_w + vw, qkv_w + vw + hv].map(|o| Strided::cols(in_w, o));

    // Weights.
    let w_in = weight(gpu, in_w * HIDDEN);
    let w_out = weight(gpu, HIDDEN * vw);
    let w_qkv = weight(gpu, ATTN.stacked_width() * HIDDEN);
    let w_o = weight(gpu, HIDDEN * ATTN.q_heads * ATTN.head_dim);
    let w_gate_up = weight(gpu, 2 * INTER * HIDDEN);
    let w_down = weight(gpu, HIDDEN * INTER);
    let norm_w = weight(gpu, HIDDEN);
    let conv_w = weight(gpu, qkv_w * 4);
    let small = weight(gpu, 256);
    let a_log = weight(gpu, hv);

    // Activations.
    // The model keeps GEMM inputs written by norms in the GEMM's operand type.
    let mut normed = gpu.alloc_gemm_input(rows * HIDDEN).unwrap();
    gpu.write(&mut normed, &vec![0.5; rows * HIDDEN]).unwrap();
    let mut residual = filled(gpu, rows * HIDDEN, 0.1);
    // As in the model, the DeltaNet in-projection and the MLP's gate|up are held in bf16.
    let mut proj = gpu.alloc_gemm_input(rows * in_w).unwrap();
    let mut gate_up = gpu.alloc_gemm_input(rows * 2 * INTER).unwrap();
    let mut beta = filled(gpu, rows * hv, 0.3);
    let mut decay = filled(gpu, rows * hv, -0.1);
    let mut conv = filled(gpu, rows * qkv_w, 0.05);
    let mut core = filled(gpu, rows * INTER, 0.1);
    // Attention's stacked q|gate|k|v, and its output held in bf16 for o_proj, as in the model.
    let mut attn_qkv = filled(gpu, rows * ATTN.stacked_width(), 0.1);
    let mut attn_out = gpu
        .alloc_gemm_input(rows * ATTN.q_heads * ATTN.head_dim)
        .unwrap();

    let mut out = Vec::new();
    let mut row = |op, calls, secs: f64| {
        out.push(Row {
            op,
            per_call_ms: secs * 1e3,
            calls,
        })
    };
    gpu.reserve_gemm_input(rows * INTER).unwrap();

    let t = time(gpu, runs, || {
        gpu.gemm(
            &normed,
            &w_in,
            GemmShape::new(rows, HIDDEN, in_w),
            &mut proj,
        )
        .unwrap()
    });
    row("deltanet in_proj (stacked GEMM)", DELTA_LAYERS, t);
    // Small values in every block: the gates and gated norm below read them.
    gpu.write(&mut proj, &vec![0.1; rows * in_w]).unwrap();
    // The forward's form: the conv, the q/k L2 norms, the gates and the chunked rule in one op
    // (the rule's first kernel reads the projection).
    let t = time(gpu, runs.min(5), || {
        let gates = DeltaGates {
            b: &proj,
            b_at,
            a: &proj,
            a_at,
            a_log: &a_log,
            dt_bias: &a_log,
            heads: hv,
        };
        let state = DeltaState {
            initial: None,
            final_out: None,
            final_at: None,
        };
        gpu.delta_net_core(
            DeltaNetInput {
                x: &proj,
                x_at: qkv_at,
                conv_weight: &conv_w,
                kernel: 4,
                l2_eps: 1e-6,
                gates,
            },
            batch(),
            DELTA,
            state,
            DeltaNetScratch {
                conv: &mut conv,
                beta: &mut beta,
                g: &mut decay,
            },
            &mut core,
        )
        .unwrap()
    });
    row("conv + gates + gated delta rule", DELTA_LAYERS, t);
    let t = time(gpu, runs, || {
        gpu.gated_rms_norm_gemm(
            &mut core,
            GatedNorm {
                z: &proj,
                z_at,
                weight: &small,
                rows,
                heads: hv,
                dim: DELTA.v_dim,
                eps: 1e-6,
            },
            Projection {
                w: &w_out,
                out_dim: HIDDEN,
                store: Store::Add,
            },
            &mut residual,
        )
        .unwrap()
    });
    row("gated norm + out_proj GEMM (+=)", DELTA_LAYERS, t);

    let t = time(gpu, runs, || {
        gpu.gemm(
            &normed,
            &w_qkv,
            GemmShape::new(rows, HIDDEN, ATTN.stacked_width()),
            &mut attn_qkv,
        )
        .unwrap()
    });
    row("attention q|gate|k|v GEMM", ATTN_LAYERS, t);
    let rope = Rope {
        rotary_dim: 64,
        theta: 1e7,
        section: [11, 11, 10],
        interleaved: true,
    };
    // The head norms leave q and k of order one; the softmax stays finite. (Each call turns the
    // gates into their sigmoid in place; they stay in (0, 1).)
    let t = time(gpu, runs.min(5), || {
        gpu.gated_attention(
            &mut attn_qkv,
            QkPrologue {
                q_norm: &small,
                k_norm: &small,
                positions: &pos_d,
                rope: &rope,
                eps: 1e-6,
            },
            batch(),
            ATTN,
            false,
            &mut attn_out,
        )
        .unwrap()
    });
    row("q/k norm + rope + flash attention", ATTN_LAYERS, t);
    let t = time(gpu, runs, || {
        gpu.gemm_to(
            &attn_out,
            &w_o,
            GemmShape::new(rows, ATTN.q_heads * ATTN.head_dim, HIDDEN),
            Store::Add,
            &mut residual,
        )
        .unwrap()
    });
    row("attention o_proj GEMM (+=)", ATTN_LAYERS, t);

    let layers = DELTA_LAYERS + ATTN_LAYERS;
    let mut normed_out = gpu.alloc_gemm_input(rows * HIDDEN).unwrap();
    let t = time(gpu, runs, || {
        gpu.rms_norm(
            &residual,
            RowNorm {
                weight: &norm_w,
                rows,
                dim: HIDDEN,
                eps: 1e-6,
            },
            &mut normed_out,
        )
        .unwrap()
    });
    row("rms norm", 2 * layers, t);
    let t = time(gpu, runs, || {
        gpu.gemm(
            &normed,
            &w_gate_up,
            GemmShape::new(rows, HIDDEN, 2 * INTER),
            &mut gate_up,
        )
        .unwrap()
    });
    row("mlp gate|up GEMM", layers, t);
    let t = time(gpu, runs, || {
        gpu.swiglu_gemm(
            &gate_up,
            rows,
            INTER,
            Projection {
                w: &w_down,
                out_dim: HIDDEN,
                store: Store::Add,
            },
            &mut core,
            &mut residual,
        )
        .unwrap()
    });
    row("swiglu + mlp down GEMM (+=)", layers, t);
    out
}

#[test]
#[ignore = "needs a GPU"]
fn where_the_forward_time_goes() {
    let gpu = CudaBackend::new(CudaOptions::default()).unwrap();
    let shapes: [(&str, Vec<usize>); 4] = [
        ("1 x 139", vec![139]),
        ("1 x 712", vec![712]),
        ("1 x 15446", vec![15446]),
        ("128 x 300", vec![300; 128]),
    ];
    for (name, lens) in shapes {
        let rows = profile(&gpu, &lens);
        assert!(!rows.is_empty());
        let total: f64 = rows.iter().map(|r| r.per_call_ms * r.calls as f64).sum();
        println!("\n== {name} tokens: ops sum to {total:.2} ms per forward");
        println!(
            "{:<30} {:>10} {:>6} {:>12} {:>6}",
            "op", "ms/call", "calls", "ms/forward", "share"
        );
        for r in &rows {
            let per_forward = r.per_call_ms * r.calls as f64;
            assert!(r.per_call_ms > 0.0, "{} did not run", r.op);
            println!(
                "{:<30} {:>10.4} {:>6} {:>12.3} {:>5.1}%",
                r.op,
                r.per_call_ms,
                r.calls,
                per_forward,
                100.0 * per_forward / total
            );
        }
    }
}
