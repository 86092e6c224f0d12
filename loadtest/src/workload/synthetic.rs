//! A seeded synthetic workload shaped like upstream's benchmark mix (System1-Omni format).
//!
//! Four equal slices, as in the upstream native-worker campaigns: short single questions,
//! structured multi-question requests (object state and option records), long single questions
//! and short multi-question requests. Prompts span about 146 to 2,079 tokens and requests carry
//! about 2.25 questions on average. Token counts are estimated from text length plus a fixed
//! template overhead (the calibrated constants of [`super`]), so they are approximate.
//!
//! A fraction of the requests can be screenshot requests instead (System1-Omni's multimodal
//! form): each carries its own seeded PNG, as agents send a new screenshot every step, and 1 to 8
//! closed-candidate questions about it.

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use serde_json::{json, Map, Value};

use super::screenshot::{self, QuestionRange, ScreenshotSize};
use super::{
    approx_tokens, RequestKind, RequestSpec, Workload, DEFAULT_MODEL, ESCAPED_JSON_CHARS_PER_TOKEN,
    JSON_CHARS_PER_TOKEN, OPTION_LINE_TOKENS, PROSE_CHARS_PER_TOKEN, SCREENSHOT_TEMPLATE_TOKENS,
    SHORT_LABEL_CHARS_PER_TOKEN, TEMPLATE_TOKENS, TREE_CHARS_PER_TOKEN,
};

/// Knobs of the synthetic generator; `None` keeps the slice's own distribution.
#[derive(Debug, Clone)]
pub struct SyntheticConfig {
    pub seed: u64,
    /// Distinct bodies to generate (cycled during the run).
    pub count: usize,
    /// Fixed prompt length per question, in approximate tokens.
    pub prompt_tokens: Option<usize>,
    /// Fixed number of options per question (1 to 26).
    pub options: Option<usize>,
    /// Fixed number of questions per request (1 to 64).
    pub questions: Option<usize>,
    /// Leave every question's `instructions` out (null), as agents do when they ask several
    /// questions over one state: the questions then share everything up to their options.
    pub goal_less: bool,
    pub model: String,
    /// The screenshot requests of the mix.
    pub screenshots: ScreenshotMix,
}

impl Default for SyntheticConfig {
    fn default() -> Self {
        Self {
            seed: 78,
            count: 64,
            prompt_tokens: None,
            options: None,
            questions: None,
            goal_less: false,
            model: DEFAULT_MODEL.into(),
            screenshots: ScreenshotMix::default(),
        }
    }
}

/// Which share of the synthetic requests are screenshot requests, and their shape.
#[derive(Debug, Clone, Default)]
pub struct ScreenshotMix {
    /// 0 to 1: the share of the bodies that are screenshot requests (rounded; at least one of
    /// each kind when strictly between 0 and 1).
    pub fraction: f64,
    pub size: ScreenshotSize,
    /// Questions per screenshot request (drawn uniformly in the range).
    pub questions: QuestionRange,
}

impl ScreenshotMix {
    /// How many of `count` bodies are screenshot requests.
    pub fn count_of(&self, count: usize) -> usize {
        let n = (self.fraction * count as f64).round() as usize;
        if self.fraction > 0.0 && self.fraction < 1.0 && count >= 2 {
            n.clamp(1, count - 1)
        } else {
            n.min(count)
        }
    }
}

/// Options per screenshot question when `--options` does not fix them.
const SCREENSHOT_OPTIONS: (usize, usize) = (2, 8);

/// The four slices of the upstream mix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slice {
    ShortSingle,
    StructuredMulti,
    LongSingle,
    ShortMulti,
}

impl Slice {
    const ALL: [Slice; 4] = [
        Slice::ShortSingle,
        Slice::StructuredMulti,
        Slice::LongSingle,
        Slice::ShortMulti,
    ];

