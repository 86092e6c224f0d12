//! The CUDA backend's carried ops (prefix-state reuse and chunked prompts) against the CPU
//! reference: `gated_attention_carried` with each sequence's prefix keys before its own and every
//! row's k/v written out, and `delta_net_core_carried` with the conv window and the recurrent state
//! in and out. Ragged batches mixing resumed and fresh sequences, own lengths of 1 and not
//! multiples of 64, prefixes of 0, 1, 63, 64, 65 and 200 rows. And `copy_many`, which stages the
//! states a carried pass starts from.
//!
//! These need a GPU: `cargo test -p instinct-kernels --test cuda_carried -- --ignored`.
//!
//! The same code runs both backends (generic over [`Backend`]); weights are bf16-exact so both
//! compute with the same numbers. The resumed attention is the flash kernel's prefix form (bf16
//! operands, the flash tolerance against the CPU), and on the GPU a resumed sequence's rows must
//! equal the same rows of the whole prompt run at once; the delta rule's GPU products are bf16, as
//! in `cuda_ops`.

mod common;
use common::{bf16_round, cu_of, gpu, max_diff, rand_vec};

use instinct_kernels::{
    AttentionDims, AttentionOutput, Backend, ConvWindow, CopyPart, CpuBackend, DeltaCarry,
    DeltaDims, DeltaGates, DeltaNetInput, DeltaNetScratch, DeltaState, PrefixKv, QkPrologue, Rope,
    Strided, Varlen,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Qwen3.5-4B full attention: 16 query heads over 4 kv heads of 256.
const REAL: AttentionDims = AttentionDims {
    q_heads: 16,
    kv_heads: 4,
    head_dim: 256,
    scale: 0.0625,
};

/// (own lengths, prefix lengths) of the batches: a lone token after a prefix; resumed and fresh
/// sequences mixed at the chunk grid's edges.
const BATCHES: &[(&[usize], &[usize])] = &[
    (&[1], &[200]),
    (&[70], &[0]),
    (&[1, 64, 3, 129], &[63, 0, 1, 65]),
    (&[65, 1, 2], &[64, 0, 130]),
];

/// Values that must agree: `|got − want| ≤ tol · (1 + |want|)` everywhere.
#[track_caller]
fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}: index {i}: cuda {g} vs cpu {w}"
        );
    }
}

/// One attention case's host data.
struct AttentionCase {
    dims: AttentionDims,
    own: Vec<usize>,
    prefix: Vec<usize>,
    qkv: Vec<f32>,
    prefix_k: Vec<f32>,
    prefix_v: Vec<f32>,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    positions: Vec<u32>,
    rope: Rope,
}

impl AttentionCase {
    fn new(rng: &mut StdRng, dims: AttentionDims, own: &[usize], prefix: &[usize]) -> Self {
        let rows: usize = own.iter().sum();
        let prefix_rows: usize = prefix.iter().sum();
        let kv_w = dims.kv_heads * dims.head_dim;
        // Each sequence's own rows continue its prefix's positions.
        let positions = own
            .iter()
            .zip(prefix)
            .flat_map(|(&n, &p)| (0..n as u32).map(move |t| p as u32 + t))
            .flat_map(|t| [t, t, t])
            .collect();
        let half = 32;
        Self {
            dims,
            own: own.to_vec(),
            prefix: prefix.to_vec(),
            qkv: rand_vec(rng, rows * dims.stacked_width(), 2.0),
            prefix_k: rand_vec(rng, prefix_rows * kv_w, 2.0),
            prefix_v: rand_vec(rng, prefix_rows * kv_w, 1.0),
            q_norm: bf16_round(&rand_vec(rng, dims.head_dim, 0.5)),
            k_norm: bf16_round(&rand_vec(rng, dims.head_dim, 0.5)),
            positions,
            rope: Rope {
                rotary_dim: 2 * half,
                theta: 10_000_000.0,
                section: [half - 2 * (half / 3), half / 3, half / 3],
                interleaved: true,
            },
        }
    }

    fn rows(&self) -> usize {
        self.own.iter().sum()
    }

    /// The op on `be`: (out, k out, v out), with the prefix or without, every row or the last.
    fn run<B: Backend>(
        &self,
        be: &B,
        with_prefix: bool,
        last_only: bool,
        bf16_out: bool,
    ) -> [Vec<f32>; 3] {
        self.run_padded(be, (with_prefix, last_only, bf16_out), 0)
    }

