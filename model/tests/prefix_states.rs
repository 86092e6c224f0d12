//! Prefix-state snapshots on the tiny demo model: a prompt run as prefix → snapshot → tail answers
//! as the whole prompt run at once, at every cut the kernels treat specially (the conv window, the
//! delta rule's 64-token chunk grid), in batches mixing resumed and fresh sequences, and chained
//! over several chunks. On the CPU within 1e-5 per probability at every cut; the same tests on the
//! GPU (`cargo test -p instinct-model --test prefix_states -- --ignored`) within 2e-3, the bound
//! the prefix-reuse issue sets for the GPU, at the cuts serving makes there: multiples of the
//! delta rule's 64-token chunk (off them the resumed chunks round differently; the kernel test
//! `cuda_carried` measures by how much).

use instinct_kernels::cuda::CudaBackend;
use instinct_kernels::{Backend, CpuBackend};
use instinct_model::decider::{Decider, Prompt, QuestionSegment};
use instinct_model::forward::BatchLimits;
use instinct_model::prefix::{LayerState, PrefixState, Values};

const LETTERS: usize = 6;
/// Largest |Δp| between a resumed answer and the whole prompt's, on the CPU.
const TOLERANCE: f32 = 1e-5;

/// What a backend's results must hold to.
#[derive(Clone, Copy)]
struct Tolerance {
    /// |Δp| between a resumed answer and the whole prompt's.
    p: f32,
    /// Relative difference (to a layer's largest value) between snapshots of the same tokens
    /// taken along different paths; 0 where they must be the same bits.
    state: f32,
    /// Cuts are multiples of it (serving's resume grid on the backend).
    grid: usize,
}

impl Tolerance {
    fn takes(&self, cut: usize) -> bool {
        cut.is_multiple_of(self.grid)
    }
}

const CPU: Tolerance = Tolerance {
    p: TOLERANCE,
    state: 0.0,
    grid: 1,
};
/// The GPU's GEMMs pick algorithms by row count, so one snapshot taken in batches of different
/// sizes differs in its last bits; serving cuts on the delta rule's chunk grid there.
const GPU: Tolerance = Tolerance {
    p: 2e-3,
    state: 2e-2,
    grid: 64,
};

/// Values read back to the host ([`Fixture::host`]).
fn vals(values: &Values) -> &[f32] {
    values.as_host().expect("a snapshot read back to the host")
}

/// The largest difference between two snapshots' layers (read back to the host), each relative
/// to the layer's largest value (they must hold the same tokens and layers).
fn snapshot_diff(a: &PrefixState, b: &PrefixState) -> f32 {
    assert_eq!(a.tokens(), b.tokens());
    let parts = |l: &LayerState| -> Vec<f32> {
        match l {
            LayerState::DeltaNet { state, conv_window } => {
                [vals(state), vals(conv_window)].concat()
            }
            LayerState::Attention { k, v } => [vals(k), vals(v)].concat(),
        }
    };
    a.layers()
        .iter()
        .zip(b.layers())
        .map(|(x, y)| {
            let (x, y) = (parts(x), parts(y));
            max_diff(&x, &y) / y.iter().fold(1f32, |m, v| m.max(v.abs()))
        })
        .fold(0.0, f32::max)
}

struct Fixture<B: Backend> {
    decider: Decider<B>,
    /// Ids of a long text from the real (tiny) tokenizer.
    text: Vec<u32>,
}

fn fixture() -> Fixture<CpuBackend> {
    fixture_on(CpuBackend::new())
}

/// The CPU padding its passes as a backend that captures them does, its carry arena reserved (as
/// a server with prefix reuse or chunking on does): carried passes then stage their states in the
/// arena, at padded shapes.
fn padded_fixture() -> Fixture<CpuBackend> {
    let mut f = fixture_on(CpuBackend::padding_passes());
    assert!(f.decider.reserve_carry_arena().unwrap() > 0);
    f
}