    fn name(self) -> &'static str {
        match self {
            Slice::ShortSingle => "short_single",
            Slice::StructuredMulti => "structured_multi",
            Slice::LongSingle => "long_single",
            Slice::ShortMulti => "short_multi",
        }
    }

    /// Prompt tokens per question (inclusive range).
    fn prompt_tokens(self) -> (usize, usize) {
        match self {
            Slice::ShortSingle | Slice::ShortMulti => (146, 400),
            Slice::StructuredMulti => (300, 900),
            Slice::LongSingle => (1200, 2079),
        }
    }

    /// Questions per request (inclusive). Means 1, 3, 1, 4: 2.25 over the four slices.
    fn questions(self) -> (usize, usize) {
        match self {
            Slice::ShortSingle | Slice::LongSingle => (1, 1),
            Slice::StructuredMulti => (2, 4),
            Slice::ShortMulti => (3, 5),
        }
    }

    fn options(self) -> (usize, usize) {
        match self {
            Slice::ShortSingle | Slice::ShortMulti => (2, 5),
            Slice::StructuredMulti => (3, 8),
            Slice::LongSingle => (8, 26),
        }
    }
}

const ROLES: &[&str] = &[
    "Button", "Link", "TextBox", "CheckBox", "ComboBox", "MenuItem", "Tab", "ListItem",
];
const WORDS: &[&str] = &[
    "Save", "Cancel", "Open", "File", "Edit", "View", "Search", "Submit", "Next", "Back",
    "Settings", "Username", "Password", "Email", "Delete", "Confirm", "Insert", "Format", "Help",
    "Home", "Profile", "Filter", "Sort", "Export", "Share", "Print", "Close", "Accept", "Terms",
    "Page", "Results", "Account", "Sign in", "Continue", "Details", "Address", "Invoice", "Report",
];
const GOALS: &[&str] = &[
    "Sign in with the saved account and open the dashboard.",
    "Filter the results to show only items from the last week.",
    "Accept the terms and continue to the next page.",
    "Fill the shipping address form and submit it.",
    "Export the current report as a spreadsheet.",
    "Delete the selected file and confirm the dialog.",
];

/// What one body of the mix is.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Text(Slice),
    Screenshot,
}

/// Generates `config.count` request bodies, the text slices in equal shares and the screenshot
/// requests in their fraction, shuffled by the seed. Screenshots are drawn in parallel.
pub fn generate(config: &SyntheticConfig) -> Result<Workload> {
    if config.count == 0 {
        bail!("the synthetic workload needs at least one request");
    }
    let shots = &config.screenshots;
    if !(0.0..=1.0).contains(&shots.fraction) {
        bail!(
            "the screenshot fraction must be 0 to 1, got {}",
            shots.fraction
        );
    }
    shots.size.check()?;
    shots.questions.check()?;
    if let Some(n) = config.options {
        if !(1..=26).contains(&n) {
            bail!("options per question must be 1 to 26, got {n}");
        }
    }
    if let Some(n) = config.questions {
        if !(1..=64).contains(&n) {
            bail!("questions per request must be 1 to 64, got {n}");
        }
    }
    if let Some(n) = config.prompt_tokens {
        if !(TEMPLATE_TOKENS + 20..=16_000).contains(&n) {
            bail!(
                "fixed prompt length must be {} to 16000 tokens, got {n}",
                TEMPLATE_TOKENS + 20
            );
        }
    }
    let mut rng = StdRng::seed_from_u64(config.seed);
    // Without screenshots this draws exactly what the text-only generator drew.
    let n_shots = shots.count_of(config.count);
    let mut kinds: Vec<Kind> = (0..config.count - n_shots)
        .map(|i| Kind::Text(Slice::ALL[i % 4]))
        .chain(std::iter::repeat_n(Kind::Screenshot, n_shots))
        .collect();
    kinds.shuffle(&mut rng);
    // Every draw from `rng` happens here, in order; the pixels come from per-image seeds.
    let drafts = kinds
        .into_iter()
        .map(|kind| match kind {
            Kind::Text(slice) => build_request(slice, config, &mut rng).map(Draft::Ready),
            Kind::Screenshot => Ok(Draft::Screenshot(draw_screenshot(config, &mut rng))),
        })
        .collect::<Result<Vec<_>>>()?;
    let requests = drafts
        .into_par_iter()
        .map(|draft| match draft {
            Draft::Ready(spec) => Ok(spec),
            Draft::Screenshot(draft) => draft.finish(config),
        })
        .collect::<Result<Vec<_>>>()?;
    let shot_text = if n_shots == 0 {
        String::new()
    } else {
        format!(
            ", {n_shots} screenshot requests ({}, {} questions/request)",
            shots.size, shots.questions
        )
    };
    Ok(Workload {
        description: format!(
            "{} synthetic requests (seed {}, upstream mix{}{}{}{shot_text})",
            config.count,
            config.seed,
            config
                .prompt_tokens
                .map_or(String::new(), |n| format!(", {n} tokens/question")),
            config
                .options
                .map_or(String::new(), |n| format!(", {n} options")),
            config
                .questions
                .map_or(String::new(), |n| format!(", {n} questions/request")),
        ),
        requests,
    })
}

