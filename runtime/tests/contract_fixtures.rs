//! Every real Cua-S1 fixture's `chat` string is reproduced byte for byte by a `cua-s1-native`
//! request built from the fixture's fields, through the same parsing and validation the server
//! uses.

use std::path::PathBuf;

use instinct::contract::{parse_request, PromptFormat};
use serde_json::{json, Value};

const FIXTURE_FILE: &str = "cua-s1-4b-0.2-text.json";

/// `$INSTINCT_FIXTURES` (a directory) or the workspace's sibling `shared/fixtures/`. A missing
/// file fails the test: the check must not pass by not running.
fn fixtures() -> Vec<Value> {
    let dir = std::env::var_os("INSTINCT_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures"));
    let path = dir.join(FIXTURE_FILE);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("fixture file {}: {e}", path.display()));
    let root: Value = serde_json::from_str(&text).expect("fixture file is JSON");
    root["fixtures"]
        .as_array()
        .expect("a `fixtures` list")
        .clone()
}

/// The native request for one fixture: option keys are `o0`, `o1`, ... (the fixture's element
/// ids repeat when one element has two actions).
fn native_request(fixture: &Value) -> Value {
    let criteria: serde_json::Map<String, Value> = fixture["options"]
        .as_array()
        .expect("options")
        .iter()
        .enumerate()
        .map(|(i, option)| {
            (
                format!("o{i}"),
                json!({
                    "role": option["role"],
                    "label": option["label"],
                    "action": option["action"],
                    "entity_id": option["entity_id"],
                }),
            )
        })
        .collect();
    json!({
        "model": "cua-s1-4b-0.2",
        "prompt_format": "cua-s1-native",
        "state": {
            "app": fixture["app"],
            "task_family": fixture["family"],
            "accessibility_tree": fixture["ax_tree"],
        },
        "questions": {
            "decision": {
                "type": "choice",
                "instructions": fixture["goal"],
                "criteria": criteria,
            }
        }
    })
}

#[test]
fn all_fixture_chats_are_reproduced() {
    let fixtures = fixtures();
    assert_eq!(fixtures.len(), 60);
    for fixture in &fixtures {
        let id = fixture["id"].as_str().expect("id");
        let body = serde_json::to_vec(&native_request(fixture)).unwrap();
        let request = parse_request(&body, "cua-s1-4b-0.2")
            .unwrap_or_else(|problem| panic!("{id}: {problem}"));
        assert_eq!(request.prompt_format, PromptFormat::CuaS1Native);
        let [question] = request.questions.as_slice() else {
            panic!("{id}: one question expected");
        };
        let options = fixture["options"].as_array().unwrap().len();
        let keys: Vec<String> = (0..options).map(|i| format!("o{i}")).collect();
        assert_eq!(question.option_keys, keys, "{id}");
        assert_eq!(
            question.chat_builtin(),
            fixture["chat"].as_str().unwrap(),
            "{id}"
        );
    }
}

#[test]
fn fixture_labels_are_written_raw_not_escaped() {
    // The training data quotes labels without escaping them; one fixture label holds quotes.
    let fixtures = fixtures();
    let quoted = fixtures
        .iter()
        .find(|f| {
            f["options"]
                .as_array()
                .unwrap()
                .iter()
                .any(|o| o["label"].as_str().unwrap().contains('"'))
        })
        .expect("a fixture with a quoted label");
    let body = serde_json::to_vec(&native_request(quoted)).unwrap();
    let request = parse_request(&body, "cua-s1-4b-0.2").unwrap();
    assert!(request.questions[0]
        .chat_builtin()
        .contains("Button \"\"Not Allowed\" Symbol\" -> skip"));
}
