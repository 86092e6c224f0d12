//! Chat rendering of a Cua-S1 prompt (`[system, user]`, generation prompt on, thinking left at its
//! default, so the prompt ends with the open `<think>` line).
//!
//! `ChatTemplate` renders the snapshot's own Jinja template the way transformers does (MiniJinja
//! with `trim_blocks` and `lstrip_blocks`, Python string methods, `raise_exception`, a Python
//! `tojson` and a Python `trim`); without one it falls back to the built-in rendering, which is
//! byte-identical to the Qwen3.5 template for these messages.

mod json_dumps;

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde_json::json;

/// What the Qwen3.5 template writes for one image item of a user message.
pub const IMAGE_BLOCK: &str = "<|vision_start|><|image_pad|><|vision_end|>";

/// The built-in Qwen3.5 rendering of `[system, user]` with the generation prompt, byte-identical to
/// the checkpoint's own template for these two messages. Message contents are trimmed with Python
/// `str.strip` semantics, as the template does.
pub fn render_builtin(system: &str, user: &str) -> String {
    render_builtin_content(system, py_strip(user))
}

/// The built-in rendering of `[system, user]` where the user content is an image item followed by
/// a text item (the multimodal Cua-S1 prompt): the image block comes right before the text, and the
/// template trims the joined content, so only the text's trailing whitespace goes.
pub fn render_builtin_with_image(system: &str, user: &str) -> String {
    render_builtin_content(system, &format!("{IMAGE_BLOCK}{}", py_rstrip(user)))
}

fn render_builtin_content(system: &str, user_content: &str) -> String {
    format!(
        "<|im_start|>system\n{}<|im_end|>\n<|im_start|>user\n{user_content}<|im_end|>\n<|im_start|>assistant\n<think>\n",
        py_strip(system),
    )
}

/// Python's `str.strip()` with no argument: strips Unicode whitespace as Python defines it.
pub fn py_strip(s: &str) -> &str {
    s.trim_matches(is_py_whitespace)
}

/// Python's `str.rstrip()` with no argument.
fn py_rstrip(s: &str) -> &str {
    s.trim_end_matches(is_py_whitespace)
}

/// Python's `str.isspace` for one character (Unicode White_Space plus the ASCII separators
/// 0x1C-0x1F, which Python also strips).
fn is_py_whitespace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Name of the one template in a `ChatTemplate`'s environment.
const TEMPLATE_NAME: &str = "chat_template";

/// A snapshot's chat template, or the built-in rendering when the snapshot has none.
pub struct ChatTemplate {
    jinja: Option<JinjaTemplate>,
}

struct JinjaTemplate {
    env: Environment<'static>,
    /// `bos_token`, `eos_token`, … from `tokenizer_config.json`, which transformers passes to
    /// the template.
    special_tokens: serde_json::Map<String, serde_json::Value>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.is_builtin() {
            "builtin"
        } else {
            "jinja"
        };
        f.debug_struct("ChatTemplate").field("kind", &kind).finish()
    }
}

impl ChatTemplate {
    /// The built-in rendering.
    pub fn builtin() -> Self {
        Self { jinja: None }
    }

    /// Compiles a Jinja chat template (errors in the template are reported here, not at render).
    pub fn from_jinja(source: &str) -> Result<Self> {
        Self::compile(source.to_string(), serde_json::Map::new())
    }

    /// The template of a snapshot directory, looked up as transformers does: `chat_template.jinja`,
    /// then `chat_template.json` (processor), then `chat_template` in `tokenizer_config.json`;
    /// the built-in rendering when none has one.
    pub fn from_snapshot(dir: &Path) -> Result<Self> {
        let config = read_json_if_present(&dir.join("tokenizer_config.json"))?;
        let special_tokens = config
            .as_ref()
            .map(special_token_strings)
            .unwrap_or_default();

        let jinja_file = dir.join("chat_template.jinja");
        if jinja_file.is_file() {
            let source = std::fs::read_to_string(&jinja_file)
                .with_context(|| format!("reading {}", jinja_file.display()))?;
            return Self::compile(source, special_tokens)
                .with_context(|| format!("in {}", jinja_file.display()));
        }
        let json_file = dir.join("chat_template.json");
        if let Some(value) = read_json_if_present(&json_file)? {
            if let Some(source) = template_from_config(&value, &json_file)? {
                return Self::compile(source, special_tokens)
                    .with_context(|| format!("in {}", json_file.display()));
            }
        }
        if let Some(value) = &config {
            let config_file = dir.join("tokenizer_config.json");
            if let Some(source) = template_from_config(value, &config_file)? {
                return Self::compile(source, special_tokens)
                    .with_context(|| format!("in {}", config_file.display()));
            }
        }
        Ok(Self::builtin())
    }

    /// Whether this renders with the built-in rendering (the snapshot had no template).
    pub fn is_builtin(&self) -> bool {
        self.jinja.is_none()
    }

    /// Renders `[system, user]` with the generation prompt and thinking at its default.
    pub fn render(&self, system: &str, user: &str) -> Result<String> {
        match &self.jinja {
            None => Ok(render_builtin(system, user)),
            Some(t) => t.render(json!([
                {"role": "system", "content": system},
                {"role": "user", "content": user},
            ])),
        }
    }

