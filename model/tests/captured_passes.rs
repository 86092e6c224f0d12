//! Captured passes (CUDA graphs) on the tiny demo model: a pass padded to its captured shape and
//! replayed answers as the same batch run as launched, bit for bit, for every batch of a shape
//! (the batch-invariance rule makes the padding invisible), plain passes and passes that carry
//! prefix states (staged in the model's carry arena, reserved as a server with prefix reuse or
//! chunking on does) alike, snapshots included. On the CPU, the padding alone
//! (`CpuBackend::padding_passes`) against the CPU unpadded; on the GPU (`cargo test -p instinct-model --test captured_passes --
//! --ignored`), a backend with `cuda_graphs` against one without.

use instinct_kernels::backend::captured_shape;
use instinct_kernels::cuda::{CudaBackend, CudaOptions, GraphStats};
use instinct_kernels::{Backend, CpuBackend};
use instinct_model::decider::{Decider, Prompt, QuestionSegment};
use instinct_model::forward::BatchLimits;
use instinct_model::prefix::LayerState;

const LETTERS: usize = 6;

fn decider<B: Backend>(backend: B) -> (Decider<B>, Vec<u32>) {
    let loaded = instinct_model::demo::load_text(backend, BatchLimits::new(2048, 8)).unwrap();
    let paragraph = "The agent reads the screen and the question, then picks the letter of the \
                     action that moves the task forward without losing the user's data. ";
    let text = loaded.tokenizer.encode(&paragraph.repeat(20)).unwrap();
    assert!(text.len() >= 600, "{} tokens", text.len());
    (loaded.decider, text)
}

/// Batches (lengths of prefixes of the text), several per captured shape: the same shape's
/// batches differ in lengths and sequence counts, and shapes repeat after others ran.
const BATCHES: &[&[usize]] = &[
    &[139],
    &[150],
    &[139],
    &[5, 60, 1],
    &[7, 3],
    &[600, 2],
    &[1],
    &[16],
    &[70, 71, 72, 73, 74],
    &[139],
    &[5, 60, 1],
    &[300, 290, 280, 270, 260, 250, 240, 100],
];

fn answers<B: Backend>(d: &mut Decider<B>, text: &[u32], lens: &[usize]) -> Vec<Vec<f32>> {
    let prompts: Vec<Prompt> = lens
        .iter()
        .map(|&l| Prompt::text(&text[..l], LETTERS))
        .collect();
    d.decide(&prompts).unwrap()
}

#[test]
fn padded_passes_answer_as_unpadded_on_the_cpu() {
    let (mut own, text) = decider(CpuBackend::new());
    let (mut padded, _) = decider(CpuBackend::padding_passes());
    for lens in BATCHES {
        assert_eq!(
            answers(&mut padded, &text, lens),
            answers(&mut own, &text, lens),
            "{lens:?}"
        );
    }
}

fn gpu(cuda_graphs: bool) -> CudaBackend {
    CudaBackend::new(CudaOptions {
        cuda_graphs,
        ..CudaOptions::default()
    })
    .unwrap_or_else(|e| panic!("CUDA: {e}"))
}

/// Two deciders on the GPU, graphs off (`launched`) and on (`captured`, with its carry arena
/// reserved before the warm-up, as a server with prefix reuse on does), both warmed up (which
/// sizes every scratch; it captures the one-sequence shapes only where the GEMM tuning file of an
/// earlier run is missing, so a pass may be captured here or at its first batch), and the text.
fn warmed_pair() -> (Decider<CudaBackend>, Decider<CudaBackend>, Vec<u32>) {
    let (mut launched, text) = decider(gpu(false));
    let (mut captured, _) = decider(gpu(true));
    assert_eq!(launched.reserve_carry_arena().unwrap(), 0, "graphs off");
    assert!(captured.reserve_carry_arena().unwrap() > 0);
    launched.warm_shapes().unwrap();
    captured.warm_shapes().unwrap();
    (launched, captured, text)
}

fn stats(d: &Decider<CudaBackend>) -> GraphStats {
    d.backend().graph_probe().expect("graphs on").stats()
}