fn gpu_fixture() -> Fixture<CudaBackend> {
    let gpu = CudaBackend::new(Default::default()).unwrap_or_else(|e| panic!("CUDA: {e}"));
    fixture_on(gpu)
}

fn fixture_on<B: Backend>(backend: B) -> Fixture<B> {
    let loaded = instinct_model::demo::load_text(backend, BatchLimits::new(1024, 8)).unwrap();
    let paragraph = "The agent looks at the screen, reads the question and the options, and picks \
                     the letter of the action that moves the task forward; when two options look \
                     alike it prefers the one that keeps the user's data safe. ";
    let text = loaded.tokenizer.encode(&paragraph.repeat(12)).unwrap();
    assert!(text.len() >= 300, "{} tokens", text.len());
    Fixture {
        decider: loaded.decider,
        text,
    }
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

impl<B: Backend> Fixture<B> {
    fn whole(&mut self, ids: &[u32]) -> Vec<f32> {
        self.decider
            .decide(&[Prompt::text(ids, LETTERS)])
            .unwrap()
            .remove(0)
    }

    fn snapshot(&mut self, ids: &[u32], resume: Option<&PrefixState>) -> PrefixState {
        let mut out = self
            .decider
            .decide_segments(&[QuestionSegment::prefix(ids, resume)])
            .unwrap();
        assert!(out[0].probabilities.is_none(), "a prefix has no answer");
        out.remove(0).snapshot.expect("the snapshot asked for")
    }

    /// `state` read back to the host (it stays on the device it was taken on).
    fn host(&self, state: &PrefixState) -> PrefixState {
        self.decider.snapshot_on_host(state).unwrap()
    }

    fn tail(&mut self, ids: &[u32], resume: &PrefixState) -> Vec<f32> {
        let seg = QuestionSegment::answer(Prompt::text(ids, LETTERS), Some(resume));
        let mut out = self.decider.decide_segments(&[seg]).unwrap();
        assert!(out[0].snapshot.is_none(), "no snapshot was asked for");
        out.remove(0).probabilities.unwrap()
    }
}

#[test]
fn a_tail_resumed_from_its_prefix_answers_as_the_whole_prompt() {
    tail_resumed_from_its_prefix(fixture(), CPU);
}

#[test]
fn padded_a_tail_resumed_from_its_prefix_answers_as_the_whole_prompt() {
    tail_resumed_from_its_prefix(padded_fixture(), CPU);
}

#[test]
#[ignore = "needs a GPU"]
fn on_the_gpu_a_tail_resumed_from_its_prefix_answers_as_the_whole_prompt() {
    tail_resumed_from_its_prefix(gpu_fixture(), GPU);
}

fn tail_resumed_from_its_prefix<B: Backend>(mut f: Fixture<B>, tol: Tolerance) {
    let prompt = f.text[..140].to_vec();
    let whole = f.whole(&prompt);
    let mut worst = 0f32;
    // 1 and 2 are shorter than the conv window (3 rows), 3 fills it; 63/64/65 and 127/128/129
    // straddle the delta rule's chunk grid; 139 leaves a tail of one token.
    for cut in [1, 2, 3, 17, 63, 64, 65, 127, 128, 129, 139] {
        if !tol.takes(cut) {
            continue;
        }
        let snap = f.snapshot(&prompt[..cut], None);
        assert_eq!(snap.tokens(), cut);
        assert_eq!(snap.next_position(), cut as u32);
        let resumed = f.tail(&prompt[cut..], &snap);
        let diff = max_diff(&resumed, &whole);
        assert!(diff <= tol.p, "cut at {cut}: |Δp| {diff}");
        worst = worst.max(diff);
        // The same tail without its prefix answers differently: the test would see a prefix
        // that was ignored.
        let alone = f.whole(&prompt[cut..]);
        assert!(max_diff(&alone, &whole) > 20.0 * TOLERANCE, "cut at {cut}");
    }
    eprintln!("largest |Δp| over the cuts: {worst:e}");
}

#[test]
fn a_question_leaves_a_prefix_snapshot_on_its_way() {
    snapshot_on_the_way(fixture(), CPU);
}

#[test]
fn padded_a_question_leaves_a_prefix_snapshot_on_its_way() {
    snapshot_on_the_way(padded_fixture(), CPU);
}

#[test]
#[ignore = "needs a GPU"]
fn on_the_gpu_a_question_leaves_a_prefix_snapshot_on_its_way() {
    snapshot_on_the_way(gpu_fixture(), GPU);
}

/// A question answered in one pass that also snapshots a prefix of itself (`snapshot_at`): the
/// answer is the whole prompt's, the snapshot the one a pass of the prefix alone leaves (the same
/// bits on the CPU), and a tail resumed from it answers as the whole prompt. Beside it in the pass,
/// a fresh question and a second one snapshotting elsewhere. Cuts the backend does not take, or
/// past the end, or without a snapshot asked for, are refused.
fn snapshot_on_the_way<B: Backend>(mut f: Fixture<B>, tol: Tolerance) {
    let prompt = f.text[..140].to_vec();
    let other = f.text[150..290].to_vec();
    let fresh = f.text[40..90].to_vec();
    let whole = f.whole(&prompt);
    let (other_whole, fresh_whole) = (f.whole(&other), f.whole(&fresh));
    let on_the_way = |ids, at| QuestionSegment {
        snapshot: true,
        snapshot_at: Some(at),
        ..QuestionSegment::answer(Prompt::text(ids, LETTERS), None)
    };
    let other_cut = 128;
    for cut in [1, 3, 63, 64, 65, 128, 139, 140] {
        if !tol.takes(cut) && cut != prompt.len() {
            continue;
        }
        let out = f
            .decider
            .decide_segments(&[
                on_the_way(&prompt, cut),
                QuestionSegment::answer(Prompt::text(&fresh, LETTERS), None),
                on_the_way(&other, other_cut),
            ])
            .unwrap();
        let what = format!("cut at {cut}");
        for (got, want) in [(0, &whole), (1, &fresh_whole), (2, &other_whole)] {
            let diff = max_diff(out[got].probabilities.as_ref().unwrap(), want);
            assert!(diff <= tol.p, "{what}: sequence {got}: |Δp| {diff}");
        }
        assert!(
            out[1].snapshot.is_none(),
            "{what}: none asked of the fresh question"
        );
        let snap = out[0].snapshot.clone().expect("the snapshot asked for");
        assert_eq!((snap.tokens(), snap.next_position()), (cut, cut as u32));
        let alone = f.snapshot(&prompt[..cut], None);
        let diff = snapshot_diff(&f.host(&snap), &f.host(&alone));
        assert!(diff <= tol.state, "{what}: snapshot differs by {diff}");
        let other_snap = out[2].snapshot.clone().unwrap();
        let other_alone = f.snapshot(&other[..other_cut], None);
        assert!(snapshot_diff(&f.host(&other_snap), &f.host(&other_alone)) <= tol.state);
        if cut < prompt.len() {
            let resumed = f.tail(&prompt[cut..], &snap);
            let diff = max_diff(&resumed, &whole);
            assert!(diff <= tol.p, "{what}: resumed tail |Δp| {diff}");
        }
    }
    let refused = |f: &mut Fixture<B>, seg: QuestionSegment<'_>| {
        f.decider.decide_segments(&[seg]).unwrap_err().to_string()
    };
    let err = refused(&mut f, on_the_way(&prompt, prompt.len() + 1));
    assert!(err.contains("141 of 140 tokens"), "{err}");
    let unasked = QuestionSegment {
        snapshot: false,
        ..on_the_way(&prompt, 64)
    };
    let err = refused(&mut f, unasked);
    assert!(err.contains("snapshot asked: false"), "{err}");
    if tol.grid > 1 {
        let err = refused(&mut f, on_the_way(&prompt, tol.grid + 1));
        assert!(err.contains(&format!("multiple of {}", tol.grid)), "{err}");
    }
}

