//! Workloads: the request bodies the load generator cycles through.
//!
//! A workload is a list of ready-made JSON bodies; request number `i` of a run sends body
//! `i % len`. Bodies are built once, before the run, so generation never delays a send.

pub mod fixtures;
pub mod screenshot;
pub mod synthetic;

use bytes::Bytes;

/// The model name every request carries (the server rejects anything else with 422).
pub const DEFAULT_MODEL: &str = "cua-s1-4b-0.2";

/// What a request carries as its state; the report splits its results by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RequestKind {
    /// Accessibility-tree (text) state.
    Text,
    /// A screenshot (`state = {"image": data URL}`).
    Screenshot,
}

impl RequestKind {
    pub fn name(self) -> &'static str {
        match self {
            RequestKind::Text => "text",
            RequestKind::Screenshot => "screenshot",
        }
    }
}

/// One request body and what is known about it before sending.
#[derive(Debug, Clone)]
pub struct RequestSpec {
    /// The serialized `POST /v1/systemone` body.
    pub body: Bytes,
    /// Number of questions (= decisions the server must make).
    pub questions: usize,
    /// Prompt tokens over all questions: exact for fixtures (their token ids), estimated from
    /// text length for synthetic requests.
    pub approx_prompt_tokens: usize,
    /// Where the body came from: a fixture id or a synthetic slice name (`screenshot` for
    /// screenshot requests).
    pub label: String,
    pub kind: RequestKind,
}

/// The bodies of one run plus a short description for the report.
#[derive(Debug, Clone)]
pub struct Workload {
    pub description: String,
    pub requests: Vec<RequestSpec>,
}

impl Workload {
    /// The body for request number `i` (cycling).
    pub fn get(&self, i: u64) -> &RequestSpec {
        &self.requests[(i % self.requests.len() as u64) as usize]
    }

    /// Mean questions per request over the distinct bodies.
    pub fn mean_questions(&self) -> f64 {
        let total: usize = self.requests.iter().map(|r| r.questions).sum();
        total as f64 / self.requests.len().max(1) as f64
    }

    /// Smallest and largest per-question prompt length (tokens) over the distinct bodies.
    pub fn prompt_token_range(&self) -> (usize, usize) {
        token_range(self.requests.iter())
    }

    /// The kinds of request in the workload, in order.
    pub fn kinds(&self) -> Vec<RequestKind> {
        let mut kinds: Vec<RequestKind> = self.requests.iter().map(|r| r.kind).collect();
        kinds.sort();
        kinds.dedup();
        kinds
    }

    /// The distinct bodies of one kind.
    pub fn of_kind(&self, kind: RequestKind) -> impl Iterator<Item = &RequestSpec> + Clone {
        self.requests.iter().filter(move |r| r.kind == kind)
    }
}

/// Smallest and largest per-question prompt length (tokens) of `requests`.
pub fn token_range<'a>(requests: impl Iterator<Item = &'a RequestSpec> + Clone) -> (usize, usize) {
    let per_question = |r: &RequestSpec| r.approx_prompt_tokens / r.questions.max(1);
    let min = requests.clone().map(per_question).min().unwrap_or(0);
    let max = requests.map(per_question).max().unwrap_or(0);
    (min, max)
}

// Token estimates, calibrated with Qwen3.5's vocabulary on the 60 fixtures (and on this crate's
// synthetic output): every digit is its own token, so coordinate-heavy accessibility trees are
// dense (~1.5-1.65 characters per token), prose is ~3.4-3.75.

/// Characters per token of accessibility-tree lines (`- Button "Save" @ [x, y, x2, y2]`).
pub const TREE_CHARS_PER_TOKEN: f64 = 1.45;
/// Characters per token of a JSON-rendered structured state.
pub const JSON_CHARS_PER_TOKEN: f64 = 1.65;
/// Characters per token of goals and real option labels.
pub const PROSE_CHARS_PER_TOKEN: f64 = 3.5;
/// Characters per token of short synthetic labels (`Settings 47`: each digit is a token).
pub const SHORT_LABEL_CHARS_PER_TOKEN: f64 = 2.35;
/// Characters per token of an object label rendered as escaped JSON in the option line.
pub const ESCAPED_JSON_CHARS_PER_TOKEN: f64 = 3.0;
/// Tokens of the chat template, system prompt and fixed user-message lines of one question.
pub const TEMPLATE_TOKENS: usize = 118;
/// [`TEMPLATE_TOKENS`] of a screenshot question: the tree header (`Accessibility tree:`, ~4
/// tokens) becomes `The current screenshot is attached.` (~6), and `<|vision_start|>` and
/// `<|vision_end|>` frame the image's tokens (counted apart, from its size).
pub const SCREENSHOT_TEMPLATE_TOKENS: usize = TEMPLATE_TOKENS + 4;
/// Tokens of one option line beyond its label (`A. Decision "…" -> select`).
pub const OPTION_LINE_TOKENS: usize = 7;

/// Approximate token count of `chars` characters of text of the given density.
pub fn approx_tokens(chars: usize, chars_per_token: f64) -> usize {
    (chars as f64 / chars_per_token).ceil() as usize
}
