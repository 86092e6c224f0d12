//! Batch invariance on the GPU (docs/validation/batch-invariance.md): with
//! `CudaOptions::batch_invariant` (the default), a sequence's results are the same bits alone and
//! inside any batch. Three ops decide it: the GEMMs (every row count of a shape must sum each
//! output in one order), the attention (its last-row form splits a sequence's keys), and the
//! chunked delta rule (its state pass cuts the value columns by the batch's size).
//!
//! These need a GPU: `cargo test --release -p instinct-kernels --test cuda_batch_invariance --
//! --ignored --nocapture --test-threads 1` (each test prints what it compares).

mod common;
use common::{activation_as, bf16_activation, bf16_round, cu_of, gpu, indices, rand_vec};

use instinct_kernels::cuda::{CudaBackend, CudaBuf, CudaOptions};
use instinct_kernels::{
    AttentionDims, Backend, DeltaDims, DeltaGates, DeltaNetInput, DeltaNetScratch, DeltaState,
    GatedNorm, GemmShape, Projection, QkPrologue, Rope, Store, Strided, Varlen,
};
use rand::rngs::StdRng;
use rand::SeedableRng;

/// Row counts a GEMM runs at: one question's last row, a few, a bucket edge, short and typical
/// questions, batches; each is compared with the same rows of the largest.
const ROWS: [usize; 8] = [1, 7, 64, 139, 300, 712, 1500, 4100];
/// Qwen3.5-4B's hidden size, MLP width and attention/DeltaNet widths.
const HIDDEN: usize = 2560;
const INTER: usize = 9216;
/// Full attention: 16 query heads over 4 kv heads of 256.
const ATTENTION: AttentionDims = AttentionDims {
    q_heads: 16,
    kv_heads: 4,
    head_dim: 256,
    scale: 0.0625,
};
/// Gated DeltaNet: 16 key heads, 32 value heads, 128 each.
const DELTA: DeltaDims = DeltaDims {
    k_heads: 16,
    v_heads: 32,
    k_dim: 128,
    v_dim: 128,
};

/// How two results of one sequence compare: `None` when bit-identical, else how many values
/// differ and the largest difference.
fn differences(got: &[f32], want: &[f32]) -> Option<(usize, f32)> {
    assert_eq!(got.len(), want.len());
    let mut count = 0;
    let mut worst = 0f32;
    for (g, w) in got.iter().zip(want) {
        if g.to_bits() != w.to_bits() {
            count += 1;
            worst = worst.max((g - w).abs());
        }
    }
    (count > 0).then_some((count, worst))
}

/// Prints one comparison and records it if it differs.
fn compare(failures: &mut Vec<String>, what: String, got: &[f32], want: &[f32]) {
    match differences(got, want) {
        None => eprintln!("  identical: {what} ({} values)", got.len()),
        Some((count, worst)) => {
            let line = format!(
                "{what}: {count} of {} values differ, max |Δ| {worst:e}",
                got.len()
            );
            eprintln!("  DIFFERS:   {line}");
            failures.push(line);
        }
    }
}