    /// [`Self::run`] launched for `pad` rows more than the sequences hold (rows in no sequence,
    /// as a pass padded to a captured shape has), returning the sequences' rows only.
    fn run_padded<B: Backend>(
        &self,
        be: &B,
        (with_prefix, last_only, bf16_out): (bool, bool, bool),
        pad: usize,
    ) -> [Vec<f32>; 3] {
        let (dims, real_rows) = (self.dims, self.rows());
        let rows = real_rows + pad;
        let kv_w = dims.kv_heads * dims.head_dim;
        let up_idx = |data: &[u32]| {
            let mut b = be.alloc_idx(data.len().max(1)).unwrap();
            be.write_idx(&mut b, data).unwrap();
            b
        };
        let act = |data: &[f32]| {
            let mut b = be.alloc(data.len().max(1)).unwrap();
            be.write(&mut b, data).unwrap();
            b
        };
        let cu = up_idx(&cu_of(&self.own));
        let cu_prefix = up_idx(&cu_of(&self.prefix));
        let mut positions = self.positions.clone();
        positions.resize(3 * rows, 0);
        let positions = up_idx(&positions);
        let (q_norm, k_norm) = (
            be.upload(&self.q_norm).unwrap(),
            be.upload(&self.k_norm).unwrap(),
        );
        let (pk, pv) = (act(&self.prefix_k), act(&self.prefix_v));
        let mut padded_qkv = self.qkv.clone();
        padded_qkv.resize(rows * dims.stacked_width(), 3.0);
        let mut qkv = act(&padded_qkv);
        let out_rows = if last_only { self.own.len() } else { rows };
        let real_out_rows = if last_only { self.own.len() } else { real_rows };
        let width = dims.q_heads * dims.head_dim;
        // One spare row that must stay untouched.
        let out_len = (out_rows + 1) * width;
        let mut out = if bf16_out {
            be.alloc_gemm_input(out_len).unwrap()
        } else {
            be.alloc(out_len).unwrap()
        };
        be.write(&mut out, &vec![7.0; out_len]).unwrap();
        let (mut k_out, mut v_out) = (
            be.alloc(rows * kv_w).unwrap(),
            be.alloc(rows * kv_w).unwrap(),
        );
        let prefix = with_prefix.then_some(PrefixKv {
            k: &pk,
            v: &pv,
            cu_prefix: &cu_prefix,
            rows: self.prefix.iter().sum(),
        });
        be.gated_attention_carried(
            &mut qkv,
            QkPrologue {
                q_norm: &q_norm,
                k_norm: &k_norm,
                positions: &positions,
                rope: &self.rope,
                eps: 1e-6,
            },
            Varlen {
                cu_seqlens: &cu,
                num_seqs: self.own.len(),
                rows,
            },
            dims,
            prefix,
            AttentionOutput {
                out: &mut out,
                last_only,
                kv: Some((&mut k_out, &mut v_out)),
            },
        )
        .unwrap();
        let out = be.read(&out, out_len).unwrap();
        assert!(
            out[out_rows * width..].iter().all(|&x| x == 7.0),
            "{}: wrote past the output rows",
            be.name()
        );
        [
            out[..real_out_rows * width].to_vec(),
            be.read(&k_out, real_rows * kv_w).unwrap(),
            be.read(&v_out, real_rows * kv_w).unwrap(),
        ]
    }
}

#[test]
#[ignore = "needs a GPU"]
fn gated_attention_carried_matches_cpu() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = StdRng::seed_from_u64(61);
    let small = AttentionDims {
        q_heads: 4,
        kv_heads: 2,
        head_dim: 96,
        scale: 96f32.powf(-0.5),
    };
    for dims in [REAL, small] {
        for &(own, prefix) in BATCHES {
            let case = AttentionCase::new(&mut rng, dims, own, prefix);
            for (with_prefix, last_only, bf16_out) in [
                (true, false, false),
                (true, true, false),
                (true, false, true),
                (false, false, false),
                (false, true, true),
            ] {
                let what = format!(
                    "heads {}x{}, own {own:?}, prefix {prefix:?} (used {with_prefix}), \
                     last {last_only}, bf16 out {bf16_out}",
                    dims.q_heads, dims.head_dim
                );
                let [want, want_k, want_v] = case.run(&cpu, with_prefix, last_only, false);
                let [got, got_k, got_v] = case.run(&gpu, with_prefix, last_only, bf16_out);
                // The rows a snapshot keeps: k after the norm and rope, v as projected.
                assert_close(&got_k, &want_k, 1e-4, &format!("{what}: k out"));
                assert_eq!(got_v, want_v, "{what}: v out is a copy");
                // The flash kernel's bf16 operands (cuda_attention's tolerance), rounded once
                // more into a bf16 output.
                let (want, tol) = if bf16_out {
                    (bf16_round(&want), 2e-2)
                } else {
                    (want, 1e-2)
                };
                assert_close(&got, &want, tol, &what);
            }
        }
    }
}

/// Rows in no sequence (a pass padded to a captured shape) change nothing: the sequences' outputs
/// and k/v rows are the unpadded launch's bits, with a prefix or without, every row or the last.
/// (With a prefix, such rows once wrote their keys over a sequence's joined keys.)
#[test]
#[ignore = "needs a GPU"]
fn gated_attention_carried_ignores_rows_in_no_sequence() {
    attention_ignores_rows_in_no_sequence(&gpu());
}

/// The same on the CPU reference (which computes sequence by sequence).
#[test]
fn on_the_cpu_gated_attention_carried_ignores_rows_in_no_sequence() {
    attention_ignores_rows_in_no_sequence(&CpuBackend::new());
}

