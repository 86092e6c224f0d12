//! The two prompt mappings: the training layout (checked against the real fixtures' `chat`
//! strings) and System1-Omni's closed-candidate mapping.

use std::path::PathBuf;

use instinct_model::prompt::{self, Candidate, Screen, SYSTEM_PROMPT};
use instinct_model::pyjson;

fn fixtures() -> Vec<serde_json::Value> {
    let dir = std::env::var_os("INSTINCT_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures"));
    let path = dir.join("cua-s1-4b-0.2-text.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("fixture file {}: {e}", path.display()));
    let root: serde_json::Value = serde_json::from_str(&text).expect("fixture JSON");
    root["fixtures"].as_array().expect("fixtures").clone()
}

#[test]
fn native_chat_reproduces_every_fixture() {
    let fixtures = fixtures();
    assert_eq!(fixtures.len(), 60);
    for fixture in &fixtures {
        let text = |field: &str| fixture[field].as_str().expect(field);
        let screen = Screen {
            app: text("app"),
            task_family: text("family"),
            accessibility_tree: text("ax_tree"),
        };
        let candidates: Vec<Candidate<'_>> = fixture["options"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| Candidate {
                role: o["role"].as_str().unwrap(),
                label: o["label"].as_str().unwrap(),
                action: o["action"].as_str().unwrap(),
                entity_id: o["entity_id"].as_str(),
            })
            .collect();
        let chat = prompt::native_chat(text("goal"), &screen, &candidates);
        assert_eq!(chat, text("chat"), "{}", text("id"));
    }
}

#[test]
fn entity_is_shown_only_for_a_filled_entity() {
    let screen = Screen {
        app: "gui360_word",
        task_family: "form_filling",
        accessibility_tree: "- Edit \"Name\"",
    };
    let option = |action, entity_id| Candidate {
        role: "Edit",
        label: "Name",
        action,
        entity_id,
    };
    let text = prompt::user_text(
        "",
        &screen,
        &[
            option("fill", Some("ent_0")),
            option("fill", None),
            option("fill", Some("")),
            option("click", Some("ent_1")),
        ],
    );
    assert_eq!(
        text,
        "App: gui360_word\nTask family: form_filling\n\nAccessibility tree:\n- Edit \"Name\"\n\n\
         Options:\nA. Edit \"Name\" -> fill (with entity 'ent_0')\nB. Edit \"Name\" -> fill\n\
         C. Edit \"Name\" -> fill\nD. Edit \"Name\" -> click\n\nAnswer with a single letter."
    );
}

#[test]
fn omni_labels_are_escaped_like_json_dumps() {
    assert_eq!(prompt::omni_label("plain"), "plain");
    assert_eq!(
        prompt::omni_label("Click \"Submit\"\n(tab\there) C:\\Users \u{1} é \u{2028}"),
        "Click \\\"Submit\\\"\\n(tab\\there) C:\\\\Users \\u0001 é \u{2028}"
    );
}

#[test]
fn omni_chat_uses_the_fixed_closed_candidate_values() {
    let chat = prompt::omni_chat("Keep it.", "Dialog", &["Say \"yes\"", "no"]);
    let user = "Goal: Keep it.\n\nApp: Cua Driver\nTask family: closed-candidate decision\n\n\
                Accessibility tree:\nDialog\n\nOptions:\nA. Decision \"Say \\\"yes\\\"\" -> select\n\
                B. Decision \"no\" -> select\n\nAnswer with a single letter.";
    assert_eq!(
        chat,
        format!(
            "<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n\
             <|im_start|>assistant\n<think>\n"
        )
    );
    // No goal block for an empty goal.
    let chat = prompt::omni_chat("", "Dialog", &["no"]);
    assert!(chat.contains("<|im_start|>user\nApp: Cua Driver\n"));
}

#[test]
fn field_text_is_the_string_or_its_json_dumps() {
    let value = pyjson::parse(
        br#"{"s": "raw \"text\"", "o": {"x": 1.0}, "a": [1e16], "n": null, "b": true, "i": 3}"#,
    )
    .unwrap();
    let object = value.as_object().unwrap();
    let text = |key| prompt::field_text(object.get(key).unwrap()).map(|t| t.into_owned());
    assert_eq!(text("s").as_deref(), Some("raw \"text\""));
    assert_eq!(text("o").as_deref(), Some("{\"x\": 1.0}"));
    assert_eq!(text("a").as_deref(), Some("[1e+16]"));
    assert_eq!(text("n"), None);
    assert_eq!(text("b"), None);
    assert_eq!(text("i"), None);
}