#[test]
#[ignore = "needs a GPU"]
fn on_the_gpu_replayed_passes_answer_as_launched_bit_for_bit() {
    let (mut launched, mut captured, text) = warmed_pair();
    assert!(launched.backend().graph_probe().is_none());
    let replays = |s: &GraphStats| s.replays.iter().map(|r| r.1).sum::<u64>();
    for (i, lens) in BATCHES.iter().enumerate() {
        let rows: usize = lens.iter().sum();
        let shape = captured.backend().pass_shape(rows, lens.len());
        let before = stats(&captured);
        let replay = shape.is_some_and(|shape| before.held.contains(&shape));
        let want = answers(&mut launched, &text, lens);
        let got = answers(&mut captured, &text, lens);
        assert_eq!(
            got, want,
            "batch {i} {lens:?} at {shape:?} (replay: {replay})"
        );
        let after = stats(&captured);
        match shape {
            Some(_) if replay => {
                assert_eq!(replays(&after), replays(&before) + 1, "batch {i} replays")
            }
            Some(shape) => {
                assert_eq!(after.captures, before.captures + 1, "batch {i} is captured");
                assert!(after.held.contains(&shape), "batch {i}: {after:?}");
            }
            // Too large to capture: run as launched, nothing counted.
            None => assert_eq!(
                (after.captures, after.misses, replays(&after)),
                (before.captures, before.misses, replays(&before)),
                "batch {i}"
            ),
        }
    }
    let s = stats(&captured);
    eprintln!("{s:?}");
    assert_eq!(s.failed, 0, "{:?}", s.last_failure);
    // Nothing went stale after the warm-up: every capture is held, none was redone.
    assert_eq!(s.captures as usize, s.held.len());
    assert!(replays(&s) >= 4, "{s:?}");
}

/// What a batch of segments gave: each answer, and each snapshot read back to the host.
type Outputs = Vec<(Option<Vec<f32>>, Option<Vec<Vec<f32>>>)>;

/// Passes that carry prefix states: prefixes snapshotted beside a fresh question, tails resumed
/// from them beside a fresh one, a snapshot taken inside a question beside a resumed tail; the
/// resumed batches twice more with other tails of the same shape (replays where captured).
fn carried<B: Backend>(d: &mut Decider<B>, text: &[u32]) -> Vec<Outputs> {
    let host = |d: &Decider<B>, out: Vec<instinct_model::decider::SegmentAnswer>| -> Outputs {
        out.into_iter()
            .map(|a| {
                let snapshot = a.snapshot.map(|s| {
                    let s = d.snapshot_on_host(&s).unwrap();
                    s.layers()
                        .iter()
                        .flat_map(|l| match l {
                            LayerState::DeltaNet { state, conv_window } => [
                                state.as_host().unwrap().to_vec(),
                                conv_window.as_host().unwrap().to_vec(),
                            ],
                            LayerState::Attention { k, v } => {
                                [k.as_host().unwrap().to_vec(), v.as_host().unwrap().to_vec()]
                            }
                        })
                        .collect()
                });
                (a.probabilities, snapshot)
            })
            .collect()
    };
    let mut all = Vec::new();
    let first = d
        .decide_segments(&[
            QuestionSegment::prefix(&text[..128], None),
            QuestionSegment::answer(Prompt::text(&text[..50], LETTERS), None),
            QuestionSegment::prefix(&text[200..264], None),
        ])
        .unwrap();
    let (a, b) = (
        first[0].snapshot.clone().unwrap(),
        first[2].snapshot.clone().unwrap(),
    );
    all.push(host(d, first));
    // Tails of one captured shape each way (`carried_batches_share_their_shapes`).
    for tail in TAILS {
        let out = d
            .decide_segments(&[
                QuestionSegment::answer(Prompt::text(&text[128..tail], LETTERS), Some(&a)),
                QuestionSegment::answer(Prompt::text(&text[264..tail], LETTERS), Some(&b)),
                QuestionSegment::answer(Prompt::text(&text[300..340], LETTERS), None),
            ])
            .unwrap();
        all.push(host(d, out));
        let inside = QuestionSegment {
            snapshot: true,
            snapshot_at: Some(64),
            ..QuestionSegment::answer(Prompt::text(&text[..tail - 164], LETTERS), None)
        };
        let out = d
            .decide_segments(&[
                inside,
                QuestionSegment::answer(Prompt::text(&text[128..tail - 100], LETTERS), Some(&a)),
            ])
            .unwrap();
        all.push(host(d, out));
    }
    all
}

/// The tails `carried` runs its two kinds of batch at, three times each.
const TAILS: [usize; 3] = [302, 303, 304];

/// Each kind of batch of `carried` pads to one captured shape at every tail, so the GPU test's
/// second and third runs replay it: the resumed batches hold `(t - 128) + (t - 264) + 40` rows
/// (252 to 256: 256), those snapshotting inside `(t - 164) + (t - 228)` (212 to 216: 216).
#[test]
fn carried_batches_share_their_shapes() {
    let shape = |rows: usize, seqs| captured_shape(rows, seqs).unwrap();
    let resumed = TAILS.map(|t| shape((t - 128) + (t - 264) + 40, 3));
    let inside = TAILS.map(|t| shape((t - 164) + (t - 228), 2));
    assert!(resumed.iter().all(|s| *s == resumed[0]), "{resumed:?}");
    assert!(inside.iter().all(|s| *s == inside[0]), "{inside:?}");
}

