//! A seeded synthetic workload shaped like upstream's benchmark mix (System1-Omni format).
//!
//! Four equal slices, as in the upstream native-worker campaigns: short single questions,
//! structured multi-question requests (object state and option records), long single questions
//! and short multi-question requests. Prompts span about 146 to 2,079 tokens and requests carry
//! about 2.25 questions on average. Token counts are estimated from text length plus a fixed
//! template overhead (the calibrated constants of [`super`]), so they are approximate.

use anyhow::{bail, Result};
use bytes::Bytes;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};

use super::{
    approx_tokens, RequestSpec, Workload, ESCAPED_JSON_CHARS_PER_TOKEN, JSON_CHARS_PER_TOKEN,
    OPTION_LINE_TOKENS, PROSE_CHARS_PER_TOKEN, SHORT_LABEL_CHARS_PER_TOKEN, TEMPLATE_TOKENS,
    TREE_CHARS_PER_TOKEN,
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
}

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

/// Generates `config.count` request bodies, the slices in equal shares, shuffled by the seed.
pub fn generate(config: &SyntheticConfig) -> Result<Workload> {
    if config.count == 0 {
        bail!("the synthetic workload needs at least one request");
    }
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
    let mut slices: Vec<Slice> = (0..config.count).map(|i| Slice::ALL[i % 4]).collect();
    slices.shuffle(&mut rng);
    let requests = slices
        .into_iter()
        .map(|slice| build_request(slice, config, &mut rng))
        .collect::<Result<Vec<_>>>()?;
    Ok(Workload {
        description: format!(
            "{} synthetic requests (seed {}, upstream mix{}{}{})",
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
            seed: 78,
            count,
            prompt_tokens: None,
            options: None,
            questions: None,
            goal_less: false,
            model: "cua-s1-4b-0.2".into(),
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
}