#[test]
fn one_batch_mixes_resumed_fresh_and_snapshotting_sequences() {
    mixed_batch(fixture(), CPU);
}

#[test]
fn padded_one_batch_mixes_resumed_fresh_and_snapshotting_sequences() {
    mixed_batch(padded_fixture(), CPU);
}

#[test]
#[ignore = "needs a GPU"]
fn on_the_gpu_one_batch_mixes_resumed_fresh_and_snapshotting_sequences() {
    mixed_batch(gpu_fixture(), GPU);
}

fn mixed_batch<B: Backend>(mut f: Fixture<B>, tol: Tolerance) {
    let (a, b, c) = (
        f.text[..100].to_vec(),
        f.text[37..120].to_vec(),
        f.text[150..190].to_vec(),
    );
    // b's cut is inside the conv window where the backend resumes anywhere.
    let (cut_a, cut_b) = (64, if tol.takes(2) { 2 } else { 64 });
    // Two prefixes snapshotted and a whole question answered in one pass.
    let first = f
        .decider
        .decide_segments(&[
            QuestionSegment::prefix(&a[..cut_a], None),
            QuestionSegment::answer(Prompt::text(&c, LETTERS), None),
            QuestionSegment::prefix(&b[..cut_b], None),
        ])
        .unwrap();
    let snap_a = first[0].snapshot.clone().unwrap();
    let snap_b = first[2].snapshot.clone().unwrap();
    assert!(first[1].snapshot.is_none());
    // A snapshot does not depend on what shared its pass.
    for (snap, ids) in [(&snap_a, &a[..cut_a]), (&snap_b, &b[..cut_b])] {
        let alone = f.snapshot(ids, None);
        assert!(snapshot_diff(&f.host(snap), &f.host(&alone)) <= tol.state);
    }
    let c_whole = f.whole(&c);
    assert!(max_diff(first[1].probabilities.as_ref().unwrap(), &c_whole) <= tol.p);

    // Tails of both prefixes, a second tail of `a` (one snapshot read twice) and a fresh question.
    let a2 = [&a[..cut_a], &f.text[200..230]].concat();
    let second = f
        .decider
        .decide_segments(&[
            QuestionSegment::answer(Prompt::text(&a[cut_a..], LETTERS), Some(&snap_a)),
            QuestionSegment::answer(Prompt::text(&c, LETTERS), None),
            QuestionSegment::answer(Prompt::text(&b[cut_b..], LETTERS), Some(&snap_b)),
            QuestionSegment::answer(Prompt::text(&a2[cut_a..], LETTERS), Some(&snap_a)),
        ])
        .unwrap();
    let want = [f.whole(&a), c_whole, f.whole(&b), f.whole(&a2)];
    let mut worst = 0f32;
    for (i, (got, want)) in second.iter().zip(&want).enumerate() {
        let diff = max_diff(got.probabilities.as_ref().unwrap(), want);
        assert!(diff <= tol.p, "sequence {i}: |Δp| {diff}");
        worst = worst.max(diff);
    }
    // The two tails of `a` are different questions.
    assert!(max_diff(&want[0], &want[3]) > 20.0 * TOLERANCE);
    eprintln!("largest |Δp| in the mixed batch: {worst:e}");
}

