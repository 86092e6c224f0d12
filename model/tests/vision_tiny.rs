//! The tiny checkpoint's vision-language path (vision tower, multimodal adapter merge, M-RoPE
//! positions, image features scattered into the prompt, letter readout) against transformers'
//! fp32 goldens (`tools/reference/vl_goldens.py`): image features within 1e-4 relative, positions
//! exactly, letter probabilities within 1e-5. The same on the GPU (`cargo test -p instinct-model
//! --test vision_tiny -- --ignored`) within bf16 tolerances: its GEMMs take bf16 operands.

use std::path::PathBuf;
use std::sync::OnceLock;

use instinct_kernels::backend::VisionBackend;
use instinct_kernels::cuda::{CudaBackend, CudaOptions};
use instinct_kernels::patches::{normalization_table, patchify, PatchImage};
use instinct_kernels::CpuBackend;
use instinct_model::checkpoint::Snapshot;
use instinct_model::forward::{BatchLimits, EmbeddingOverride, SequenceInput, TextModel};
use instinct_model::lora::LoraAdapter;
use instinct_model::mrope::{expand_image_placeholders, rope_index};
use instinct_model::readout::LetterReadout;
use instinct_model::values::Values;
use instinct_model::vision::{ImageInput, VisionConfig, VisionTower, VisionWeights};
use serde_json::Value;

/// What a backend's results must hold to against the fp32 goldens.
#[derive(Clone, Copy)]
struct Tolerance {
    /// Image features, relative to the largest value.
    rel: f64,
    /// Final hidden states after the language model, relative to the largest value.
    hidden: f64,
    /// Letter probabilities, absolute.
    prob: f64,
}

const CPU: Tolerance = Tolerance {
    rel: 1e-4,
    hidden: 1e-4,
    prob: 1e-5,
};
/// bf16 GEMM operands (weights and activations) through 2 vision blocks and the language model.
/// On an H200 (9c71f1c) features and hidden states held 3e-2; probabilities were off by 0.0108
/// (base) and 0.0136 (adapter) at the first prompt checked, over the 1e-2 first tried, and later
/// by up to 0.0276 (adapter). Since fc1's GELU runs in cuBLASLt's epilogue (eb2c916, an H100), one
/// fc1 output in ~2,000 rounds to the bf16 neighbour of the separate kernel's, and this random
/// model's language pass carries that to a hidden state 3.84e-2 off (adapter, image_90x150,
/// n = 3): another draw of the same bf16 noise (the real-shape screenshot parity holds, max
/// |Δp| 0.0426 against 0.1536), so hidden states and probabilities get 5e-2, features keep 3e-2.
const GPU: Tolerance = Tolerance {
    rel: 3e-2,
    hidden: 5e-2,
    prob: 5e-2,
};
const MERGE: u32 = 2;

fn tiny_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/tiny")
}