fn attention_ignores_rows_in_no_sequence<B: Backend>(be: &B) {
    let mut rng = StdRng::seed_from_u64(67);
    for &(own, prefix) in BATCHES {
        let case = AttentionCase::new(&mut rng, REAL, own, prefix);
        for flags in [
            (true, false, false),
            (true, true, true),
            (false, false, false),
        ] {
            let want = case.run(be, flags.0, flags.1, flags.2);
            for pad in [1, 5, 64] {
                let got = case.run_padded(be, flags, pad);
                for (part, (g, w)) in ["out", "k out", "v out"].iter().zip(got.iter().zip(&want)) {
                    assert!(
                        g == w,
                        "own {own:?}, prefix {prefix:?}, flags {flags:?}, {pad} rows padded: {part}"
                    );
                }
            }
        }
    }
}

/// One DeltaNet case: a stacked projection (q|k|v, then b and a) of the batch, the conv weight,
/// the gates' parameters, and each sequence's incoming window and state.
struct DeltaCase {
    dims: DeltaDims,
    taps: usize,
    own: Vec<usize>,
    stacked: Vec<f32>,
    width: usize,
    conv_w: Vec<f32>,
    a_log: Vec<f32>,
    dt_bias: Vec<f32>,
    window: Vec<f32>,
    state: Vec<f32>,
}

impl DeltaCase {
    fn rows(&self) -> usize {
        self.own.iter().sum()
    }

    fn window_len(&self) -> usize {
        self.own.len() * (self.taps - 1) * self.dims.qkv_width()
    }

    fn state_len(&self) -> usize {
        self.own.len() * self.dims.v_heads * self.dims.k_dim * self.dims.v_dim
    }

    /// The op on `be` (projection in bf16 where `bf16_x`): (out, window out, final state). `run`
    /// says which entry point: the carried op (with the window and state in, or from zeros), or
    /// plain `delta_net_core` with no window (the whole prompt's path; no window out).
    fn run<B: Backend>(&self, be: &B, run: DeltaRun, bf16_x: bool) -> [Vec<f32>; 3] {
        self.run_at(be, run, bf16_x, None)
    }

    /// [`Self::run`], the window and state taken after `at[s]` tokens of each sequence `s`
    /// (`DeltaState::final_at`, `ConvWindow::output_at`) where given.
    fn run_at<B: Backend>(
        &self,
        be: &B,
        run: DeltaRun,
        bf16_x: bool,
        at: Option<&[u32]>,
    ) -> [Vec<f32>; 3] {
        let carried_in = run == DeltaRun::Resumed;
        let (dims, rows) = (self.dims, self.rows());
        let (channels, heads) = (self.dims.qkv_width(), dims.v_heads);
        let act = |data: &[f32], bf16: bool| {
            let mut b = if bf16 {
                be.alloc_gemm_input(data.len().max(1)).unwrap()
            } else {
                be.alloc(data.len().max(1)).unwrap()
            };
            be.write(&mut b, data).unwrap();
            b
        };
        let mut cu = be.alloc_idx(self.own.len() + 1).unwrap();
        be.write_idx(&mut cu, &cu_of(&self.own)).unwrap();
        let x = act(&self.stacked, bf16_x);
        let (w, a_log, dt_bias) = (
            be.upload(&self.conv_w).unwrap(),
            be.upload(&self.a_log).unwrap(),
            be.upload(&self.dt_bias).unwrap(),
        );
        let (window_in, state_in) = (act(&self.window, false), act(&self.state, false));
        let mut window_out = be.alloc(self.window_len()).unwrap();
        let mut state_out = be.alloc(self.state_len()).unwrap();
        let at = at.map(|at| {
            let mut idx = be.alloc_idx(at.len()).unwrap();
            be.write_idx(&mut idx, at).unwrap();
            idx
        });
        let (mut conv, mut beta, mut g) = (
            be.alloc(rows * channels).unwrap(),
            be.alloc(rows * heads).unwrap(),
            be.alloc(rows * heads).unwrap(),
        );
        let out_len = rows * heads * dims.v_dim;
        let mut out = be.alloc(out_len).unwrap();
        let width = self.width;
        let input = DeltaNetInput {
            x: &x,
            x_at: Strided::cols(width, 0),
            conv_weight: &w,
            kernel: self.taps,
            l2_eps: 1e-6,
            gates: DeltaGates {
                b: &x,
                b_at: Strided::cols(width, width - 2 * heads),
                a: &x,
                a_at: Strided::cols(width, width - heads),
                a_log: &a_log,
                dt_bias: &dt_bias,
                heads,
            },
        };
        let batch = Varlen {
            cu_seqlens: &cu,
            num_seqs: self.own.len(),
            rows,
        };
        let scratch = DeltaNetScratch {
            conv: &mut conv,
            beta: &mut beta,
            g: &mut g,
        };
        let state = DeltaState {
            initial: carried_in.then_some(&state_in),
            final_out: Some(&mut state_out),
            final_at: at.as_ref(),
        };
        if run == DeltaRun::Whole {
            be.delta_net_core(input, batch, dims, state, scratch, &mut out)
                .unwrap();
            return [
                be.read(&out, out_len).unwrap(),
                Vec::new(),
                be.read(&state_out, self.state_len()).unwrap(),
            ];
        }
        let carry = DeltaCarry {
            state,
            window: ConvWindow {
                input: carried_in.then_some(&window_in),
                output: Some(&mut window_out),
                output_at: at.as_ref(),
            },
        };
        be.delta_net_core_carried(input, batch, dims, carry, scratch, &mut out)
            .unwrap();
        [
            be.read(&out, out_len).unwrap(),
            be.read(&window_out, self.window_len()).unwrap(),
            be.read(&state_out, self.state_len()).unwrap(),
        ]
    }
}