#[test]
fn chained_snapshots_run_a_prompt_in_chunks() {
    chained_snapshots(fixture(), CPU);
}

#[test]
fn padded_chained_snapshots_run_a_prompt_in_chunks() {
    chained_snapshots(padded_fixture(), CPU);
}

#[test]
#[ignore = "needs a GPU"]
fn on_the_gpu_chained_snapshots_run_a_prompt_in_chunks() {
    chained_snapshots(gpu_fixture(), GPU);
}

fn chained_snapshots<B: Backend>(mut f: Fixture<B>, tol: Tolerance) {
    let prompt = f.text[..210].to_vec();
    let whole = f.whole(&prompt);
    let mut worst = 0f32;
    // Chunks off the 64 grid, on it, and a one-token middle.
    for cuts in [[50, 120], [64, 128], [100, 101], [128, 192]] {
        if !cuts.iter().all(|&c| tol.takes(c)) {
            continue;
        }
        let first = f.snapshot(&prompt[..cuts[0]], None);
        let second = f.snapshot(&prompt[cuts[0]..cuts[1]], Some(&first));
        assert_eq!(second.tokens(), cuts[1]);
        assert_eq!(second.next_position(), cuts[1] as u32);
        let diff = max_diff(&f.tail(&prompt[cuts[1]..], &second), &whole);
        assert!(diff <= tol.p, "cuts {cuts:?}: |Δp| {diff}");
        worst = worst.max(diff);
        // The chained snapshot is the one-step snapshot of the same tokens, up to rounding: the
        // keys of the first chunk are carried over as they were.
        let direct = f.snapshot(&prompt[..cuts[1]], None);
        let direct = f.host(&direct);
        let (first, second) = (f.host(&first), f.host(&second));
        for (i, (got, want)) in second.layers().iter().zip(direct.layers()).enumerate() {
            let (got, want) = match (got, want) {
                (LayerState::Attention { k: gk, .. }, LayerState::Attention { k: wk, .. }) => {
                    let own = first_layer_keys(&first, i);
                    let gk = vals(gk);
                    assert_eq!(&gk[..own.len()], own, "layer {i}: prefix keys carried");
                    (gk, vals(wk))
                }
                (
                    LayerState::DeltaNet { state: gs, .. },
                    LayerState::DeltaNet { state: ws, .. },
                ) => (vals(gs), vals(ws)),
                _ => panic!("layer {i}: kinds differ"),
            };
            let scale = want.iter().fold(1f32, |m, x| m.max(x.abs()));
            let bound = 1e-4f32.max(tol.state) * scale;
            assert!(max_diff(got, want) <= bound, "layer {i}");
        }
    }
    eprintln!("largest |Δp| over the chains: {worst:e}");
}