#[test]
fn padded_carried_passes_answer_as_unpadded_on_the_cpu() {
    let (mut own, text) = decider(CpuBackend::new());
    let (mut padded, _) = decider(CpuBackend::padding_passes());
    assert!(padded.reserve_carry_arena().unwrap() > 0);
    let (got, want) = (carried(&mut padded, &text), carried(&mut own, &text));
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(g == w, "batch {i}: padded and unpadded differ");
    }
}

#[test]
#[ignore = "needs a GPU"]
fn on_the_gpu_replayed_carried_passes_answer_as_launched_bit_for_bit() {
    let (mut launched, mut captured, text) = warmed_pair();
    let (got, want) = (carried(&mut captured, &text), carried(&mut launched, &text));
    let mut failures = Vec::new();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        for (s, (gs, ws)) in g.iter().zip(w).enumerate() {
            if gs.0 != ws.0 {
                let worst = gs.0.iter().flatten().zip(ws.0.iter().flatten());
                let worst = worst.map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                failures.push(format!(
                    "batch {i}, sequence {s}: answers, max |dp| {worst:e}"
                ));
            }
            if gs.1 != ws.1 {
                failures.push(format!("batch {i}, sequence {s}: snapshots"));
            }
        }
    }
    assert!(failures.is_empty(), "differ: {failures:?}");
    let s = stats(&captured);
    eprintln!("{s:?}");
    assert_eq!(s.failed, 0, "{:?}", s.last_failure);
    let carried_replays: u64 = s
        .replays
        .iter()
        .filter(|(shape, _)| shape.carry.carries())
        .map(|r| r.1)
        .sum();
    // The resumed batches and the batches snapshotting inside ran three times each.
    assert!(carried_replays >= 4, "{s:?}");
    // And a plain pass after them is captured, then replayed, answering as launched.
    let want = answers(&mut launched, &text, &[139]);
    assert_eq!(answers(&mut captured, &text, &[139]), want);
    let before = stats(&captured).replays.iter().map(|r| r.1).sum::<u64>();
    assert_eq!(answers(&mut captured, &text, &[139]), want);
    assert_eq!(
        stats(&captured).replays.iter().map(|r| r.1).sum::<u64>(),
        before + 1
    );
}

/// Each way a carried pass can be padded, alone: none, rows only, sequences only, prefix rows
/// only. Every variant's answers equal the launched ones bit for bit, first as launched from the
/// arena, then replayed (the differences are printed before the assertions, to tell which
/// padding moves the bits).
#[test]
#[ignore = "needs a GPU"]
fn on_the_gpu_each_carried_padding_alone_keeps_the_bits() {
    let (mut launched, mut captured, text) = warmed_pair();
    // Prefixes: a and b of 128 tokens, c of 256, d of 64; (start of the tail in the text).
    let prefixes = [(0, 128), (200, 328), (0, 256), (0, 64)];
    let snaps = |d: &mut Decider<CudaBackend>| {
        let segs: Vec<QuestionSegment> = prefixes
            .iter()
            .map(|&(from, to)| QuestionSegment::prefix(&text[from..to], None))
            .collect();
        let out = d.decide_segments(&segs).unwrap();
        out.into_iter()
            .map(|a| a.snapshot.unwrap())
            .collect::<Vec<_>>()
    };
    let (ours, theirs) = (snaps(&mut captured), snaps(&mut launched));
    // (name, [(prefix index, tail length)]): rows, sequences and prefix rows at a captured
    // shape's size, or one of them short of it.
    let variants: [(&str, &[(usize, usize)]); 4] = [
        ("no padding", &[(0, 64), (0, 64), (1, 64), (1, 64)]),
        ("rows", &[(0, 60), (0, 64), (1, 64), (1, 64)]),
        ("sequences", &[(2, 96), (0, 80), (1, 80)]),
        ("prefix rows", &[(0, 64), (1, 64), (0, 64), (3, 64)]),
    ];
    let mut failures = Vec::new();
    for (name, tails) in variants {
        let run = |d: &mut Decider<CudaBackend>, states: &[instinct_model::prefix::PrefixState]| {
            let segs: Vec<QuestionSegment> = tails
                .iter()
                .map(|&(p, len)| {
                    let at = prefixes[p].1;
                    QuestionSegment::answer(
                        Prompt::text(&text[at..at + len], LETTERS),
                        Some(&states[p]),
                    )
                })
                .collect();
            d.decide_segments(&segs)
                .unwrap()
                .into_iter()
                .map(|a| a.probabilities.unwrap())
                .collect::<Vec<_>>()
        };
        let want = run(&mut launched, &theirs);
        for attempt in ["first", "replayed"] {
            let got = run(&mut captured, &ours);
            let worst = got
                .iter()
                .flatten()
                .zip(want.iter().flatten())
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            eprintln!("{name}, {attempt}: max |dp| {worst:e}");
            if got != want {
                failures.push(format!("{name} ({attempt}): {worst:e}"));
            }
        }
    }
    eprintln!("{:?}", stats(&captured));
    assert!(failures.is_empty(), "{failures:?}");
}
