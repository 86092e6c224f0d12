//! `ChatTemplate` renders a Qwen3.5-style Jinja template exactly as the built-in rendering does
//! (and as the real fixtures' `chat` strings are), finds a snapshot's template where transformers
//! looks, and provides the transformers extensions templates rely on.

use std::path::{Path, PathBuf};

use instinct_model::chat::{render_builtin, render_builtin_with_image, ChatTemplate, IMAGE_BLOCK};
use serde::Deserialize;

const OUR_TEMPLATE: &str = include_str!("data/qwen35_like_chat_template.jinja");

#[derive(Deserialize)]
struct FixtureFile {
    fixtures: Vec<Fixture>,
}

#[derive(Deserialize)]
struct Fixture {
    id: String,
    chat: String,
}

/// Each fixture's chat string with the system and user contents cut out of it.
fn fixture_messages() -> Vec<(String, String, String, String)> {
    const NAME: &str = "cua-s1-4b-0.2-text.json";
    let path = match std::env::var_os("INSTINCT_FIXTURES").map(PathBuf::from) {
        Some(p) if p.is_dir() => p.join(NAME),
        Some(p) => p,
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/fixtures")
            .join(NAME),
    };
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "fixtures {}: {e} (set INSTINCT_FIXTURES to the fixtures directory or file)",
            path.display()
        )
    });
    let file: FixtureFile = serde_json::from_str(&text).expect("fixture JSON");
    assert_eq!(file.fixtures.len(), 60);
    file.fixtures
        .into_iter()
        .map(|f| {
            let between = |start: &str| {
                let rest = f.chat.split_once(start).expect("turn start").1;
                rest.split_once("<|im_end|>")
                    .expect("turn end")
                    .0
                    .to_string()
            };
            let system = between("<|im_start|>system\n");
            let user = between("<|im_start|>user\n");
            (f.id, f.chat.clone(), system, user)
        })
        .collect()
}

#[test]
fn our_template_renders_the_fixture_chats_like_the_builtin() {
    let template = ChatTemplate::from_jinja(OUR_TEMPLATE).unwrap();
    assert!(!template.is_builtin());
    for (id, chat, system, user) in fixture_messages() {
        assert_eq!(render_builtin(&system, &user), chat, "{id}: builtin");
        assert_eq!(
            template.render(&system, &user).unwrap(),
            chat,
            "{id}: template"
        );
        // Surrounding whitespace goes in both, Python-style.
        let padded_system = format!("\n  {system} \t\n");
        let padded_user = format!("\u{3000}\r\n{user}\n\n\u{1f}");
        let builtin = render_builtin(&padded_system, &padded_user);
        assert_eq!(builtin, chat, "{id}: padded builtin");
        assert_eq!(
            template.render(&padded_system, &padded_user).unwrap(),
            builtin,
            "{id}: padded template"
        );
    }
}

#[test]
fn image_item_renders_right_before_the_text() {
    let template = ChatTemplate::from_jinja(OUR_TEMPLATE).unwrap();
    assert_eq!(
        render_builtin_with_image(" S ", " hi \n"),
        format!(
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n{IMAGE_BLOCK} hi<|im_end|>\n<|im_start|>assistant\n<think>\n"
        )
    );
    for (id, _, system, user) in fixture_messages().into_iter().take(10) {
        let user = format!("  {user}\n");
        let builtin = render_builtin_with_image(&system, &user);
        assert!(
            builtin.contains(&format!("{IMAGE_BLOCK}{}", user.trim_end())),
            "{id}"
        );
        assert_eq!(
            template.render_with_image(&system, &user).unwrap(),
            builtin,
            "{id}"
        );
        assert_eq!(
            ChatTemplate::builtin()
                .render_with_image(&system, &user)
                .unwrap(),
            builtin
        );
    }
}