    /// Renders `[system, user]` where the user content is an image item followed by a text item.
    pub fn render_with_image(&self, system: &str, user: &str) -> Result<String> {
        match &self.jinja {
            None => Ok(render_builtin_with_image(system, user)),
            Some(t) => t.render(json!([
                {"role": "system", "content": system},
                {"role": "user", "content": [
                    {"type": "image"},
                    {"type": "text", "text": user},
                ]},
            ])),
        }
    }

    /// The text that renderings of `[system, user]` start with whatever the user message: the
    /// common start of two text renders whose user messages differ from their first character
    /// and, where the template renders images, a screenshot render. A template could still
    /// render some message differently; callers check that a chat starts with it.
    pub fn fixed_prefix(&self, system: &str) -> Result<String> {
        let mut renders = vec![
            self.render(system, "Goal: x")?,
            self.render(system, "App: x")?,
        ];
        renders.extend(self.render_with_image(system, "App: x").ok());
        let first = &renders[0];
        let len = renders[1..].iter().fold(first.len(), |len, other| {
            first[..len]
                .char_indices()
                .zip(other.chars())
                .find(|((_, a), b)| a != b)
                .map_or(len.min(other.len()), |((at, _), _)| at)
        });
        Ok(first[..len].to_string())
    }

    fn compile(
        source: String,
        special_tokens: serde_json::Map<String, serde_json::Value>,
    ) -> Result<Self> {
        let mut env = Environment::new();
        // transformers compiles chat templates with these two options; they decide whitespace.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", tojson);
        env.add_filter("trim", py_trim);
        env.add_template_owned(TEMPLATE_NAME, source)
            .map_err(|e| anyhow!("chat template does not compile: {}", describe(&e)))?;
        Ok(Self {
            jinja: Some(JinjaTemplate {
                env,
                special_tokens,
            }),
        })
    }
}

impl JinjaTemplate {
    fn render(&self, messages: serde_json::Value) -> Result<String> {
        let mut context = self.special_tokens.clone();
        context.insert("messages".into(), messages);
        context.insert("add_generation_prompt".into(), true.into());
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| anyhow!("chat template: {}", describe(&e)))?;
        template
            .render(Value::from_serialize(&context))
            .map_err(|e| anyhow!("rendering the chat template: {}", describe(&e)))
    }
}

/// A MiniJinja error with its cause chain and template location.
fn describe(err: &Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        text += &format!(": {cause}");
        source = cause.source();
    }
    text
}

fn read_json_if_present(path: &Path) -> Result<Option<serde_json::Value>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not valid JSON", path.display()))?;
    Ok(Some(value))
}

/// `chat_template` of a config: a string, or a list of `{name, template}` whose `default` entry
/// is the one `apply_chat_template` uses.
fn template_from_config(config: &serde_json::Value, path: &Path) -> Result<Option<String>> {
    match config.get("chat_template") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
        Some(serde_json::Value::Array(named)) => {
            for entry in named {
                if entry.get("name").and_then(|n| n.as_str()) == Some("default") {
                    if let Some(s) = entry.get("template").and_then(|t| t.as_str()) {
                        return Ok(Some(s.to_string()));
                    }
                }
            }
            bail!(
                "{}: chat_template is a list without a \"default\" template",
                path.display()
            )
        }
        Some(_) => bail!(
            "{}: chat_template is neither a string nor a list",
            path.display()
        ),
    }
}

/// `bos_token`, `eos_token`, `pad_token`, `unk_token` of `tokenizer_config.json` as strings (they
/// may be stored as strings or as added-token objects with a `content`).
fn special_token_strings(config: &serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    ["bos_token", "eos_token", "pad_token", "unk_token"]
        .into_iter()
        .filter_map(|key| {
            let value = config.get(key)?;
            let text = value
                .as_str()
                .or_else(|| value.get("content").and_then(|c| c.as_str()))?;
            Some((key.to_string(), text.into()))
        })
        .collect()
}

/// transformers' `raise_exception(message)`: fails the render with the message.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// Jinja's `trim` is Python's `str.strip(chars)` of the value's text (undefined is empty).
fn py_trim(value: &Value, chars: Option<String>) -> String {
    let text = match value.as_str() {
        Some(s) => s.to_string(),
        None if value.is_undefined() => String::new(),
        None => value.to_string(),
    };
    match chars {
        None => py_strip(&text).to_string(),
        Some(chars) => text.trim_matches(|c| chars.contains(c)).to_string(),
    }
}

/// transformers' `tojson`: Python `json.dumps(value, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)`, not HTML-escaped.
fn tojson(value: Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(usize::try_from(v)?),
    };
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let separators = kwargs.get::<Option<Vec<String>>>("separators")?;
    kwargs.assert_all_used()?;
    let separators = match separators {
        None => None,
        Some(pair) => match <[String; 2]>::try_from(pair) {
            Ok([item, key]) => Some((item, key)),
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be (item_separator, key_separator)",
                ))
            }
        },
    };
    let json = serde_json::to_value(&value).map_err(|e| {
        Error::new(ErrorKind::InvalidOperation, "tojson: value is not JSON").with_source(e)
    })?;
    let style = json_dumps::Style::new(indent, separators, sort_keys, ensure_ascii);
    Ok(Value::from(json_dumps::dumps(&json, &style)))
}