/// Which entry point [`DeltaCase::run`] takes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum DeltaRun {
    /// `delta_net_core`: no window in or out, states from zeros.
    Whole,
    /// `delta_net_core_carried` from zeros, the window and state written out (a prefix's pass).
    Snapshotting,
    /// `delta_net_core_carried` from the case's window and state.
    Resumed,
}

/// Rows `spans[s]` (start, len) of each sequence `s` of `values`, `width` values a row, where the
/// sequences hold `lens` rows.
fn pick_rows(values: &[f32], width: usize, lens: &[usize], spans: &[(usize, usize)]) -> Vec<f32> {
    let mut packed = Vec::new();
    let mut at = 0;
    for (&(start, len), &n) in spans.iter().zip(lens) {
        packed.extend_from_slice(&values[(at + start) * width..(at + start + len) * width]);
        at += n;
    }
    packed
}

#[test]
#[ignore = "needs a GPU"]
fn delta_net_core_carried_matches_cpu() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = StdRng::seed_from_u64(67);
    let real = DeltaDims {
        k_heads: 16,
        v_heads: 32,
        k_dim: 128,
        v_dim: 128,
    };
    let narrow = DeltaDims {
        k_heads: 2,
        v_heads: 4,
        k_dim: 64,
        v_dim: 96,
    };
    for (dims, taps) in [(real, 4), (narrow, 4), (narrow, 3)] {
        for &(own, _) in BATCHES {
            let channels = dims.qkv_width();
            let heads = dims.v_heads;
            let width = channels + 2 * heads;
            let rows: usize = own.iter().sum();
            let mut case = DeltaCase {
                dims,
                taps,
                own: own.to_vec(),
                stacked: bf16_round(&rand_vec(&mut rng, rows * width, 1.5)),
                width,
                conv_w: bf16_round(&rand_vec(&mut rng, channels * taps, 0.7)),
                a_log: bf16_round(&rand_vec(&mut rng, heads, 1.0)),
                dt_bias: bf16_round(&rand_vec(&mut rng, heads, 2.0)),
                window: Vec::new(),
                state: Vec::new(),
            };
            // A window as a conv input and a state of the size a prefix leaves.
            case.window = bf16_round(&rand_vec(&mut rng, case.window_len(), 1.5));
            case.state = (0..case.state_len())
                .map(|_| rng.gen_range(-0.3..0.3))
                .collect();
            for (run, bf16_x) in [
                (DeltaRun::Resumed, true),
                (DeltaRun::Resumed, false),
                (DeltaRun::Snapshotting, true),
            ] {
                let carried_in = run == DeltaRun::Resumed;
                let what = format!(
                    "{dims:?}, {taps} taps, own {own:?}, carried in {carried_in}, bf16 x {bf16_x}"
                );
                let [want, want_window, want_state] = case.run(&cpu, run, false);
                let [got, got_window, got_state] = case.run(&gpu, run, bf16_x);
                assert_eq!(
                    got_window, want_window,
                    "{what}: the window is a copy of inputs"
                );
                assert_close(&got, &want, 2e-2, &format!("{what}: out"));
                assert_close(&got_state, &want_state, 2e-2, &format!("{what}: state"));
            }
        }
    }
}

