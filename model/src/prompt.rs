//! The Cua-S1 user message, and the two ways a request maps onto it.
//!
//! The model was trained on one layout (`cua_s1/four_b.py`, text modality): an optional goal,
//! the app and task family, the accessibility tree, and lettered `(role, label, action)`
//! options. Both mappings produce that layout:
//!
//! - [`omni_chat`] is System1-Omni's closed-candidate mapping, byte for byte: app
//!   `Cua Driver`, task family `closed-candidate decision`, every option `Decision "<label>" ->
//!   select`, the label escaped as `json.dumps(label, ensure_ascii=False)` without its quotes.
//! - [`native_chat`] passes the caller's own app, task family, roles, raw labels, actions and
//!   entities, exactly as the training data wrote them.

use std::borrow::Cow;

use crate::chat::render_builtin;
use crate::pyjson::{self, Value};

/// The Cua-S1 system message (trycua/cua `four_b.py`, MIT); it must match byte for byte.
pub const SYSTEM_PROMPT: &str = "You are a one-pass computer-use decision model. You are shown \
the current state of a screen and a fixed, closed list of candidate (element, action) options, \
each given a single letter. Choose exactly one option: the single best next action to take. \
Answer with ONLY that option's letter -- no words, no punctuation, no explanation.";

/// Option letters, in the order options are given; their count is the most options a question
/// may have.
pub const LETTERS: [char; 26] = [
    'A', 'B', 'C', 'D', 'E', 'F', 'G', 'H', 'I', 'J', 'K', 'L', 'M', 'N', 'O', 'P', 'Q', 'R', 'S',
    'T', 'U', 'V', 'W', 'X', 'Y', 'Z',
];

/// The fixed values System1-Omni's closed-candidate mapping puts in the training layout.
pub const OMNI_APP: &str = "Cua Driver";
pub const OMNI_TASK_FAMILY: &str = "closed-candidate decision";
pub const OMNI_ROLE: &str = "Decision";
pub const OMNI_ACTION: &str = "select";

/// What the screen section of the prompt says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Screen<'a> {
    pub app: &'a str,
    pub task_family: &'a str,
    pub accessibility_tree: &'a str,
}

/// One candidate `(element, action)` option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate<'a> {
    pub role: &'a str,
    /// Written between double quotes as given (the training data does not escape it).
    pub label: &'a str,
    pub action: &'a str,
    /// Shown only for a `fill` action, and only when non-empty.
    pub entity_id: Option<&'a str>,
}

/// The text a request field stands for in the prompt: a string as is, an object or array as
/// Python's `json.dumps(value, ensure_ascii=False)`; `None` for null, booleans and numbers.
pub fn field_text(value: &Value) -> Option<Cow<'_, str>> {
    match value {
        Value::String(s) => Some(Cow::Borrowed(s)),
        Value::Array(_) | Value::Object(_) => Some(Cow::Owned(pyjson::dumps(value))),
        Value::Null | Value::Bool(_) | Value::Number(_) => None,
    }
}

/// The user message in the training layout (text modality). The goal block is left out when
/// `goal` is empty. At most [`LETTERS`]`.len()` candidates are lettered; callers validate the
/// count first.
pub fn user_text(goal: &str, screen: &Screen<'_>, candidates: &[Candidate<'_>]) -> String {
    layout(goal, screen, None, candidates)
}

/// The user message of a screenshot question: the training layout with the accessibility-tree
/// block replaced by `The current screenshot is attached.` (the image itself goes before the
/// text, placed by the chat template). `screen.accessibility_tree` is not used.
pub fn screenshot_user_text(
    goal: &str,
    screen: &Screen<'_>,
    candidates: &[Candidate<'_>],
) -> String {
    layout(goal, screen, Some(SCREENSHOT_LINE), candidates)
}

/// What a screenshot prompt says instead of the tree.
pub const SCREENSHOT_LINE: &str = "The current screenshot is attached.";

/// The one formatter of both modalities: `observation` replaces the tree block when given.
fn layout(
    goal: &str,
    screen: &Screen<'_>,
    observation: Option<&str>,
    candidates: &[Candidate<'_>],
) -> String {
    let mut text = String::with_capacity(
        goal.len() + screen.accessibility_tree.len() + 64 * candidates.len() + 128,
    );
    if !goal.is_empty() {
        text.push_str("Goal: ");
        text.push_str(goal);
        text.push_str("\n\n");
    }
    text.push_str("App: ");
    text.push_str(screen.app);
    text.push_str("\nTask family: ");
    text.push_str(screen.task_family);
    match observation {
        None => {
            text.push_str("\n\nAccessibility tree:\n");
            text.push_str(screen.accessibility_tree);
        }
        Some(line) => {
            text.push_str("\n\n");
            text.push_str(line);
        }
    }
    text.push_str("\n\nOptions:");
    for (letter, candidate) in LETTERS.iter().zip(candidates) {
        text.push('\n');
        text.push(*letter);
        text.push_str(". ");
        text.push_str(candidate.role);
        text.push_str(" \"");
        text.push_str(candidate.label);
        text.push_str("\" -> ");
        text.push_str(candidate.action);
        match candidate.entity_id {
            Some(entity) if candidate.action == "fill" && !entity.is_empty() => {
                text.push_str(" (with entity '");
                text.push_str(entity);
                text.push_str("')");
            }
            _ => {}
        }
    }
    text.push_str("\n\nAnswer with a single letter.");
    text
}

/// The full chat string of the training layout: system prompt, user message, generation prompt.
pub fn native_chat(goal: &str, screen: &Screen<'_>, candidates: &[Candidate<'_>]) -> String {
    render_builtin(SYSTEM_PROMPT, &user_text(goal, screen, candidates))
}

/// `json.dumps(label, ensure_ascii=False)[1:-1]`: the label as System1-Omni writes it.
pub fn omni_label(label: &str) -> String {
    let quoted = pyjson::dumps_str(label);
    quoted[1..quoted.len() - 1].to_string()
}

/// System1-Omni's user message for one question: `state` is the accessibility-tree text, `goal`
/// the instructions text (empty for none), `labels` the option labels before escaping.
pub fn omni_user_text<S: AsRef<str>>(goal: &str, state: &str, labels: &[S]) -> String {
    omni_layout(goal, Some(state), labels)
}

/// System1-Omni's user message for a screenshot question (the image goes before it).
pub fn omni_screenshot_user_text<S: AsRef<str>>(goal: &str, labels: &[S]) -> String {
    omni_layout(goal, None, labels)
}

/// System1-Omni's fixed app, family, role and action; `tree` is `None` for a screenshot.
fn omni_layout<S: AsRef<str>>(goal: &str, tree: Option<&str>, labels: &[S]) -> String {
    let escaped: Vec<String> = labels.iter().map(|l| omni_label(l.as_ref())).collect();
    let candidates: Vec<Candidate<'_>> = escaped
        .iter()
        .map(|label| Candidate {
            role: OMNI_ROLE,
            label,
            action: OMNI_ACTION,
            entity_id: None,
        })
        .collect();
    let screen = Screen {
        app: OMNI_APP,
        task_family: OMNI_TASK_FAMILY,
        accessibility_tree: tree.unwrap_or(""),
    };
    match tree {
        Some(_) => user_text(goal, &screen, &candidates),
        None => screenshot_user_text(goal, &screen, &candidates),
    }
}

/// System1-Omni's full chat string for one question, with the built-in template.
pub fn omni_chat<S: AsRef<str>>(goal: &str, state: &str, labels: &[S]) -> String {
    render_builtin(SYSTEM_PROMPT, &omni_user_text(goal, state, labels))
}