fn goldens() -> &'static Value {
    static G: OnceLock<Value> = OnceLock::new();
    G.get_or_init(|| {
        let text = std::fs::read_to_string(tiny_dir().join("vl_goldens.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    })
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn u32s(v: &Value) -> Vec<u32> {
    floats(v).iter().map(|&x| x as u32).collect()
}

fn grid(v: &Value) -> [u32; 3] {
    u32s(v).try_into().unwrap()
}

/// Every image's resized RGB bytes, the tower's input: the goldens keep the reference's
/// `pixel_values` as one u8 level per value (value = `level_table[level]`), in its patch rows'
/// layout, so each image is unpacked from its rows. Checked on the way: the level table is the
/// kernels' normalization, bit for bit, and packing the bytes again gives the reference's rows.
fn images() -> Vec<Vec<u8>> {
    let g = goldens();
    let table: Vec<f32> = floats(&g["level_table"])
        .iter()
        .map(|&x| x as f32)
        .collect();
    assert_eq!(table, normalization_table(), "the reference's level values");
    let bytes = std::fs::read(tiny_dir().join(g["pixels_file"].as_str().unwrap())).unwrap();
    g["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|im| {
            let start = im["pixel_offset"].as_u64().unwrap() as usize;
            let len =
                (im["pixel_rows"].as_u64().unwrap() * im["pixel_cols"].as_u64().unwrap()) as usize;
            let levels = &bytes[start..start + len];
            let [_, h, w] = grid(&im["grid_thw"]).map(|v| v as usize);
            let rgb = unpack_rows(levels, h, w);
            let rows = patchify(PatchImage::new(&rgb, 16 * w, 16 * h));
            let want: Vec<f32> = levels.iter().map(|&l| table[l as usize]).collect();
            assert!(rows == want, "{}: packed again", im["name"]);
            rgb
        })
        .collect()
}

/// The RGB image (`16·w` x `16·h`) whose patch rows (`levels`, `[h·w, 1536]`, block order, the
/// frame repeated) these are.
fn unpack_rows(levels: &[u8], h: usize, w: usize) -> Vec<u8> {
    let mut rgb = vec![0u8; 256 * h * w * 3];
    for (q, row) in levels.chunks_exact(1536).enumerate() {
        let (block, inner) = (q / 4, q % 4);
        let top = ((block / (w / 2)) * 2 + inner / 2) * 16;
        let left = ((block % (w / 2)) * 2 + inner % 2) * 16;
        for c in 0..3 {
            let frame = &row[c * 512..][..256];
            assert_eq!(frame, &row[c * 512 + 256..][..256], "the frame repeated");
            for (i, &level) in frame.iter().enumerate() {
                rgb[((top + i / 16) * 16 * w + left + i % 16) * 3 + c] = level;
            }
        }
    }
    rgb
}

struct Loaded<B: VisionBackend> {
    tower: VisionTower<B>,
    text: TextModel<B>,
    readout: LetterReadout,
}

fn load<B: VisionBackend>(start: impl Fn() -> B, with_adapter: bool) -> Loaded<B> {
    let snap = Snapshot::open(tiny_dir()).unwrap();
    let cfg = VisionConfig::from_json(snap.config().vision.as_ref().unwrap()).unwrap();
    let mut vision = VisionWeights::load(&snap, &cfg).unwrap();
    let mut text = snap.load_text_weights().unwrap();
    if with_adapter {
        let adapter = LoraAdapter::open(tiny_dir().join("adapter-multimodal")).unwrap();
        let report = adapter.merge_into_text(&mut text).unwrap();
        let merged_vision = vision.merge_lora(&report.vision).unwrap();
        assert_eq!(merged_vision, 6, "2 blocks × fc1/fc2 + merger fc1/fc2");
        assert_eq!(
            report.merged.len() + merged_vision,
            adapter.modules().len(),
            "the text and vision merges together use every adapter module"
        );
        assert_eq!(adapter.modules().len(), 38);
    }
    let letter_ids = u32s(&goldens()["letter_ids"]);
    let readout = LetterReadout::from_embedding(&text.embed_tokens, &letter_ids).unwrap();
    let limits = BatchLimits {
        max_tokens: 2048,
        max_seqs: 4,
    };
    Loaded {
        tower: VisionTower::new(start(), &cfg, &vision).unwrap(),
        text: TextModel::new(start(), &snap.config().text, &text, limits).unwrap(),
        readout,
    }
}

fn max_rel_diff(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f64, |m, w| m.max(w.abs())).max(1e-30);
    got.iter()
        .zip(want)
        .map(|(&g, &w)| (g as f64 - w).abs() / scale)
        .fold(0.0, f64::max)
}

/// The tower's features against transformers', the language model's answers over them (left on
/// the tower's backend, as served) against transformers', and the same answers over the features
/// given from the host, bit for bit.
fn check<B: VisionBackend>(
    start: impl Fn() -> B,
    tol: Tolerance,
    variant: &str,
    with_adapter: bool,
) {
    let g = goldens();
    let image_token = g["image_token_id"].as_u64().unwrap() as u32;
    let mut loaded = load(start, with_adapter);
    let pixels = images();
    let mut worst_feature = 0f64;
    let mut worst_prob = 0f64;
    let mut worst_hidden = 0f64;
    let mut prompts_checked = 0;
    for (im, px) in g["images"].as_array().unwrap().iter().zip(&pixels) {
        let name = im["name"].as_str().unwrap();
        let grid_thw = grid(&im["grid_thw"]);
        let input = ImageInput { rgb: px, grid_thw };
        let feats = loaded.tower.forward(&[input]).unwrap().remove(0);
        let kept = loaded.tower.forward_kept(&[input]).unwrap().remove(0);
        assert_eq!(
            loaded.tower.features_on_host(&kept).unwrap(),
            feats,
            "{name}: the features kept on the backend"
        );
        let on_host = Values::host(feats.clone());
        let rel = max_rel_diff(&feats, &floats(&im[format!("features_{variant}")]));
        assert!(
            rel < tol.rel,
            "{name} {variant}: features differ by {rel} relative"
        );
        worst_feature = worst_feature.max(rel);

        for p in im["prompts"].as_array().unwrap() {
            let ids = u32s(&p["input_ids"]);
            let n = p["n_options"].as_u64().unwrap() as usize;
            let want_pos: Vec<[u32; 3]> = p["positions"]
                .as_array()
                .unwrap()
                .iter()
                .map(grid)
                .collect();
            let positions = rope_index(&ids, image_token, &[grid_thw], MERGE).unwrap();
            assert_eq!(positions, want_pos, "{name}: M-RoPE positions");

            let seq = SequenceInput {
                token_ids: &ids,
                positions: Some(&positions),
            };
            let mut hidden_over = |values| {
                let over = EmbeddingOverride {
                    token_id: image_token,
                    values,
                    first_row: 0,
                };
                loaded
                    .text
                    .forward_last_with_embeddings(&[seq], &[Some(over)])
                    .unwrap()
                    .remove(0)
            };
            let hidden = hidden_over(&kept);
            assert_eq!(
                hidden,
                hidden_over(&on_host),
                "{name} n={n}: features from the host"
            );
            let want = &p[variant];
            let hidden_rel = max_rel_diff(&hidden, &floats(&want["final_hidden"]));
            assert!(
                hidden_rel < tol.hidden,
                "{name} n={n}: hidden off by {hidden_rel}"
            );
            worst_hidden = worst_hidden.max(hidden_rel);
            for (k, key) in [(26, "probs_26"), (3, "probs_3")] {
                let got = loaded.readout.probabilities(&hidden, k).unwrap();
                for (&a, b) in got.iter().zip(floats(&want[key])) {
                    let diff = (a as f64 - b).abs();
                    assert!(diff < tol.prob, "{name} n={n} {key} {variant}: {a} vs {b}");
                    worst_prob = worst_prob.max(diff);
                }
            }
            prompts_checked += 1;
        }
    }
    assert_eq!(prompts_checked, 4);
    // The first image again, after the others: its grid's position table is the kept one now
    // (resampled once per grid), and the features are the same bits as the first time.
    let (first, px) = (&g["images"][0], &pixels[0]);
    let input = ImageInput {
        rgb: px,
        grid_thw: grid(&first["grid_thw"]),
    };
    let once = loaded.tower.forward(&[input]).unwrap().remove(0);
    let again = loaded.tower.forward(&[input]).unwrap().remove(0);
    assert_eq!(once, again, "{variant}: the kept position table");
    let rel = max_rel_diff(&again, &floats(&first[format!("features_{variant}")]));
    assert!(
        rel < tol.rel,
        "{variant}: the first image again, {rel} relative"
    );
    eprintln!(
        "{variant}: worst feature rel diff {worst_feature:.2e}, worst hidden rel diff \
         {worst_hidden:.2e}, worst prob diff {worst_prob:.2e}"
    );
}

fn gpu() -> CudaBackend {
    CudaBackend::new(Default::default()).unwrap_or_else(|e| panic!("CUDA: {e}"))
}

#[test]
fn base_model_matches_transformers() {
    check(CpuBackend::new, CPU, "base", false);
}

#[test]
#[ignore = "needs a GPU"]
fn on_the_gpu_base_model_matches_transformers() {
    check(gpu, GPU, "base", false);
}

#[test]
#[ignore = "needs a GPU"]
fn on_the_gpu_multimodal_adapter_matches_peft() {
    check(gpu, GPU, "adapter", true);
}

/// As served: the tower and the language copy each on a stream of their own (captured passes
/// on), the features handed from one to the other in device memory.
#[test]
#[ignore = "needs a GPU"]
fn on_the_gpu_with_captured_passes_the_multimodal_adapter_matches_peft() {
    let start = || {
        let options = CudaOptions {
            cuda_graphs: true,
            ..Default::default()
        };
        CudaBackend::new(options).unwrap_or_else(|e| panic!("CUDA: {e}"))
    };
    check(start, GPU, "adapter", true);
}

#[test]
fn multimodal_adapter_matches_peft() {
    check(CpuBackend::new, CPU, "adapter", true);
}

/// Several images in one tower pass (their patch rows packed, attention within each frame): each
/// image's features are the bits it gets alone, in any order and with an image repeated; the
/// grids differ, so their position tables are packed side by side. An image whose bytes do not
/// fit its grid, or of several frames, is refused with its index.
fn several_images_in_one_pass<B: VisionBackend>(start: impl Fn() -> B) {
    let g = goldens();
    let loaded = load(start, true);
    let pixels = images();
    let inputs: Vec<ImageInput> = g["images"]
        .as_array()
        .unwrap()
        .iter()
        .zip(&pixels)
        .map(|(im, px)| ImageInput {
            rgb: px,
            grid_thw: grid(&im["grid_thw"]),
        })
        .collect();
    assert!(
        inputs.len() >= 2,
        "the goldens hold {} images",
        inputs.len()
    );
    let alone: Vec<Vec<f32>> = inputs
        .iter()
        .map(|&i| loaded.tower.forward(&[i]).unwrap().remove(0))
        .collect();
    let mut order: Vec<usize> = (0..inputs.len()).rev().collect();
    order.push(0);
    let batch: Vec<ImageInput> = order.iter().map(|&i| inputs[i]).collect();
    let together = loaded.tower.forward(&batch).unwrap();
    let kept = loaded.tower.forward_kept(&batch).unwrap();
    assert_eq!(together.len(), order.len());
    assert_eq!(kept.len(), order.len());
    for (k, &i) in order.iter().enumerate() {
        assert_eq!(together[k], alone[i], "image {i} at place {k} of the pass");
        let kept = loaded.tower.features_on_host(&kept[k]).unwrap();
        assert_eq!(kept, alone[i], "image {i} kept, at place {k} of the pass");
    }
    assert!(loaded.tower.forward_kept(&[]).unwrap().is_empty());
    assert!(loaded.tower.forward(&[]).unwrap().is_empty());
    let short = ImageInput {
        rgb: &pixels[0][1..],
        ..inputs[0]
    };
    let err = loaded.tower.forward(&[inputs[1], short]).unwrap_err();
    assert!(format!("{err:#}").contains("image 1: "), "{err:#}");
    assert!(format!("{err:#}").contains("bytes, grid"), "{err:#}");
    let [_, h, w] = inputs[0].grid_thw;
    let frames = ImageInput {
        grid_thw: [2, h / 2, w],
        ..inputs[0]
    };
    let err = loaded.tower.forward(&[frames]).unwrap_err();
    assert!(format!("{err:#}").contains("2 frames"), "{err:#}");
}

#[test]
fn several_images_in_one_tower_pass_get_the_features_each_gets_alone() {
    several_images_in_one_pass(CpuBackend::new);
}

#[test]
#[ignore = "needs a GPU"]
fn on_the_gpu_several_images_in_one_tower_pass_get_the_features_each_gets_alone() {
    several_images_in_one_pass(gpu);
}

/// The scatter must put the image features at the image tokens, so wrong features move the
/// answer, and a feature count that does not match the image tokens is refused.
#[test]
fn image_features_reach_the_prompt_and_counts_are_checked() {
    let g = goldens();
    let image_token = g["image_token_id"].as_u64().unwrap() as u32;
    let mut loaded = load(CpuBackend::new, false);
    let im = &g["images"][1];
    let p = &im["prompts"][0];
    let ids = u32s(&p["input_ids"]);
    let grid_thw = grid(&im["grid_thw"]);
    let positions = rope_index(&ids, image_token, &[grid_thw], MERGE).unwrap();
    let seq = SequenceInput {
        token_ids: &ids,
        positions: Some(&positions),
    };
    let feats = floats(&im["features_base"]);
    let zeros = vec![0.0f32; feats.len()];
    let hidden = loaded
        .text
        .forward_last_with_embeddings(
            &[seq],
            &[Some(EmbeddingOverride {
                token_id: image_token,
                values: &Values::host(zeros.clone()),
                first_row: 0,
            })],
        )
        .unwrap()
        .remove(0);
    let got = loaded.readout.probabilities(&hidden, 3).unwrap();
    let want = floats(&p["base"]["probs_3"]);
    let moved = got
        .iter()
        .zip(&want)
        .map(|(&a, b)| (a as f64 - b).abs())
        .fold(0.0, f64::max);
    assert!(
        moved > 1e-3,
        "zeroed image features changed nothing ({moved})"
    );

    let short = Values::host(zeros[..zeros.len() - 64].to_vec());
    let err = loaded
        .text
        .forward_last_with_embeddings(
            &[seq],
            &[Some(EmbeddingOverride {
                token_id: image_token,
                values: &short,
                first_row: 0,
            })],
        )
        .unwrap_err();
    assert!(err.to_string().contains("positions hold token"), "{err}");
}

#[test]
fn rope_index_matches_transformers_with_two_images() {
    let g = goldens();
    let image_token = g["image_token_id"].as_u64().unwrap() as u32;
    for case in g["rope_cases"].as_array().unwrap() {
        let ids = u32s(&case["input_ids"]);
        let grids: Vec<[u32; 3]> = case["grids"].as_array().unwrap().iter().map(grid).collect();
        let want: Vec<[u32; 3]> = case["positions"]
            .as_array()
            .unwrap()
            .iter()
            .map(grid)
            .collect();
        assert_eq!(rope_index(&ids, image_token, &grids, MERGE).unwrap(), want);
        // Too few grids, or a grid whose token count does not match its run, is an error.
        assert!(rope_index(&ids, image_token, &grids[..1], MERGE).is_err());
        let wrong = [grids[1], grids[0]];
        assert!(rope_index(&ids, image_token, &wrong, MERGE).is_err());
    }
}

#[test]
fn placeholder_expansion_reproduces_the_processor() {
    let g = goldens();
    let image_token = g["image_token_id"].as_u64().unwrap() as u32;
    for im in g["images"].as_array().unwrap() {
        let grid_thw = grid(&im["grid_thw"]);
        let ids = u32s(&im["prompts"][0]["input_ids"]);
        let mut collapsed = ids.clone();
        collapsed.dedup_by(|a, b| *a == image_token && *b == image_token);
        assert_eq!(collapsed.iter().filter(|&&t| t == image_token).count(), 1);
        let expanded =
            expand_image_placeholders(&collapsed, image_token, &[grid_thw], MERGE).unwrap();
        assert_eq!(expanded, ids);
        assert!(expand_image_placeholders(&collapsed, image_token, &[], MERGE).is_err());
    }
}

#[test]
fn vision_merge_refuses_foreign_or_misshapen_modules() {
    let snap = Snapshot::open(tiny_dir()).unwrap();
    let cfg = VisionConfig::from_json(snap.config().vision.as_ref().unwrap()).unwrap();
    let original = VisionWeights::load(&snap, &cfg).unwrap();
    let adapter = LoraAdapter::open(tiny_dir().join("adapter-multimodal")).unwrap();
    let mut text = snap.load_text_weights().unwrap();
    let report = adapter.merge_into_text(&mut text).unwrap();

    // A text module is not a vision module.
    let mut weights = original.clone();
    let err = weights.merge_lora(adapter.modules()).unwrap_err();
    assert!(err.to_string().contains("not the vision tower"), "{err}");

    // A module whose shape does not fit is refused before anything is merged.
    let mut modules = report.vision.clone();
    let last = modules.len() - 1;
    let rank = modules[last].a.shape[0];
    modules[last].a.shape = vec![rank, 7];
    modules[last].a.data.truncate(rank * 7);
    let err = weights.merge_lora(&modules).unwrap_err();
    assert!(
        err.to_string().contains("needs a base weight of shape"),
        "{err}"
    );
    assert_eq!(weights.blocks[0].fc1.weight, original.blocks[0].fc1.weight);
    assert_eq!(weights.merger_fc2.weight, original.merger_fc2.weight);

    // The real merge changes exactly the adapted Linears.
    weights.merge_lora(&report.vision).unwrap();
    assert_ne!(weights.blocks[1].fc2.weight, original.blocks[1].fc2.weight);
    assert_ne!(weights.merger_fc1.weight, original.merger_fc1.weight);
    assert_eq!(weights.blocks[1].qkv.weight, original.blocks[1].qkv.weight);
}

#[test]
fn vision_config_rejects_unsupported_settings() {
    let snap = Snapshot::open(tiny_dir()).unwrap();
    let raw = snap.config().vision.clone().unwrap();
    let cfg = VisionConfig::from_json(&raw).unwrap();
    assert_eq!(
        (cfg.head_dim(), cfg.patch_dim(), cfg.grid_side()),
        (16, 1536, 8)
    );
    for (key, value) in [
        ("hidden_act", serde_json::json!("gelu")),
        ("deepstack_visual_indexes", serde_json::json!([1])),
        ("num_position_embeddings", serde_json::json!(60)),
        ("num_heads", serde_json::json!(3)),
    ] {
        let mut bad = raw.clone();
        bad[key] = value;
        assert!(VisionConfig::from_json(&bad).is_err(), "{key} accepted");
    }
}

/// A screenshot prompt run as prefix → snapshot → tail answers as the whole prompt, on the CPU
/// (within 1e-5 per probability), with the cut before the image, inside it (the tail's image part
/// then starts at a later feature row: `ImagePrompt::part`) and after it; the M-RoPE positions and
/// feature rows of each part are cut from the whole prompt's.
#[test]
fn a_screenshot_prompt_resumed_inside_or_after_its_image_answers_as_whole() {
    use instinct_model::decider::{Decider, ImagePrompt, Prompt, QuestionSegment};
    let g = goldens();
    let image_token = g["image_token_id"].as_u64().unwrap() as u32;
    let loaded = load(CpuBackend::new, true);
    let im = &g["images"][0];
    let grid_thw = grid(&im["grid_thw"]);
    let features = loaded
        .tower
        .forward(&[ImageInput {
            rgb: &images()[0],
            grid_thw,
        }])
        .unwrap()
        .remove(0);
    let p = &im["prompts"][0];
    let ids = u32s(&p["input_ids"]);
    let n = p["n_options"].as_u64().unwrap() as usize;
    let positions = rope_index(&ids, image_token, &[grid_thw], MERGE).unwrap();
    let image = ImagePrompt::new(image_token, Values::host(features), positions);
    let first = ids.iter().position(|&t| t == image_token).unwrap();
    let last = ids.iter().rposition(|&t| t == image_token).unwrap();
    assert!(last > first + 2, "the image has tokens to cut between");
    let mut decider = Decider::new(loaded.text, loaded.readout);
    fn prompt<'a>(
        ids: &'a [u32],
        range: std::ops::Range<usize>,
        n: usize,
        part: &'a ImagePrompt,
    ) -> Prompt<'a> {
        Prompt {
            ids: &ids[range],
            n_options: n,
            image: Some(part),
        }
    }
    let whole = decider
        .decide(&[prompt(&ids, 0..ids.len(), n, &image)])
        .unwrap();
    for cut in [
        first - 1,
        first + 1,
        (first + last) / 2,
        last + 1,
        ids.len() - 1,
    ] {
        let (head, tail) = (image.part(&ids, 0..cut), image.part(&ids, cut..ids.len()));
        let snapshot = decider
            .decide_segments(&[QuestionSegment {
                prompt: prompt(&ids, 0..cut, n, &head),
                resume: None,
                snapshot: true,
                snapshot_at: None,
                answer: false,
            }])
            .unwrap()
            .remove(0)
            .snapshot
            .unwrap();
        let got = decider
            .decide_segments(&[QuestionSegment::answer(
                prompt(&ids, cut..ids.len(), n, &tail),
                Some(&snapshot),
            )])
            .unwrap()
            .remove(0)
            .probabilities
            .unwrap();
        for (a, b) in got.iter().zip(&whole[0]) {
            assert!(
                (a - b).abs() <= 1e-5,
                "cut at {cut}: {got:?} vs {:?}",
                whole[0]
            );
        }
        // Without its prefix the same tail answers otherwise: a dropped prefix would show.
        let alone = decider
            .decide(&[prompt(&ids, cut..ids.len(), n, &tail)])
            .unwrap()
            .remove(0);
        let moved = alone
            .iter()
            .zip(&whole[0])
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(moved > 1e-4, "cut at {cut}: the prefix made no difference");
    }
}