#[test]
fn snapshot_template_lookup() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();

    // Nothing: the built-in rendering.
    assert!(ChatTemplate::from_snapshot(dir.path())
        .unwrap()
        .is_builtin());
    write("tokenizer_config.json", r#"{"eos_token": "<|im_end|>"}"#);
    assert!(ChatTemplate::from_snapshot(dir.path())
        .unwrap()
        .is_builtin());

    // tokenizer_config.json's template, with its special tokens in the context.
    write(
        "tokenizer_config.json",
        r#"{"eos_token": {"content": "<|im_end|>"}, "chat_template": "config {{ eos_token }}"}"#,
    );
    let t = ChatTemplate::from_snapshot(dir.path()).unwrap();
    assert_eq!(t.render("s", "u").unwrap(), "config <|im_end|>");

    // A named-template list uses "default".
    write(
        "tokenizer_config.json",
        r#"{"chat_template": [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "named"}]}"#,
    );
    assert_eq!(
        ChatTemplate::from_snapshot(dir.path())
            .unwrap()
            .render("s", "u")
            .unwrap(),
        "named"
    );

    // chat_template.json (processor) wins over tokenizer_config.json.
    write("chat_template.json", r#"{"chat_template": "processor"}"#);
    assert_eq!(
        ChatTemplate::from_snapshot(dir.path())
            .unwrap()
            .render("s", "u")
            .unwrap(),
        "processor"
    );

    // chat_template.jinja wins over both.
    write("chat_template.jinja", OUR_TEMPLATE);
    let t = ChatTemplate::from_snapshot(dir.path()).unwrap();
    assert_eq!(
        t.render(" sys ", "user").unwrap(),
        render_builtin("sys", "user")
    );

    // Broken inputs are errors naming the file.
    write("chat_template.jinja", "{% if %}");
    let err = ChatTemplate::from_snapshot(dir.path()).unwrap_err();
    assert!(
        format!("{err:#}").contains("chat_template.jinja"),
        "{err:#}"
    );
    std::fs::remove_file(dir.path().join("chat_template.jinja")).unwrap();
    write("chat_template.json", "{not json");
    let err = ChatTemplate::from_snapshot(dir.path()).unwrap_err();
    assert!(format!("{err:#}").contains("chat_template.json"), "{err:#}");
}

#[test]
fn raise_exception_fails_the_render_with_its_message() {
    let t = ChatTemplate::from_jinja(
        "{% if messages[0].role == 'system' %}{{ raise_exception('no system prompts here') }}{% endif %}",
    )
    .unwrap();
    let err = t.render("s", "u").unwrap_err();
    assert!(
        format!("{err:#}").contains("no system prompts here"),
        "{err:#}"
    );
    assert!(
        format!("{err:#}").contains("rendering the chat template"),
        "{err:#}"
    );
}

#[test]
fn tojson_writes_python_json() {
    let t =
        ChatTemplate::from_jinja("{{ messages | tojson }}|{{ messages[1] | tojson(indent=1) }}")
            .unwrap();
    assert_eq!(
        t.render("S", "a<b>&'é\"\n").unwrap(),
        "[{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"a<b>&'é\\\"\\n\"}]|\
         {\n \"role\": \"user\",\n \"content\": \"a<b>&'é\\\"\\n\"\n}"
    );
    let t =
        ChatTemplate::from_jinja("{{ messages[0] | tojson(sort_keys=true, ensure_ascii=true) }}")
            .unwrap();
    assert_eq!(
        t.render("é", "u").unwrap(),
        r#"{"content": "\u00e9", "role": "system"}"#
    );
}

#[test]
fn python_string_methods_trim_and_loop_controls() {
    let t = ChatTemplate::from_jinja(
        "{{ messages[1].content.split('</think>')[-1].lstrip('\\n') }}\
         |{% if messages[1].content.startswith('<think>') %}starts{% endif %}\
         |{{ messages[0].content | trim }}|{{ messages[0].content | trim('\u{1c}x') }}\
         |{{ nothing | trim }}|{{ 7 | trim }}\
         |{% for m in messages %}{% if loop.first %}{% continue %}{% endif %}{{ m.role }}{% endfor %}",
    )
    .unwrap();
    assert_eq!(
        t.render("\u{1c}x sys x\u{1f}", "<think>a</think>\n\nanswer")
            .unwrap(),
        "answer|starts|x sys x| sys x\u{1f}||7|user"
    );
}
