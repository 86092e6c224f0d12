//! Captured passes (CUDA graphs) on the tiny demo model: a plain pass padded to its captured shape
//! and replayed answers as the same batch run as launched, bit for bit, for every batch of a
//! shape (the batch-invariance rule makes the padding invisible); passes that carry prefix states
//! still run as launched beside them. On the CPU, the padding alone (`CpuBackend::padding_passes`)
//! against the CPU unpadded; on the GPU (`cargo test -p instinct-model --test captured_passes --
//! --ignored`), a backend with `cuda_graphs` against one without.

use instinct_kernels::cuda::{CudaBackend, CudaOptions, GraphStats};
use instinct_kernels::{Backend, CpuBackend};
use instinct_model::decider::{load_text, Decider, Prompt, QuestionSegment};
use instinct_model::forward::BatchLimits;

const LETTERS: usize = 6;

fn decider<B: Backend>(backend: B) -> (Decider<B>, Vec<u32>) {
    let demo = instinct_model::demo::materialize(&std::env::temp_dir()).unwrap();
    let loaded = load_text(
        backend,
        &demo.model_dir,
        Some(&demo.text_adapter_dir),
        BatchLimits::new(2048, 8),
    )
    .unwrap();
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

fn stats(d: &Decider<CudaBackend>) -> GraphStats {
    d.backend().graph_probe().expect("graphs on").stats()
}

#[test]
#[ignore = "needs a GPU"]
fn on_the_gpu_replayed_passes_answer_as_launched_bit_for_bit() {
    let (mut launched, text) = decider(gpu(false));
    let (mut captured, _) = decider(gpu(true));
    assert!(launched.backend().graph_probe().is_none());
    launched.warm_shapes().unwrap();
    // The warm-up sizes every scratch and captures its one-sequence shapes.
    captured.warm_shapes().unwrap();
    let warmed = stats(&captured);
    assert!(!warmed.held.is_empty(), "{warmed:?}");
    let replays = |s: &GraphStats| s.replays.iter().map(|r| r.1).sum::<u64>();
    for (i, lens) in BATCHES.iter().enumerate() {
        let rows: usize = lens.iter().sum();
        let shape = captured.backend().pass_shape(rows, lens.len()).unwrap();
        let before = stats(&captured);
        let replay = before.held.contains(&shape);
        let want = answers(&mut launched, &text, lens);
        let got = answers(&mut captured, &text, lens);
        assert_eq!(
            got, want,
            "batch {i} {lens:?} at {shape:?} (replay: {replay})"
        );
        let after = stats(&captured);
        if replay {
            assert_eq!(replays(&after), replays(&before) + 1, "batch {i} replays");
        } else {
            assert_eq!(after.captures, before.captures + 1, "batch {i} is captured");
            assert!(after.held.contains(&shape), "batch {i}: {after:?}");
        }
    }
    let s = stats(&captured);
    eprintln!("{s:?}");
    assert_eq!(s.failed, 0, "{:?}", s.last_failure);
    // Nothing went stale after the warm-up: every capture is held, none was redone.
    assert_eq!(s.captures as usize, s.held.len());
    assert!(replays(&s) >= 4, "{s:?}");
}

#[test]
#[ignore = "needs a GPU"]
fn on_the_gpu_carried_passes_run_beside_captured_ones() {
    let (mut launched, text) = decider(gpu(false));
    let (mut captured, _) = decider(gpu(true));
    captured.warm_shapes().unwrap();
    let (prefix, tail) = (&text[..128], &text[128..300]);
    // Captured, then a carried pass (a snapshot, then a tail resumed from it) in between, then
    // the captured shape again.
    let first = answers(&mut captured, &text, &[300]);
    let mut out = captured
        .decide_segments(&[QuestionSegment::prefix(prefix, None)])
        .unwrap();
    let state = out.remove(0).snapshot.unwrap();
    let tail = QuestionSegment::answer(Prompt::text(tail, LETTERS), Some(&state));
    let resumed = captured.decide_segments(&[tail]).unwrap().remove(0);
    let again = answers(&mut captured, &text, &[300]);
    let want = answers(&mut launched, &text, &[300]);
    assert_eq!(first, want);
    assert_eq!(again, want);
    let p = resumed.probabilities.unwrap();
    let diff = p
        .iter()
        .zip(&want[0])
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(diff <= 2e-3, "resumed tail vs whole: {diff}");
    let s = stats(&captured);
    assert_eq!(s.failed, 0, "{:?}", s.last_failure);
    // Both plain passes replayed the warm-up's capture: the carried ones between left it valid.
    assert!(s.replays.iter().map(|r| r.1).sum::<u64>() >= 2, "{s:?}");
}