fn first_layer_keys(state: &PrefixState, layer: usize) -> &[f32] {
    match &state.layers()[layer] {
        LayerState::Attention { k, .. } => vals(k),
        LayerState::DeltaNet { .. } => panic!("layer {layer} is not attention"),
    }
}

#[test]
fn a_snapshot_holds_what_its_size_says() {
    let mut f = fixture();
    // Tiny config: 6 DeltaNet layers (4 value heads of 32×32 state; conv window 3 rows of
    // q|k|v = 2·2·32 + 4·32 = 256), 2 attention layers (2 kv heads of 64: k and v, 128 each).
    let (delta, per_token) = (6 * (4 * 32 * 32 + 3 * 256), 2 * 2 * 128);
    let text = f.text.clone();
    for tokens in [1, 5, 70] {
        let snap = f.snapshot(&text[..tokens], None);
        let held: usize = snap
            .layers()
            .iter()
            .map(|l| match l {
                LayerState::DeltaNet { state, conv_window } => state.len() + conv_window.len(),
                LayerState::Attention { k, v } => k.len() + v.len(),
            })
            .sum();
        assert_eq!(snap.size_bytes(), 4 * held);
        assert_eq!(snap.size_bytes(), 4 * (delta + per_token * tokens));
        // What the server reserves for a chunked question's state, before holding one.
        assert_eq!(f.decider.snapshot_cost().bytes(tokens), snap.size_bytes());
    }
}

#[test]
fn a_prefix_shorter_than_the_conv_window_keeps_zeros_before_its_start() {
    let mut f = fixture();
    let first = f.text[..1].to_vec();
    let snap = f.snapshot(&first, None);
    let channels = 256;
    for layer in snap.layers() {
        if let LayerState::DeltaNet { conv_window, .. } = layer {
            // The CPU backend's buffers are host values.
            let conv_window = vals(conv_window);
            // Oldest first: two rows before the prefix, then its one token.
            assert!(conv_window[..2 * channels].iter().all(|&x| x == 0.0));
            assert!(conv_window[2 * channels..].iter().any(|&x| x != 0.0));
        }
    }
}