/// A body before its screenshot (if any) is drawn.
enum Draft {
    Ready(RequestSpec),
    Screenshot(ScreenshotDraft),
}

/// A screenshot request with everything but the image: its questions and the image's seed.
struct ScreenshotDraft {
    image_seed: u64,
    questions: Map<String, Value>,
    /// Text tokens over all questions (the image's are added once its size is known).
    text_tokens: usize,
}

fn draw_screenshot(config: &SyntheticConfig, rng: &mut StdRng) -> ScreenshotDraft {
    let range = config.screenshots.questions;
    let count = rng.gen_range(range.min..=range.max);
    let (omin, omax) = SCREENSHOT_OPTIONS;
    let mut questions = Map::new();
    let mut text_tokens = 0;
    for q in 0..count {
        let options = config.options.unwrap_or_else(|| rng.gen_range(omin..=omax));
        let goal = pick(rng, GOALS);
        let mut criteria = Map::new();
        let mut tokens = SCREENSHOT_TEMPLATE_TOKENS + options * OPTION_LINE_TOKENS;
        for o in 0..options {
            let text = label(rng);
            tokens += approx_tokens(text.len(), SHORT_LABEL_CHARS_PER_TOKEN);
            criteria.insert(format!("opt_{o}"), Value::String(text));
        }
        let instructions = if config.goal_less {
            Value::Null
        } else {
            tokens += approx_tokens(goal.len(), PROSE_CHARS_PER_TOKEN);
            Value::String(goal.to_string())
        };
        text_tokens += tokens;
        questions.insert(
            format!("q{q}"),
            json!({"type": "choice", "instructions": instructions, "criteria": criteria}),
        );
    }
    ScreenshotDraft {
        image_seed: rng.gen(),
        questions,
        text_tokens,
    }
}

impl ScreenshotDraft {
    fn finish(self, config: &SyntheticConfig) -> Result<RequestSpec> {
        let size = config.screenshots.size;
        let png = screenshot::render_png(size, self.image_seed)?;
        let questions = self.questions.len();
        // Only `model`, `state` and `questions`: the screenshot contract refuses anything else.
        let body = json!({
            "model": config.model,
            "state": {"image": screenshot::data_url(&png)},
            "questions": self.questions,
        });
        let body = serde_json::to_vec(&body).context("serializing a screenshot request")?;
        if body.len() > screenshot::MAX_BODY_BYTES {
            bail!(
                "a {size} screenshot request is {} bytes, over the server's {} byte screenshot body limit",
                body.len(),
                screenshot::MAX_BODY_BYTES
            );
        }
        Ok(RequestSpec {
            body: Bytes::from(body),
            questions,
            // Every question's prompt holds the image.
            approx_prompt_tokens: self.text_tokens + questions * size.image_tokens(),
            label: RequestKind::Screenshot.name().to_string(),
            kind: RequestKind::Screenshot,
        })
    }
}