/// On the GPU, a DeltaNet layer run as prefix → snapshot → resumed tail computes what the whole
/// prompt's fused path (`delta_net_core`) does. With every cut on the 64-token chunk grid: bit for
/// bit, the prefix's own rows (the snapshotting pass writes windows out), the tail's
/// rows and the final state. Off the grid the tail restarts the chunks at its cut and rounds
/// differently: within the CPU comparison's tolerance, and the sizes are printed.
#[test]
#[ignore = "needs a GPU"]
fn a_resumed_delta_net_layer_runs_as_its_whole_prompt_on_the_gpu() {
    let gpu = gpu();
    let mut rng = StdRng::seed_from_u64(71);
    let dims = DeltaDims {
        k_heads: 16,
        v_heads: 32,
        k_dim: 128,
        v_dim: 128,
    };
    let (taps, heads, channels) = (4, dims.v_heads, dims.qkv_width());
    let width = channels + 2 * heads;
    let conv_w = bf16_round(&rand_vec(&mut rng, channels * taps, 0.7));
    let a_log = bf16_round(&rand_vec(&mut rng, heads, 1.0));
    let dt_bias = bf16_round(&rand_vec(&mut rng, heads, 2.0));
    // (prefix, tail) per sequence: a lone tail token, tails shorter and longer than a chunk, a
    // fifth sequence so the state pass takes its wide slices.
    let on_grid: &[(usize, usize)] = &[(64, 70), (128, 1), (192, 65), (64, 64), (256, 3)];
    let off_grid: &[(usize, usize)] = &[(63, 10), (1, 100), (65, 64), (130, 1)];
    for (cuts, exact) in [(on_grid, true), (off_grid, false)] {
        let whole_lens: Vec<usize> = cuts.iter().map(|&(p, t)| p + t).collect();
        let rows: usize = whole_lens.iter().sum();
        let case = |own: Vec<usize>, stacked: Vec<f32>, window, state| DeltaCase {
            dims,
            taps,
            own,
            stacked,
            width,
            conv_w: conv_w.clone(),
            a_log: a_log.clone(),
            dt_bias: dt_bias.clone(),
            window,
            state,
        };
        let whole = case(
            whole_lens.clone(),
            bf16_round(&rand_vec(&mut rng, rows * width, 1.5)),
            Vec::new(),
            Vec::new(),
        );
        let [whole_out, _, whole_state] = whole.run(&gpu, DeltaRun::Whole, true);
        let prefix_spans: Vec<(usize, usize)> = cuts.iter().map(|&(p, _)| (0, p)).collect();
        let tail_spans: Vec<(usize, usize)> = cuts.iter().map(|&(p, t)| (p, t)).collect();
        let pick = |values: &[f32], w: usize, spans: &[(usize, usize)]| {
            pick_rows(values, w, &whole_lens, spans)
        };
        let prefix = case(
            cuts.iter().map(|&(p, _)| p).collect(),
            pick(&whole.stacked, width, &prefix_spans),
            Vec::new(),
            Vec::new(),
        );
        let [prefix_out, window, state] = prefix.run(&gpu, DeltaRun::Snapshotting, true);
        let tail = case(
            cuts.iter().map(|&(_, t)| t).collect(),
            pick(&whole.stacked, width, &tail_spans),
            window,
            state,
        );
        let [tail_out, _, tail_state] = tail.run(&gpu, DeltaRun::Resumed, true);
        let out_w = heads * dims.v_dim;
        let want_prefix = pick(&whole_out, out_w, &prefix_spans);
        let want_tail = pick(&whole_out, out_w, &tail_spans);
        eprintln!(
            "cuts {cuts:?}: prefix rows {:e}, tail rows {:e}, final state {:e}",
            max_diff(&prefix_out, &want_prefix),
            max_diff(&tail_out, &want_tail),
            max_diff(&tail_state, &whole_state)
        );
        if exact {
            assert_eq!(prefix_out, want_prefix, "prefix rows, cuts on the grid");
            assert_eq!(tail_out, want_tail, "tail rows, cuts on the grid");
            assert_eq!(tail_state, whole_state, "final states, cuts on the grid");
        } else {
            assert_close(&tail_out, &want_tail, 2e-2, "tail rows, cuts off the grid");
            assert_close(
                &tail_state,
                &whole_state,
                2e-2,
                "final states, cuts off the grid",
            );
        }
    }
}