#[track_caller]
fn assert_none(failures: &[String]) {
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---- GEMMs -----------------------------------------------------------------------------------

/// One GEMM entry point at a real shape: `run(m)` gives the `m × out` output of its first `m` rows.
struct GemmCase {
    what: &'static str,
    out_dim: usize,
}

/// Operands of the largest row count, uploaded once per case; each run reads their first rows.
struct Operands {
    x: CudaBuf,
    w: CudaBuf,
    /// The Add cases' starting output (a residual stream), host-side.
    y0: Vec<f32>,
}

fn operands(gpu: &CudaBackend, rng: &mut StdRng, (in_dim, out_dim): (usize, usize)) -> Operands {
    let max = ROWS[ROWS.len() - 1];
    let x = bf16_round(&rand_vec(rng, max * in_dim, 1.0));
    let w = bf16_round(&rand_vec(rng, out_dim * in_dim, 0.05));
    Operands {
        x: activation_as(gpu, &x, 0, true),
        w: gpu.upload(&w).unwrap(),
        y0: rand_vec(rng, max * out_dim, 1.0),
    }
}

/// The output buffer of `m` rows: bf16 or f32, holding the starting values where added to.
fn output(gpu: &CudaBackend, ops: &Operands, m: usize, out_dim: usize, bf16: bool) -> CudaBuf {
    if bf16 {
        gpu.alloc_gemm_input(m * out_dim).unwrap()
    } else {
        let mut y = gpu.alloc(m * out_dim).unwrap();
        gpu.write(&mut y, &ops.y0[..m * out_dim]).unwrap();
        y
    }
}

/// Every row count of `ROWS` against the same rows of the largest, through `run`.
fn rows_against_the_largest(
    failures: &mut Vec<String>,
    case: &GemmCase,
    mut run: impl FnMut(usize) -> Vec<f32>,
) {
    let max = ROWS[ROWS.len() - 1];
    eprintln!("{} (out {}):", case.what, case.out_dim);
    let full = run(max);
    for &m in &ROWS[..ROWS.len() - 1] {
        let got = run(m);
        let what = format!(
            "{}: rows 0..{m} of a {m}-row GEMM vs of a {max}-row one",
            case.what
        );
        compare(failures, what, &got, &full[..m * case.out_dim]);
    }
}

/// Plain GEMMs at the projection shapes of Qwen3.5-4B, bf16 and f32 outputs, replaced and added
/// to; bf16 inputs (the norms' outputs) and one f32 input (rounded by the GEMM's own conversion).
fn plain_gemms(gpu: &CudaBackend, failures: &mut Vec<String>) {
    let mut rng = StdRng::seed_from_u64(181);
    // (what, in, out, bf16 output, store, bf16 input)
    let shapes: [(&'static str, usize, usize, bool, Store, bool); 6] = [
        (
            "attention q|gate|k|v",
            HIDDEN,
            10_240,
            false,
            Store::Replace,
            true,
        ),
        (
            "DeltaNet in-projection",
            HIDDEN,
            12_352,
            true,
            Store::Replace,
            true,
        ),
        ("MLP gate|up", HIDDEN, 2 * INTER, true, Store::Replace, true),
        (
            "attention o_proj (+=)",
            4096,
            HIDDEN,
            false,
            Store::Add,
            true,
        ),
        ("MLP down (+=)", INTER, HIDDEN, false, Store::Add, true),
        (
            "f32 input 2560 -> 2560",
            HIDDEN,
            HIDDEN,
            false,
            Store::Replace,
            false,
        ),
    ];
    for (what, in_dim, out_dim, bf16_out, store, bf16_in) in shapes {
        let ops = operands(gpu, &mut rng, (in_dim, out_dim));
        let x = if bf16_in {
            ops.x
        } else {
            let host = gpu.read(&ops.x, ROWS[ROWS.len() - 1] * in_dim).unwrap();
            activation_as(gpu, &host, 0, false)
        };
        let ops = Operands { x, ..ops };
        let case = GemmCase { what, out_dim };
        rows_against_the_largest(failures, &case, |m| {
            let mut y = output(gpu, &ops, m, out_dim, bf16_out);
            gpu.gemm_to(
                &ops.x,
                &ops.w,
                GemmShape::new(m, in_dim, out_dim),
                store,
                &mut y,
            )
            .unwrap();
            gpu.read(&y, m * out_dim).unwrap()
        });
    }
}

/// The fused entry points: SwiGLU into the down projection, the gated norm into out_proj (both
/// added to the residual stream, as the model runs them).
fn fused_gemms(gpu: &CudaBackend, failures: &mut Vec<String>) {
    let mut rng = StdRng::seed_from_u64(182);
    let max = ROWS[ROWS.len() - 1];
    // swiglu_gemm: gate|up [rows, 2·9216] (bf16, as the gate|up GEMM writes it) → 2560.
    let ops = operands(gpu, &mut rng, (INTER, HIDDEN));
    let gate_up = bf16_activation(gpu, &rand_vec(&mut rng, max * 2 * INTER, 2.0), 0);
    let case = GemmCase {
        what: "swiglu_gemm 9216 -> 2560 (+=)",
        out_dim: HIDDEN,
    };
    rows_against_the_largest(failures, &case, |m| {
        let mut y = output(gpu, &ops, m, HIDDEN, false);
        let mut act = gpu.alloc_gemm_input(m * INTER).unwrap();
        let proj = Projection {
            w: &ops.w,
            out_dim: HIDDEN,
            store: Store::Add,
        };
        gpu.swiglu_gemm(&gate_up, m, INTER, proj, &mut act, &mut y)
            .unwrap();
        gpu.read(&y, m * HIDDEN).unwrap()
    });
    // gated_rms_norm_gemm: the DeltaNet core's output [rows, 32·128] (f32) normed per head with
    // the gate z (bf16) → out_proj 4096 → 2560.
    let width = DELTA.v_heads * DELTA.v_dim;
    let ops = operands(gpu, &mut rng, (width, HIDDEN));
    let core = rand_vec(&mut rng, max * width, 1.0);
    let z = bf16_activation(gpu, &rand_vec(&mut rng, max * width, 2.0), 0);
    let norm_w = gpu
        .upload(&bf16_round(&rand_vec(&mut rng, DELTA.v_dim, 0.5)))
        .unwrap();
    let case = GemmCase {
        what: "gated_rms_norm_gemm 4096 -> 2560 (+=)",
        out_dim: HIDDEN,
    };
    rows_against_the_largest(failures, &case, |m| {
        let mut x = activation_as(gpu, &core[..m * width], 0, false);
        let mut y = output(gpu, &ops, m, HIDDEN, false);
        let norm = GatedNorm {
            z: &z,
            z_at: Strided::dense(width),
            weight: &norm_w,
            rows: m,
            heads: DELTA.v_heads,
            dim: DELTA.v_dim,
            eps: 1e-6,
        };
        let proj = Projection {
            w: &ops.w,
            out_dim: HIDDEN,
            store: Store::Add,
        };
        gpu.gated_rms_norm_gemm(&mut x, norm, proj, &mut y).unwrap();
        gpu.read(&y, m * HIDDEN).unwrap()
    });
}

/// Rows 0..m of a GEMM over M rows equal the GEMM over just those m rows, bit for bit, at every
/// real projection shape, for bf16 and f32 outputs and through the fused entry points.
#[test]
#[ignore = "needs a GPU"]
fn gemm_rows_do_not_depend_on_the_row_count() {
    let gpu = gpu();
    let mut failures = Vec::new();
    plain_gemms(&gpu, &mut failures);
    fused_gemms(&gpu, &mut failures);
    eprintln!("GEMM tunings this run: {}", gpu.gemm_tunings());
    assert_none(&failures);
}

/// The same comparisons with the mode off, as a measurement of what the mode removes: prints
/// how many row counts differ and asserts only that the comparisons ran (with the mode off the
/// bucket winners may split K, so differences are expected, not required).
#[test]
#[ignore = "needs a GPU"]
fn gemm_rows_with_the_mode_off_are_reported() {
    let gpu = CudaBackend::new(CudaOptions {
        batch_invariant: false,
        ..CudaOptions::default()
    })
    .unwrap_or_else(|e| panic!("CUDA start-up: {e}"));
    let mut failures = Vec::new();
    plain_gemms(&gpu, &mut failures);
    fused_gemms(&gpu, &mut failures);
    eprintln!(
        "mode off: {} of {} comparisons differ",
        failures.len(),
        8 * (ROWS.len() - 1)
    );
}

// ---- Attention -------------------------------------------------------------------------------

/// A sequence's stacked q|gate|k|v rows (`len` of `ATTENTION.stacked_width()`).
/// The other sequences of a batch, made by `make` from their lengths: `before`, then `after`.
fn others_of(
    before: &[usize],
    after: &[usize],
    make: impl FnMut(usize) -> Vec<f32>,
) -> Vec<Vec<f32>> {
    before.iter().chain(after).copied().map(make).collect()
}

/// A batch with `target` as sequence `at`: the first `at` of `others` before it, the rest after.
fn around<'a>(others: &'a [Vec<f32>], at: usize, target: &'a [f32]) -> Vec<&'a [f32]> {
    let mut seqs: Vec<&[f32]> = others[..at].iter().map(Vec::as_slice).collect();
    seqs.push(target);
    seqs.extend(others[at..].iter().map(Vec::as_slice));
    seqs
}

fn stacked_rows(rng: &mut StdRng, len: usize) -> Vec<f32> {
    rand_vec(rng, len * ATTENTION.stacked_width(), 2.0)
}

/// The norms and rope every attention run shares.
struct Prologue {
    q_norm: CudaBuf,
    k_norm: CudaBuf,
    rope: Rope,
}

/// `gated_attention` over the sequences `seqs` packed in order: every row (`last_only` false,
/// `[rows][out]`) or each sequence's last row (`[num_seqs][out]`).
fn attend(gpu: &CudaBackend, p: &Prologue, seqs: &[&[f32]], last_only: bool) -> Vec<f32> {
    let width = ATTENTION.stacked_width();
    let out_w = ATTENTION.q_heads * ATTENTION.head_dim;
    let lens: Vec<usize> = seqs.iter().map(|s| s.len() / width).collect();
    let rows: usize = lens.iter().sum();
    let qkv_host = seqs.concat();
    let positions: Vec<u32> = lens
        .iter()
        .flat_map(|&n| (0..n as u32).flat_map(|t| [t, t, t]))
        .collect();
    let mut qkv = activation_as(gpu, &qkv_host, 0, false);
    let cu = indices(gpu, &cu_of(&lens));
    let pos = indices(gpu, &positions);
    let n = if last_only { lens.len() } else { rows };
    let mut out = gpu.alloc(n * out_w).unwrap();
    let prologue = QkPrologue {
        q_norm: &p.q_norm,
        k_norm: &p.k_norm,
        positions: &pos,
        rope: &p.rope,
        eps: 1e-6,
    };
    let batch = Varlen {
        cu_seqlens: &cu,
        num_seqs: lens.len(),
        rows,
    };
    gpu.gated_attention(&mut qkv, prologue, batch, ATTENTION, last_only, &mut out)
        .unwrap();
    gpu.read(&out, n * out_w).unwrap()
}

/// One sequence alone vs inside batches of other sequences of varied lengths (before and after
/// it; few and many sequences; short and long means, so the full-row kernel's shape changes too):
/// its last row (`last_only`) and every row of it, bit for bit.
#[test]
#[ignore = "needs a GPU"]
fn attention_of_a_sequence_does_not_depend_on_its_batch() {
    let gpu = gpu();
    let mut rng = StdRng::seed_from_u64(183);
    let prologue = Prologue {
        q_norm: gpu
            .upload(&bf16_round(&rand_vec(&mut rng, 256, 0.5)))
            .unwrap(),
        k_norm: gpu
            .upload(&bf16_round(&rand_vec(&mut rng, 256, 0.5)))
            .unwrap(),
        rope: Rope {
            rotary_dim: 64,
            theta: 10_000_000.0,
            section: [12, 10, 10],
            interleaved: true,
        },
    };
    let out_w = ATTENTION.q_heads * ATTENTION.head_dim;
    // Others: (lengths before the target, lengths after it).
    let many: Vec<usize> = (0..31).map(|i| 200 + 13 * i).collect();
    let mixes: [(&[usize], &[usize]); 4] = [
        (&[5], &[300]),
        (&[2000, 1500], &[64]),
        (&many[..16], &many[16..]),
        (&[], &[15_000]),
    ];
    let mut failures = Vec::new();
    for target_len in [1, 64, 65, 139, 712, 1100, 4000] {
        let target = stacked_rows(&mut rng, target_len);
        let alone_last = attend(&gpu, &prologue, &[&target], true);
        let alone_rows = attend(&gpu, &prologue, &[&target], false);
        for (before, after) in mixes {
            let others = others_of(before, after, |n| stacked_rows(&mut rng, n));
            let seqs = around(&others, before.len(), &target);
            let at = before.len();
            let start: usize = before.iter().sum();
            let rows = start + target_len + after.iter().sum::<usize>();
            let what = format!(
                "{target_len}-row sequence alone vs as sequence {at} of {} ({rows} rows)",
                seqs.len()
            );
            let last = attend(&gpu, &prologue, &seqs, true);
            compare(
                &mut failures,
                format!("last row: {what}"),
                &last[at * out_w..(at + 1) * out_w],
                &alone_last,
            );
            let every = attend(&gpu, &prologue, &seqs, false);
            compare(
                &mut failures,
                format!("every row: {what}"),
                &every[start * out_w..(start + target_len) * out_w],
                &alone_rows,
            );
        }
    }
    assert_none(&failures);
}

// ---- The chunked delta rule ------------------------------------------------------------------

/// Width of the stacked in-projection the delta rule reads: q|k|v, z, b, a.
fn delta_width() -> usize {
    DELTA.qkv_width() + DELTA.v_heads * DELTA.v_dim + 2 * DELTA.v_heads
}

/// Weights of one DeltaNet layer's core: the conv and the gates' A_log and dt bias.
struct DeltaWeights {
    conv: CudaBuf,
    a_log: CudaBuf,
    dt_bias: CudaBuf,
}

/// `delta_net_core` over `seqs` (stacked rows, bf16-exact) packed in order: the output rows and
/// every sequence's final state.
fn delta_core(gpu: &CudaBackend, wts: &DeltaWeights, seqs: &[&[f32]]) -> (Vec<f32>, Vec<f32>) {
    let width = delta_width();
    let heads = DELTA.v_heads;
    let channels = DELTA.qkv_width();
    let lens: Vec<usize> = seqs.iter().map(|s| s.len() / width).collect();
    let rows: usize = lens.iter().sum();
    let x = bf16_activation(gpu, &seqs.concat(), 0);
    let cu = indices(gpu, &cu_of(&lens));
    let [b_at, a_at] = [width - 2 * heads, width - heads].map(|o| Strided::cols(width, o));
    let gates = DeltaGates {
        b: &x,
        b_at,
        a: &x,
        a_at,
        a_log: &wts.a_log,
        dt_bias: &wts.dt_bias,
        heads,
    };
    let state_len = heads * DELTA.k_dim * DELTA.v_dim;
    let mut final_state = gpu.alloc(lens.len() * state_len).unwrap();
    let (mut conv, mut beta, mut g) = (
        gpu.alloc(rows * channels).unwrap(),
        gpu.alloc(rows * heads).unwrap(),
        gpu.alloc(rows * heads).unwrap(),
    );
    let out_len = rows * heads * DELTA.v_dim;
    let mut out = gpu.alloc(out_len).unwrap();
    gpu.delta_net_core(
        DeltaNetInput {
            x: &x,
            x_at: Strided::cols(width, 0),
            conv_weight: &wts.conv,
            kernel: 4,
            l2_eps: 1e-6,
            gates,
        },
        Varlen {
            cu_seqlens: &cu,
            num_seqs: lens.len(),
            rows,
        },
        DELTA,
        DeltaState {
            initial: None,
            final_out: Some(&mut final_state),
            final_at: None,
        },
        DeltaNetScratch {
            conv: &mut conv,
            beta: &mut beta,
            g: &mut g,
        },
        &mut out,
    )
    .unwrap();
    (
        gpu.read(&out, out_len).unwrap(),
        gpu.read(&final_state, lens.len() * state_len).unwrap(),
    )
}

/// One sequence alone (32 (sequence, head) pairs: the 32-column state pass on a 132-SM GPU) vs
/// inside batches of 3, 32 and 2 sequences (the 64-column pass): its output rows and final state,
/// bit for bit.
#[test]
#[ignore = "needs a GPU"]
fn the_delta_rule_of_a_sequence_does_not_depend_on_its_batch() {
    let gpu = gpu();
    let mut rng = StdRng::seed_from_u64(184);
    let width = delta_width();
    let weights = DeltaWeights {
        conv: gpu
            .upload(&bf16_round(&rand_vec(&mut rng, DELTA.qkv_width() * 4, 0.7)))
            .unwrap(),
        a_log: gpu
            .upload(&bf16_round(&rand_vec(&mut rng, DELTA.v_heads, 1.0)))
            .unwrap(),
        dt_bias: gpu
            .upload(&bf16_round(&rand_vec(&mut rng, DELTA.v_heads, 2.0)))
            .unwrap(),
    };
    let out_w = DELTA.v_heads * DELTA.v_dim;
    let state_len = DELTA.v_heads * DELTA.k_dim * DELTA.v_dim;
    let seq = |rng: &mut StdRng, n: usize| bf16_round(&rand_vec(rng, n * width, 1.5));
    let many: Vec<usize> = (0..31).map(|i| 100 + 17 * i).collect();
    let mixes: [(&[usize], &[usize]); 3] =
        [(&[3], &[130, 64]), (&many[..10], &many[10..]), (&[], &[1])];
    let mut failures = Vec::new();
    for target_len in [1, 63, 139, 712] {
        let target = seq(&mut rng, target_len);
        let (alone_out, alone_state) = delta_core(&gpu, &weights, &[&target]);
        for (before, after) in mixes {
            let others = others_of(before, after, |n| seq(&mut rng, n));
            let seqs = around(&others, before.len(), &target);
            let at = before.len();
            let start: usize = before.iter().sum();
            let what = format!(
                "{target_len}-row sequence alone vs as sequence {at} of {}",
                seqs.len()
            );
            let (out, state) = delta_core(&gpu, &weights, &seqs);
            compare(
                &mut failures,
                format!("output rows: {what}"),
                &out[start * out_w..(start + target_len) * out_w],
                &alone_out,
            );
            compare(
                &mut failures,
                format!("final state: {what}"),
                &state[at * state_len..(at + 1) * state_len],
                &alone_state,
            );
        }
    }
    assert_none(&failures);
}