fn pick<'a>(rng: &mut StdRng, items: &[&'a str]) -> &'a str {
    items[rng.gen_range(0..items.len())]
}

fn label(rng: &mut StdRng) -> String {
    format!("{} {}", pick(rng, WORDS), rng.gen_range(1..100))
}

fn build_request(slice: Slice, config: &SyntheticConfig, rng: &mut StdRng) -> Result<RequestSpec> {
    let (qmin, qmax) = slice.questions();
    let questions = config
        .questions
        .unwrap_or_else(|| rng.gen_range(qmin..=qmax));
    let (omin, omax) = slice.options();
    let options = config.options.unwrap_or_else(|| rng.gen_range(omin..=omax));
    let (tmin, tmax) = slice.prompt_tokens();
    let target = config
        .prompt_tokens
        .unwrap_or_else(|| rng.gen_range(tmin..=tmax));

    // Questions share the state; each has its own goal and options. The state is sized so that
    // template + goal + options + state lands on the target.
    let mut named = Map::new();
    let mut question_tokens = Vec::with_capacity(questions);
    for q in 0..questions {
        let goal = pick(rng, GOALS).to_string();
        let instructions = if config.goal_less {
            Value::Null
        } else {
            Value::String(goal.clone())
        };
        let mut criteria = Map::new();
        let mut label_tokens = 0;
        for o in 0..options {
            let text = label(rng);
            let value = if slice == Slice::StructuredMulti {
                let value = json!({"role": pick(rng, ROLES), "label": text});
                // Rendered as JSON, then escaped into the option line (each quote gains a `\`).
                let rendered = value.to_string();
                let escaped_len = rendered.len() + rendered.matches('"').count();
                label_tokens += approx_tokens(escaped_len, ESCAPED_JSON_CHARS_PER_TOKEN);
                value
            } else {
                label_tokens += approx_tokens(text.len(), SHORT_LABEL_CHARS_PER_TOKEN);
                Value::String(text)
            };
            criteria.insert(format!("opt_{o}"), value);
        }
        let goal_tokens = if config.goal_less {
            0
        } else {
            approx_tokens(goal.len(), PROSE_CHARS_PER_TOKEN)
        };
        let tokens = TEMPLATE_TOKENS + goal_tokens + label_tokens + options * OPTION_LINE_TOKENS;
        question_tokens.push(tokens);
        named.insert(
            format!("q{q}"),
            json!({"type": "choice", "instructions": instructions, "criteria": criteria}),
        );
    }
    let fixed = question_tokens.iter().copied().max().unwrap_or(0);
    let state_budget = target.saturating_sub(fixed).max(10);
    let state = if slice == Slice::StructuredMulti {
        structured_state(rng, state_budget)
    } else {
        Value::String(tree_text(rng, state_budget))
    };
    let state_tokens = match &state {
        Value::String(s) => approx_tokens(s.len(), TREE_CHARS_PER_TOKEN),
        other => approx_tokens(serde_json::to_string(other)?.len(), JSON_CHARS_PER_TOKEN),
    };
    let body = json!({"model": config.model, "state": state, "questions": named});
    let prompt_tokens: usize = question_tokens.iter().map(|t| t + state_tokens).sum();
    Ok(RequestSpec {
        body: Bytes::from(serde_json::to_vec(&body)?),
        questions,
        approx_prompt_tokens: prompt_tokens,
        label: slice.name().to_string(),
        kind: RequestKind::Text,
    })
}