/// A snapshot taken inside a pass (`final_at` / `output_at`: the state and window after the
/// first `p` tokens of each sequence, the pass running on to its end) is the snapshot a pass of the
/// prefixes alone leaves, and the rows of the pass are those of the prefix then the tail resumed
/// from it. On the CPU the rule restarts its chunks at the cut, so both hold at any cut, bit for
/// bit; on the GPU at cuts on the 64-token chunk grid (or a sequence's end), bit for bit, and the
/// pass's rows are also those of the same pass without the snapshot. Cuts at 0, at the end, and
/// lengths of 1; sequences resumed from a window and state and fresh ones.
fn a_snapshot_inside_a_pass_is_the_prefixs_own<B: Backend>(be: &B, cuts: &[(usize, usize)]) {
    let mut rng = StdRng::seed_from_u64(73);
    let dims = DeltaDims {
        k_heads: 2,
        v_heads: 4,
        k_dim: 64,
        v_dim: 96,
    };
    let (taps, heads, channels) = (4, dims.v_heads, dims.qkv_width());
    let width = channels + 2 * heads;
    let whole_lens: Vec<usize> = cuts.iter().map(|&(p, t)| p + t).collect();
    let rows: usize = whole_lens.iter().sum();
    let case = |own: Vec<usize>, stacked: Vec<f32>, window: Vec<f32>, state: Vec<f32>| DeltaCase {
        dims,
        taps,
        own,
        stacked,
        width,
        conv_w: bf16_round(&rand_vec(
            &mut StdRng::seed_from_u64(5),
            channels * taps,
            0.7,
        )),
        a_log: bf16_round(&rand_vec(&mut StdRng::seed_from_u64(6), heads, 1.0)),
        dt_bias: bf16_round(&rand_vec(&mut StdRng::seed_from_u64(7), heads, 2.0)),
        window,
        state,
    };
    let mut whole = case(
        whole_lens.clone(),
        bf16_round(&rand_vec(&mut rng, rows * width, 1.5)),
        Vec::new(),
        Vec::new(),
    );
    whole.window = bf16_round(&rand_vec(&mut rng, whole.window_len(), 1.5));
    whole.state = (0..whole.state_len())
        .map(|_| rng.gen_range(-0.3..0.3))
        .collect();
    let at: Vec<u32> = cuts.iter().map(|&(p, _)| p as u32).collect();
    let pick = |values: &[f32], w: usize, spans: &[(usize, usize)]| {
        pick_rows(values, w, &whole_lens, spans)
    };
    let prefix_spans: Vec<(usize, usize)> = cuts.iter().map(|&(p, _)| (0, p)).collect();
    let tail_spans: Vec<(usize, usize)> = cuts.iter().map(|&(p, t)| (p, t)).collect();
    let out_w = heads * dims.v_dim;
    for run in [DeltaRun::Resumed, DeltaRun::Snapshotting] {
        let what = format!(
            "{}, cuts {cuts:?}, resumed {}",
            be.name(),
            run == DeltaRun::Resumed
        );
        let [out, window, state] = whole.run_at(be, run, true, Some(&at));
        let prefix = case(
            cuts.iter().map(|&(p, _)| p).collect(),
            pick(&whole.stacked, width, &prefix_spans),
            whole.window.clone(),
            whole.state.clone(),
        );
        let [prefix_out, want_window, want_state] = prefix.run(be, run, true);
        assert_eq!(window, want_window, "{what}: the window");
        assert_eq!(state, want_state, "{what}: the state");
        assert_eq!(
            pick(&out, out_w, &prefix_spans),
            prefix_out,
            "{what}: the prefix rows"
        );
        let tail = case(
            cuts.iter().map(|&(_, t)| t).collect(),
            pick(&whole.stacked, width, &tail_spans),
            want_window,
            want_state,
        );
        let [tail_out, _, _] = tail.run(be, DeltaRun::Resumed, true);
        if be.snapshot_grid() == 1 {
            assert_eq!(
                pick(&out, out_w, &tail_spans),
                tail_out,
                "{what}: the tail rows"
            );
        } else {
            let [plain_out, _, plain_state] = whole.run(be, run, true);
            assert_eq!(out, plain_out, "{what}: the rows, as without the snapshot");
            let [_, _, end_state] = tail.run(be, DeltaRun::Resumed, true);
            assert_eq!(
                end_state, plain_state,
                "{what}: the state at the end, resumed"
            );
            assert_close(
                &pick(&out, out_w, &tail_spans),
                &tail_out,
                1e-5,
                &format!("{what}: the tail rows"),
            );
        }
    }
}

#[test]
fn a_snapshot_inside_a_pass_is_the_prefixs_own_on_the_cpu() {
    let cuts = [(0, 5), (3, 1), (1, 0), (70, 9), (64, 64), (0, 1)];
    a_snapshot_inside_a_pass_is_the_prefixs_own(&CpuBackend::new(), &cuts);
}

#[test]
#[ignore = "needs a GPU"]
fn a_snapshot_inside_a_pass_is_the_prefixs_own_on_the_gpu() {
    // On the grid, or at a sequence's end (1 of 1, 70 of 70); at 0 the state in is the snapshot.
    let cuts = [
        (0, 5),
        (64, 1),
        (1, 0),
        (128, 9),
        (64, 64),
        (70, 0),
        (192, 70),
    ];
    a_snapshot_inside_a_pass_is_the_prefixs_own(&gpu(), &cuts);
}

/// `copy` moves a range between offsets exactly (states move between a batch's packed buffers and
/// the snapshots kept on the device), refuses ranges past either end, and leaves the rest of the
/// destination as it was; the same on both backends.
fn copy_between_offsets<B: Backend>(be: &B) {
    let src: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5 - 7.0).collect();
    let mut src_f32 = be.alloc(src.len()).unwrap();
    be.write(&mut src_f32, &src).unwrap();
    let mut dst = be.alloc(700).unwrap();
    be.write(&mut dst, &vec![3.0; 700]).unwrap();
    for (src_at, dst_at, len) in [
        (0, 0, 1),
        (1, 5, 63),
        (129, 300, 400),
        (999, 699, 1),
        (10, 10, 0),
    ] {
        be.copy(&src_f32, src_at, &mut dst, dst_at, len).unwrap();
    }
    let mut want = vec![3.0; 700];
    for (src_at, dst_at, len) in [(0, 0, 1), (1, 5, 63), (129, 300, 400), (999, 699, 1)] {
        want[dst_at..dst_at + len].copy_from_slice(&src[src_at..src_at + len]);
    }
    assert_eq!(be.read(&dst, 700).unwrap(), want);
    assert!(
        be.copy(&src_f32, 990, &mut dst, 0, 11).is_err(),
        "past the source"
    );
    assert!(
        be.copy(&src_f32, 0, &mut dst, 650, 51).is_err(),
        "past the destination"
    );
    assert_eq!(
        be.read(&dst, 700).unwrap(),
        want,
        "a refused copy writes nothing"
    );
}

