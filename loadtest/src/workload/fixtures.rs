//! Requests built from the real Cua-S1 fixtures (`cua-s1-4b-0.2-text.json`).
//!
//! Each fixture is one screen (app, task family, accessibility tree, goal) with its candidate
//! (element, action) options. It can be sent in the server's native Cua-S1 format (the whole
//! option record, so the prompt matches the fixture's own `chat` string) or in the plain
//! System1-Omni format (state = tree text, criteria = option key → label).

use std::path::Path;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{RequestKind, RequestSpec, Workload};

/// How a fixture is put on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FixtureFormat {
    /// `"prompt_format": "cua-s1-native"`, structured state and option records.
    Native,
    /// Plain System1-Omni: state = accessibility tree text, criteria = key → label.
    Plain,
}

#[derive(Debug, Deserialize)]
struct FixtureFile {
    fixtures: Vec<Fixture>,
}

#[derive(Debug, Deserialize)]
struct Fixture {
    id: String,
    family: String,
    app: String,
    goal: String,
    ax_tree: String,
    options: Vec<FixtureOption>,
    #[serde(default)]
    input_ids: Vec<u32>,
}

#[derive(Debug, Deserialize)]
struct FixtureOption {
    element_id: String,
    role: String,
    label: String,
    action: String,
    entity_id: Option<String>,
}

/// Loads the fixture file and builds one request per fixture, each with `questions_per_request`
/// copies of the fixture's question (named `q0`, `q1`, …).
pub fn load(
    path: &Path,
    format: FixtureFormat,
    questions_per_request: usize,
    model: &str,
) -> Result<Workload> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading fixture file {}", path.display()))?;
    let file: FixtureFile = serde_json::from_str(&text)
        .with_context(|| format!("parsing fixture file {}", path.display()))?;
    if file.fixtures.is_empty() {
        bail!("fixture file {} has no fixtures", path.display());
    }
    if !(1..=64).contains(&questions_per_request) {
        bail!("questions per request must be 1 to 64, got {questions_per_request}");
    }
    let requests = file
        .fixtures
        .iter()
        .map(|f| build(f, format, questions_per_request, model))
        .collect::<Result<Vec<_>>>()?;
    Ok(Workload {
        description: format!(
            "{} fixtures from {} ({format:?} format, {questions_per_request} question(s) each)",
            requests.len(),
            path.display()
        ),
        requests,
    })
}

fn build(f: &Fixture, format: FixtureFormat, questions: usize, model: &str) -> Result<RequestSpec> {
    if f.options.is_empty() || f.options.len() > 26 {
        bail!(
            "fixture {}: {} options (need 1 to 26)",
            f.id,
            f.options.len()
        );
    }
    let keys = option_keys(&f.options);
    let mut criteria = Map::new();
    for (key, o) in keys.into_iter().zip(&f.options) {
        let value = match format {
            FixtureFormat::Native => json!({
                "role": o.role,
                "label": o.label,
                "action": o.action,
                "entity_id": o.entity_id,
            }),
            FixtureFormat::Plain => Value::String(o.label.clone()),
        };
        criteria.insert(key, value);
    }
    let question = json!({"type": "choice", "instructions": f.goal, "criteria": criteria});
    let mut named = Map::new();
    for q in 0..questions {
        named.insert(format!("q{q}"), question.clone());
    }
    let body = match format {
        FixtureFormat::Native => json!({
            "model": model,
            "prompt_format": "cua-s1-native",
            "state": {
                "app": f.app,
                "task_family": f.family,
                "accessibility_tree": f.ax_tree,
            },
            "questions": named,
        }),
        FixtureFormat::Plain => json!({"model": model, "state": f.ax_tree, "questions": named}),
    };
    // The fixture's own token ids are exact for the native prompt; the plain prompt has the same
    // tree and goal with shorter option lines, so it is a close upper bound.
    let per_question = if f.input_ids.is_empty() {
        super::approx_tokens(f.ax_tree.len(), super::TREE_CHARS_PER_TOKEN)
            + super::approx_tokens(f.goal.len(), super::PROSE_CHARS_PER_TOKEN)
            + super::TEMPLATE_TOKENS
            + f.options.len() * super::OPTION_LINE_TOKENS
    } else {
        f.input_ids.len()
    };
    Ok(RequestSpec {
        body: Bytes::from(serde_json::to_vec(&body)?),
        questions,
        approx_prompt_tokens: per_question * questions,
        label: f.id.clone(),
        kind: RequestKind::Text,
    })
}

/// Option keys: `<element_id>.<action>`, made unique (one element can carry several actions, and
/// in principle the same pair twice).
fn option_keys(options: &[FixtureOption]) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    options
        .iter()
        .map(|o| {
            let base = format!("{}.{}", o.element_id, o.action);
            let mut key = base.clone();
            let mut n = 2;
            while !seen.insert(key.clone()) {
                key = format!("{base}#{n}");
                n += 1;
            }
            key
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = r#"{"fixtures": [
        {"id": "a", "family": "login_auth", "app": "web", "goal": "Sign in",
         "ax_tree": "- Button \"OK\" @ [0, 0, 1, 1]",
         "options": [
            {"element_id": "el_0", "role": "Button", "label": "OK", "action": "click", "entity_id": null},
            {"element_id": "el_0", "role": "Button", "label": "OK", "action": "click", "entity_id": null},
            {"element_id": "el_1", "role": "TextBox", "label": "User", "action": "fill", "entity_id": "ent_0"}
         ],
         "input_ids": [1, 2, 3, 4, 5]}
    ]}"#;

    fn write(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    #[test]
    fn native_body_has_the_structured_state_and_option_records() {
        let f = write(TWO);
        let w = load(f.path(), FixtureFormat::Native, 2, "cua-s1-4b-0.2").unwrap();
        let body: Value = serde_json::from_slice(&w.requests[0].body).unwrap();
        assert_eq!(body["prompt_format"], "cua-s1-native");
        assert_eq!(body["state"]["task_family"], "login_auth");
        assert_eq!(body["state"]["app"], "web");
        let q = &body["questions"]["q1"];
        assert_eq!(q["instructions"], "Sign in");
        let keys: Vec<_> = q["criteria"].as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys, ["el_0.click", "el_0.click#2", "el_1.fill"]);
        assert_eq!(q["criteria"]["el_1.fill"]["entity_id"], "ent_0");
        assert_eq!(w.requests[0].questions, 2);
        assert_eq!(w.requests[0].approx_prompt_tokens, 10);
    }

    #[test]
    fn plain_body_maps_keys_to_labels() {
        let f = write(TWO);
        let w = load(f.path(), FixtureFormat::Plain, 1, "m").unwrap();
        let body: Value = serde_json::from_slice(&w.requests[0].body).unwrap();
        assert!(body.get("prompt_format").is_none());
        assert!(body["state"].is_string());
        assert_eq!(body["questions"]["q0"]["criteria"]["el_1.fill"], "User");
    }

    #[test]
    fn bad_files_are_clear_errors() {
        let f = write(r#"{"fixtures": []}"#);
        assert!(load(f.path(), FixtureFormat::Plain, 1, "m").is_err());
        let f = write("not json");
        let err = load(f.path(), FixtureFormat::Plain, 1, "m").unwrap_err();
        assert!(format!("{err:#}").contains("parsing fixture file"));
        assert!(load(
            Path::new("/nonexistent/x.json"),
            FixtureFormat::Plain,
            1,
            "m"
        )
        .is_err());
    }
}