/// An accessibility tree in the fixtures' line format, about `tokens` tokens long.
fn tree_text(rng: &mut StdRng, tokens: usize) -> String {
    let target_chars = (tokens as f64 * TREE_CHARS_PER_TOKEN) as usize;
    let mut out = String::with_capacity(target_chars + 64);
    while out.len() < target_chars {
        let x = rng.gen_range(0..1800);
        let y = rng.gen_range(0..1000);
        let line = format!(
            "- {} \"{}\" @ [{x}, {y}, {}, {}]\n",
            pick(rng, ROLES),
            label(rng),
            x + rng.gen_range(20..200),
            y + rng.gen_range(15..40)
        );
        out.push_str(&line);
    }
    out.truncate(target_chars.max(1));
    out
}

/// An object state (window title and element records) of about `tokens` tokens when rendered.
fn structured_state(rng: &mut StdRng, tokens: usize) -> Value {
    let target_chars = (tokens as f64 * JSON_CHARS_PER_TOKEN) as usize;
    let mut elements = Vec::new();
    let mut chars = 40;
    while chars < target_chars {
        let element = json!({
            "role": pick(rng, ROLES),
            "name": label(rng),
            "bounds": [rng.gen_range(0..1800), rng.gen_range(0..1000), 60, 20],
        });
        chars += element.to_string().len() + 2;
        elements.push(element);
    }
    json!({"window": format!("{} - App", pick(rng, WORDS)), "elements": elements})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(count: usize) -> SyntheticConfig {
        SyntheticConfig {
            count,
            ..SyntheticConfig::default()
        }
    }

    #[test]
    fn mix_matches_the_upstream_shape() {
        let w = generate(&config(400)).unwrap();
        let mean_q = w.mean_questions();
        assert!((2.0..=2.5).contains(&mean_q), "mean questions {mean_q}");
        let (min, max) = w.prompt_token_range();
        assert!((130..=260).contains(&min), "min tokens {min}");
        assert!((1700..=2200).contains(&max), "max tokens {max}");
        for slice in Slice::ALL {
            let n = w
                .requests
                .iter()
                .filter(|r| r.label == slice.name())
                .count();
            assert_eq!(n, 100, "{}", slice.name());
        }
        for r in &w.requests {
            let body: Value = serde_json::from_slice(&r.body).unwrap();
            let qs = body["questions"].as_object().unwrap();
            assert_eq!(qs.len(), r.questions);
            for q in qs.values() {
                let n = q["criteria"].as_object().unwrap().len();
                assert!((1..=26).contains(&n));
            }
        }
    }

    #[test]
    fn same_seed_same_bodies_other_seed_other_bodies() {
        let a = generate(&config(16)).unwrap();
        let b = generate(&config(16)).unwrap();
        assert!(a
            .requests
            .iter()
            .zip(&b.requests)
            .all(|(x, y)| x.body == y.body));
        let c = generate(&SyntheticConfig {
            seed: 79,
            ..config(16)
        })
        .unwrap();
        assert!(a
            .requests
            .iter()
            .zip(&c.requests)
            .any(|(x, y)| x.body != y.body));
    }

    #[test]
    fn fixed_knobs_are_honoured() {
        let w = generate(&SyntheticConfig {
            prompt_tokens: Some(1000),
            options: Some(26),
            questions: Some(3),
            ..config(8)
        })
        .unwrap();
        for r in &w.requests {
            assert_eq!(r.questions, 3);
            let per_q = r.approx_prompt_tokens / 3;
            assert!((950..=1100).contains(&per_q), "{per_q}");
            let body: Value = serde_json::from_slice(&r.body).unwrap();
            for q in body["questions"].as_object().unwrap().values() {
                assert_eq!(q["criteria"].as_object().unwrap().len(), 26);
            }
        }
        assert!(generate(&SyntheticConfig {
            options: Some(27),
            ..config(1)
        })
        .is_err());
        assert!(generate(&config(0)).is_err());
    }

    #[test]
    fn goal_less_questions_have_null_instructions_and_keep_their_size() {
        let w = generate(&SyntheticConfig {
            prompt_tokens: Some(2000),
            questions: Some(8),
            goal_less: true,
            ..config(4)
        })
        .unwrap();
        for r in &w.requests {
            let per_q = r.approx_prompt_tokens / 8;
            assert!((1900..=2200).contains(&per_q), "{per_q}");
            let body: Value = serde_json::from_slice(&r.body).unwrap();
            for q in body["questions"].as_object().unwrap().values() {
                assert!(q["instructions"].is_null(), "{q}");
            }
        }
    }

    /// FNV-1a over every body, label and token estimate.
    fn digest(w: &Workload) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for r in &w.requests {
            let tokens = r.approx_prompt_tokens.to_le_bytes();
            for b in r.body.iter().chain(r.label.as_bytes()).chain(&tokens) {
                h ^= u64::from(*b);
                h = h.wrapping_mul(0x100_0000_01b3);
            }
        }
        h
    }

    #[test]
    fn without_screenshots_the_text_mix_is_unchanged() {
        // Digests of the generator's output before screenshots existed: runs stay comparable.
        assert_eq!(
            digest(&generate(&config(64)).unwrap()),
            0x309b_ddd0_92f2_5dac
        );
        let fixed = SyntheticConfig {
            goal_less: true,
            questions: Some(3),
            prompt_tokens: Some(500),
            ..config(64)
        };
        assert_eq!(digest(&generate(&fixed).unwrap()), 0xbd13_7a00_44fc_a4d0);
    }

    fn with_shots(count: usize, fraction: f64, size: &str, questions: &str) -> SyntheticConfig {
        SyntheticConfig {
            screenshots: ScreenshotMix {
                fraction,
                size: size.parse().unwrap(),
                questions: questions.parse().unwrap(),
            },
            ..config(count)
        }
    }

    fn shots(w: &Workload) -> usize {
        w.requests
            .iter()
            .filter(|r| r.kind == RequestKind::Screenshot)
            .count()
    }

    #[test]
    fn the_screenshot_fraction_is_respected() {
        for (count, fraction, expected) in [
            (64, 0.5, 32),
            (64, 0.25, 16),
            (10, 0.33, 3),
            (64, 0.001, 1),
            (64, 0.999, 63),
            (8, 1.0, 8),
            (8, 0.0, 0),
            (1, 0.5, 1),
        ] {
            let w = generate(&with_shots(count, fraction, "64x48", "1")).unwrap();
            assert_eq!(shots(&w), expected, "{count} × {fraction}");
            assert_eq!(w.requests.len(), count);
        }
        // The text requests keep the four slices in equal shares, and the kinds are mixed
        // through the order (a cycled run sends the fraction whatever its length).
        let w = generate(&with_shots(64, 0.5, "64x48", "1")).unwrap();
        for slice in Slice::ALL {
            let n = w
                .requests
                .iter()
                .filter(|r| r.label == slice.name())
                .count();
            assert_eq!(n, 8, "{}", slice.name());
        }
        let first_half = w.requests[..32]
            .iter()
            .filter(|r| r.kind == RequestKind::Screenshot)
            .count();
        assert!((8..=24).contains(&first_half), "{first_half}");
        let sent: Vec<_> = (0..640).map(|i| w.get(i).kind).collect();
        let n = sent
            .iter()
            .filter(|k| **k == RequestKind::Screenshot)
            .count();
        assert_eq!(n, 320);
    }

    #[test]
    fn screenshot_requests_follow_the_contract() {
        use base64::Engine as _;
        let w = generate(&with_shots(24, 0.5, "320x240", "1-8")).unwrap();
        let mut images = std::collections::HashSet::new();
        let mut question_counts = std::collections::BTreeSet::new();
        for r in w
            .requests
            .iter()
            .filter(|r| r.kind == RequestKind::Screenshot)
        {
            assert_eq!(r.label, "screenshot");
            // The server's strict parser takes it.
            instinct_model::pyjson::parse(&r.body).unwrap();
            let body: Value = serde_json::from_slice(&r.body).unwrap();
            let top: Vec<&String> = body.as_object().unwrap().keys().collect();
            assert_eq!(top, ["model", "state", "questions"]);
            assert_eq!(body["model"], "cua-s1-4b-0.2");
            let state = body["state"].as_object().unwrap();
            assert_eq!(state.len(), 1);
            let url = state["image"].as_str().unwrap();
            let payload = url.strip_prefix("data:image/png;base64,").unwrap();
            let png = base64::engine::general_purpose::STANDARD
                .decode(payload)
                .unwrap();
            let decoded =
                image::load_from_memory_with_format(&png, image::ImageFormat::Png).unwrap();
            assert_eq!((decoded.width(), decoded.height()), (320, 240));
            assert!(
                images.insert(png),
                "every screenshot request has its own image"
            );

            let questions = body["questions"].as_object().unwrap();
            assert_eq!(questions.len(), r.questions);
            assert!((1..=8).contains(&questions.len()));
            question_counts.insert(questions.len());
            let mut text_tokens = 0;
            for (name, q) in questions {
                assert!((1..=256).contains(&name.chars().count()));
                let fields: Vec<&String> = q.as_object().unwrap().keys().collect();
                assert_eq!(fields, ["type", "instructions", "criteria"]);
                assert_eq!(q["type"], "choice");
                let goal = q["instructions"].as_str().unwrap();
                let criteria = q["criteria"].as_object().unwrap();
                assert!((2..=8).contains(&criteria.len()));
                let labels: Vec<&str> = criteria.values().map(|v| v.as_str().unwrap()).collect();
                // The text the prompt gets, beside the image's tokens.
                let user = instinct_model::prompt::omni_screenshot_user_text(goal, &labels);
                assert!(user.contains(instinct_model::prompt::SCREENSHOT_LINE));
                text_tokens += SCREENSHOT_TEMPLATE_TOKENS
                    + approx_tokens(goal.len(), PROSE_CHARS_PER_TOKEN)
                    + labels
                        .iter()
                        .map(|l| {
                            approx_tokens(l.len(), SHORT_LABEL_CHARS_PER_TOKEN) + OPTION_LINE_TOKENS
                        })
                        .sum::<usize>();
            }
            // 320×240 resizes to 320×256: 80 image tokens in every question's prompt.
            assert_eq!(r.approx_prompt_tokens, text_tokens + 80 * r.questions);
        }
        assert_eq!(images.len(), 12);
        assert!(question_counts.len() > 2, "{question_counts:?}");
    }

    #[test]
    fn screenshots_are_deterministic_for_a_seed() {
        let a = generate(&with_shots(8, 0.5, "128x96", "1-3")).unwrap();
        let b = generate(&with_shots(8, 0.5, "128x96", "1-3")).unwrap();
        assert_eq!(digest(&a), digest(&b));
        let c = generate(&SyntheticConfig {
            seed: 79,
            ..with_shots(8, 0.5, "128x96", "1-3")
        })
        .unwrap();
        assert_ne!(digest(&a), digest(&c));
        assert!(a
            .description
            .contains("4 screenshot requests (128x96, 1-3 questions/request)"));
    }

    #[test]
    fn screenshot_settings_are_checked() {
        for fraction in [-0.1, 1.5, f64::NAN] {
            let err = generate(&SyntheticConfig {
                screenshots: ScreenshotMix {
                    fraction,
                    ..Default::default()
                },
                ..config(4)
            })
            .unwrap_err();
            assert!(err.to_string().contains("0 to 1"), "{err}");
        }
        let too_big = SyntheticConfig {
            screenshots: ScreenshotMix {
                fraction: 0.5,
                size: ScreenshotSize {
                    width: 2048,
                    height: 2048,
                },
                ..Default::default()
            },
            ..config(4)
        };
        assert!(generate(&too_big).is_err());
        let too_many = SyntheticConfig {
            screenshots: ScreenshotMix {
                fraction: 0.5,
                questions: QuestionRange { min: 1, max: 9 },
                ..Default::default()
            },
            ..config(4)
        };
        assert!(generate(&too_many).is_err());
    }
}