#[test]
fn copy_moves_a_range_between_offsets_on_the_cpu() {
    copy_between_offsets(&CpuBackend::new());
}

#[test]
#[ignore = "needs a GPU"]
fn copy_moves_a_range_between_offsets_on_the_gpu() {
    copy_between_offsets(&gpu());
}

/// On the GPU, a sequence resumed from its prefix's keys (as a snapshot holds them) attends as the
/// whole prompt run at once does, row for row: every own row, and each sequence's last row alone,
/// against plain `gated_attention` on the whole prompts.
#[test]
#[ignore = "needs a GPU"]
fn a_resumed_sequence_attends_as_its_whole_prompt_on_the_gpu() {
    let gpu = gpu();
    let mut rng = StdRng::seed_from_u64(67);
    let dims = REAL;
    let (width, kv_w) = (dims.stacked_width(), dims.kv_heads * dims.head_dim);
    let out_w = dims.q_heads * dims.head_dim;
    // (prefix, own) per sequence: off and on the 64-key tile grid, a lone token, a long prefix.
    let seqs: [(usize, usize); 5] = [(63, 1), (64, 70), (1, 129), (200, 3), (130, 64)];
    let whole: Vec<usize> = seqs.iter().map(|&(p, n)| p + n).collect();
    let rows: usize = whole.iter().sum();
    let qkv = rand_vec(&mut rng, rows * width, 2.0);
    let positions: Vec<u32> = whole
        .iter()
        .flat_map(|&n| (0..n as u32).flat_map(|t| [t, t, t]))
        .collect();
    let q_norm = gpu
        .upload(&bf16_round(&rand_vec(&mut rng, dims.head_dim, 0.5)))
        .unwrap();
    let k_norm = gpu
        .upload(&bf16_round(&rand_vec(&mut rng, dims.head_dim, 0.5)))
        .unwrap();
    let rope = Rope {
        rotary_dim: 64,
        theta: 10_000_000.0,
        section: [12, 10, 10],
        interleaved: true,
    };
    let act = |data: &[f32]| {
        let mut b = gpu.alloc(data.len().max(1)).unwrap();
        gpu.write(&mut b, data).unwrap();
        b
    };
    let up_idx = |data: &[u32]| {
        let mut b = gpu.alloc_idx(data.len().max(1)).unwrap();
        gpu.write_idx(&mut b, data).unwrap();
        b
    };
    let prologue = |positions| QkPrologue {
        q_norm: &q_norm,
        k_norm: &k_norm,
        positions,
        rope: &rope,
        eps: 1e-6,
    };
    // The whole prompts, plain: every row, then each last row; and their keys (a snapshot's).
    let cu_whole = up_idx(&cu_of(&whole));
    let pos_whole = up_idx(&positions);
    let batch = Varlen {
        cu_seqlens: &cu_whole,
        num_seqs: seqs.len(),
        rows,
    };
    let run_whole = |last_only: bool| {
        let mut x = act(&qkv);
        let n = if last_only { seqs.len() } else { rows };
        let mut out = gpu.alloc(n * out_w).unwrap();
        gpu.gated_attention(
            &mut x,
            prologue(&pos_whole),
            batch,
            dims,
            last_only,
            &mut out,
        )
        .unwrap();
        gpu.read(&out, n * out_w).unwrap()
    };
    let (whole_rows, whole_last) = (run_whole(false), run_whole(true));
    let (mut k_all, mut v_all) = (
        gpu.alloc(rows * kv_w).unwrap(),
        gpu.alloc(rows * kv_w).unwrap(),
    );
    {
        let mut x = act(&qkv);
        let mut out = gpu.alloc(rows * out_w).unwrap();
        let output = AttentionOutput {
            out: &mut out,
            last_only: false,
            kv: Some((&mut k_all, &mut v_all)),
        };
        gpu.gated_attention_carried(&mut x, prologue(&pos_whole), batch, dims, None, output)
            .unwrap();
        // Taking the snapshot does not change the answer.
        assert_eq!(
            gpu.read(&out, rows * out_w).unwrap(),
            whole_rows,
            "snapshotting run"
        );
    }
    let (k_all, v_all) = (
        gpu.read(&k_all, rows * kv_w).unwrap(),
        gpu.read(&v_all, rows * kv_w).unwrap(),
    );

    // The resumed batch: each sequence's own rows, after its prefix's keys.
    let (mut own_qkv, mut own_pos, mut pk, mut pv) = (vec![], vec![], vec![], vec![]);
    let mut start = 0;
    for &(p, n) in &seqs {
        own_qkv.extend_from_slice(&qkv[(start + p) * width..(start + p + n) * width]);
        own_pos.extend((p as u32..(p + n) as u32).flat_map(|t| [t, t, t]));
        pk.extend_from_slice(&k_all[start * kv_w..(start + p) * kv_w]);
        pv.extend_from_slice(&v_all[start * kv_w..(start + p) * kv_w]);
        start += p + n;
    }
    let own: Vec<usize> = seqs.iter().map(|&(_, n)| n).collect();
    let pre: Vec<usize> = seqs.iter().map(|&(p, _)| p).collect();
    let own_rows: usize = own.iter().sum();
    let (cu_own, cu_pre, pos_own) = (up_idx(&cu_of(&own)), up_idx(&cu_of(&pre)), up_idx(&own_pos));
    let (pk, pv) = (act(&pk), act(&pv));
    let resumed = |last_only: bool| {
        let mut x = act(&own_qkv);
        let n = if last_only { seqs.len() } else { own_rows };
        let mut out = gpu.alloc(n * out_w).unwrap();
        let prefix = PrefixKv {
            k: &pk,
            v: &pv,
            cu_prefix: &cu_pre,
            rows: pre.iter().sum(),
        };
        let output = AttentionOutput {
            out: &mut out,
            last_only,
            kv: None,
        };
        let batch = Varlen {
            cu_seqlens: &cu_own,
            num_seqs: seqs.len(),
            rows: own_rows,
        };
        gpu.gated_attention_carried(
            &mut x,
            prologue(&pos_own),
            batch,
            dims,
            Some(prefix),
            output,
        )
        .unwrap();
        gpu.read(&out, n * out_w).unwrap()
    };
    let (got_rows, got_last) = (resumed(false), resumed(true));
    let mut want_rows = Vec::new();
    let mut start = 0;
    for &(p, n) in &seqs {
        want_rows.extend_from_slice(&whole_rows[(start + p) * out_w..(start + p + n) * out_w]);
        start += p + n;
    }
    let worst = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max)
    };
    eprintln!(
        "resumed vs whole: every row {:e}, last rows {:e}",
        worst(&got_rows, &want_rows),
        worst(&got_last, &whole_last)
    );
    // Bit for bit on an H200 (9c71f1c). Batch-invariant (the default), a last row is summed over
    // splits of four key tiles of its joined keys, resumed or whole: the same sums. (Before, the
    // whole prompts' last rows split by the batch's rows and the resumed ones did not: 1.9e-4
    // apart.)
    assert_eq!(got_rows, want_rows, "every own row");
    assert_eq!(got_last, whole_last, "each last row");
}

/// Copies by `copy_many` on `be`, and the two destinations read back: whole float4s, an unaligned odd-length run, several parts into
/// one buffer, an empty part, a single value.
fn copy_many_case<B: Backend>(be: &B) -> [Vec<f32>; 2] {
    let buf = |data: Vec<f32>| {
        let mut b = be.alloc(data.len()).unwrap();
        be.write(&mut b, &data).unwrap();
        b
    };
    let a = buf((0..5000).map(|i| i as f32 + 0.5).collect());
    let b = buf((0..37).map(|i| -(i as f32)).collect());
    let (mut x, mut y) = (be.alloc(6000).unwrap(), be.alloc(100).unwrap());
    let part = |src, src_at, dst, dst_at, len| CopyPart {
        src,
        src_at,
        dst,
        dst_at,
        len,
    };
    let parts = [
        part(&a, 0, 0, 0, 4096),
        part(&a, 3, 0, 4097, 901),
        part(&b, 1, 1, 5, 36),
        part(&b, 0, 1, 50, 0),
        part(&a, 4999, 1, 99, 1),
    ];
    be.copy_many(&mut [&mut x, &mut y], &parts).unwrap();
    [be.read(&x, 6000).unwrap(), be.read(&y, 100).unwrap()]
}

/// `copy_many` on the GPU (one launch) puts every value where the CPU's part-by-part copies do,
/// and refuses parts that overlap in a destination or name a missing one, writing nothing.
#[test]
#[ignore = "needs a GPU"]
fn copy_many_on_the_gpu_copies_each_part_as_copy_does() {
    let gpu = gpu();
    assert_eq!(copy_many_case(&gpu), copy_many_case(&CpuBackend::new()));
    let mut src = gpu.alloc(64).unwrap();
    gpu.write(&mut src, &[1.0; 64]).unwrap();
    let mut dst = gpu.alloc(64).unwrap();
    let part = |dst, dst_at| CopyPart {
        src: &src,
        src_at: 0,
        dst,
        dst_at,
        len: 8,
    };
    let err = gpu
        .copy_many(&mut [&mut dst], &[part(0, 0), part(0, 7)])
        .unwrap_err();
    assert!(err.to_string().contains("overlap"), "{err}");
    let err = gpu.copy_many(&mut [&mut dst], &[part(1, 0)]).unwrap_err();
    assert!(err.to_string().contains("no destination 1"), "{err}");
    let err = gpu.copy_many(&mut [&mut dst], &[part(0, 60)]).unwrap_err();
    assert!(err.to_string().contains("destination holds 64"), "{err}");
    assert_eq!(
        gpu.read(&dst, 64).unwrap(),
        vec![0.0; 64],
        "nothing written"
    );
}
