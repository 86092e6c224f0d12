//! The `/v1/systemone` request contract: strict parsing, validation of the whole request, and
//! one chat string per question, ready for tokenization.
//!
//! The rules, limits, statuses and messages are System1-Omni's text contract. A request may opt
//! in to the model's own training layout with the top-level field `"prompt_format":
//! "cua-s1-native"`; without it (or with `"system1-omni"`) a request means exactly what it means
//! to System1-Omni, whose text workers ignore unknown top-level fields.
//!
//! - `system1-omni`: `state` is the accessibility-tree text (a string as is, an object or array
//!   as Python's `json.dumps`), each criterion value is the label of an option (`null`: the key
//!   itself), and the prompt uses the fixed closed-candidate app, family, role and action.
//! - `cua-s1-native`: `state` is `{"app", "task_family", "accessibility_tree"}` (strings) and
//!   each criterion value is `{"role", "label", "action", "entity_id"?}` (strings, `entity_id`
//!   may be null or left out); they are written into the prompt as given, as in training.
//!
//! In both formats option keys are the ids the answer uses, lettered A-Z in request order, and
//! question names never enter the prompt.

use std::borrow::Cow;

use instinct_model::chat::{render_builtin, ChatTemplate};
use instinct_model::prompt::{self, Candidate, Screen};
use instinct_model::pyjson::{self, Object, Value};

use crate::problem::{question_place, Code, InvalidQuestion, Problem};
use crate::screenshot::{self, is_screenshot_state, Screenshot};

/// Most questions per request (more is a 413).
pub const MAX_QUESTIONS: usize = 64;
/// Most options per question; each gets a letter.
pub const MAX_OPTIONS: usize = prompt::LETTERS.len();
/// Most prompt tokens per question, checked by the caller after tokenization
/// ([`Problem::prompts_too_long`]).
pub const MAX_PROMPT_TOKENS: usize = 16_384;
/// Largest request body in bytes, enforced by the HTTP layer ([`Problem::body_too_large`]).
pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// The top-level field that selects the prompt layout.
pub const PROMPT_FORMAT_FIELD: &str = "prompt_format";

/// How a request's fields map onto the prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptFormat {
    /// System1-Omni's closed-candidate mapping (the default).
    System1Omni,
    /// The model's training layout with caller-given app, family, roles, actions and entities.
    CuaS1Native,
}

impl PromptFormat {
    pub fn name(self) -> &'static str {
        match self {
            PromptFormat::System1Omni => "system1-omni",
            PromptFormat::CuaS1Native => "cua-s1-native",
        }
    }

    fn from_name(name: &str) -> Option<PromptFormat> {
        [PromptFormat::System1Omni, PromptFormat::CuaS1Native]
            .into_iter()
            .find(|format| format.name() == name)
    }
}

/// One validated question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    /// The name the request gave it; answers are keyed by it, in request order.
    pub name: String,
    /// The option keys in request order: letter A is `option_keys[0]`, and so on.
    pub option_keys: Vec<String>,
    /// The user message; the system message is [`prompt::SYSTEM_PROMPT`]. The chat string is
    /// rendered by the served checkpoint's own template ([`Question::chat`]).
    pub user: String,
}

impl Question {
    /// The full chat string (system and user turns, generation prompt) with `template`.
    pub fn chat(&self, template: &ChatTemplate) -> anyhow::Result<String> {
        template.render(prompt::SYSTEM_PROMPT, &self.user)
    }

    /// The full chat string with the built-in Qwen3.5 rendering.
    pub fn chat_builtin(&self) -> String {
        render_builtin(prompt::SYSTEM_PROMPT, &self.user)
    }
}

/// A request that passed validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The served model's name (the request's `model`, which may be left out, must equal it).
    pub model: String,
    pub prompt_format: PromptFormat,
    /// In request order.
    pub questions: Vec<Question>,
    /// The screenshot of a screenshot request (its questions' user messages go after it).
    pub image: Option<Screenshot>,
}

/// Parses and validates a body of a text-only server; every problem is the answer to send.
pub fn parse_request(body: &[u8], served_model: &str) -> Result<Request, Problem> {
    validate(&parse_body(body)?, served_model)
}

/// Parses and validates a body; `screenshots` says whether this server answers screenshot state.
pub fn parse_request_with(
    body: &[u8],
    served_model: &str,
    screenshots: bool,
) -> Result<Request, Problem> {
    validate_with(&parse_body(body)?, served_model, screenshots)
}

/// Strict JSON whose top level is an object (400 otherwise).
pub fn parse_body(body: &[u8]) -> Result<Object, Problem> {
    match pyjson::parse(body) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(_) => Err(Problem::body_not_object()),
        Err(error) => Err(Problem::invalid_json(error)),
    }
}

/// Validates the whole request. Request-level problems are checked in System1-Omni's order
/// (model, state, questions, question count) and the first one is the answer, but every
/// question is still checked and each invalid one listed. Without request-level problems, the
/// first invalid question gives `code` and `detail`.
pub fn validate(body: &Object, served_model: &str) -> Result<Request, Problem> {
    validate_with(body, served_model, false)
}

/// [`validate`], with screenshot requests accepted when `screenshots` is set.
pub fn validate_with(
    body: &Object,
    served_model: &str,
    screenshots: bool,
) -> Result<Request, Problem> {
    let mut request_problems = Vec::new();
    let screenshot = screenshots && body.get("state").is_some_and(is_screenshot_state);
    if screenshot {
        if let Err(problem) = screenshot::check_request(body) {
            request_problems.push(problem);
        }
    }

    match body.get("model") {
        None | Some(Value::Null) => {}
        Some(Value::String(model)) if model == served_model => {}
        Some(_) => request_problems.push(Problem::new(
            Code::UnknownModel,
            format!("'model' must be '{served_model}'"),
        )),
    }

    let format = match body.get(PROMPT_FORMAT_FIELD) {
        None => PromptFormat::System1Omni,
        Some(value) => match value.as_str().and_then(PromptFormat::from_name) {
            Some(format) => format,
            None => {
                request_problems.push(Problem::new(
                    Code::InvalidPromptFormat,
                    format!(
                        "'{PROMPT_FORMAT_FIELD}' must be '{}' or '{}'",
                        PromptFormat::System1Omni.name(),
                        PromptFormat::CuaS1Native.name()
                    ),
                ));
                // Questions are still checked, in the format a request means by default.
                PromptFormat::System1Omni
            }
        },
    };

    let state = if screenshot {
        match screenshot::decode_state(body.get("state").expect("checked above")) {
            Ok(image) => Some(State::Screenshot(image)),
            Err(problem) => {
                request_problems.push(problem);
                None
            }
        }
    } else {
        match check_state(body.get("state"), format) {
            Ok(state) => Some(state),
            Err(problem) => {
                request_problems.push(problem);
                None
            }
        }
    };

    let questions = match body.get("questions") {
        Some(Value::Object(questions)) if !questions.is_empty() => questions,
        _ => {
            request_problems.push(Problem::new(
                Code::InvalidQuestions,
                "'questions' must be a non-empty object",
            ));
            return Err(first(request_problems));
        }
    };
    if questions.len() > MAX_QUESTIONS {
        request_problems.push(Problem::too_many_questions(MAX_QUESTIONS));
        return Err(first(request_problems));
    }

    let mut checked = Vec::with_capacity(questions.len());
    let mut invalid = Vec::new();
    for (name, question) in questions.iter() {
        let checked_question = if screenshot {
            screenshot::check_question(name, question)
                .and_then(|()| check_question(name, question, format))
                .and_then(|q| match &q.options {
                    Options::Omni(labels) => {
                        screenshot::check_text(name, &q.goal, labels).map(|()| q)
                    }
                    Options::Native(_) => Ok(q),
                })
        } else {
            check_question(name, question, format)
        };
        match checked_question {
            Ok(question) => checked.push(question),
            Err((code, detail)) => invalid.push(InvalidQuestion {
                question: name.to_string(),
                code,
                detail,
            }),
        }
    }

    if !request_problems.is_empty() {
        let mut problem = first(request_problems);
        problem.invalid_questions = invalid;
        return Err(problem);
    }
    if let Some(problem) = Problem::questions(invalid) {
        return Err(problem);
    }
    let mut state = state.expect("a state problem was returned above");
    let questions = checked
        .iter()
        .map(|question| Question {
            name: question.name.to_string(),
            option_keys: question.keys.iter().map(|key| key.to_string()).collect(),
            user: render(&state, question),
        })
        .collect();
    let image = match &mut state {
        State::Screenshot(image) => Some(std::mem::replace(
            image,
            Screenshot {
                format: screenshot::ImageFormat::Png,
                bytes: Vec::new(),
            },
        )),
        _ => None,
    };
    Ok(Request {
        model: served_model.to_string(),
        prompt_format: format,
        questions,
        image,
    })
}

fn first(problems: Vec<Problem>) -> Problem {
    problems
        .into_iter()
        .next()
        .expect("called with at least one problem")
}

/// The prompt text of `state`, per format.
enum State<'a> {
    Omni(Cow<'a, str>),
    Native(Screen<'a>),
    Screenshot(Screenshot),
}

/// A question that passed validation, borrowing from the body until its chat is rendered.
struct CheckedQuestion<'a> {
    name: &'a str,
    goal: Cow<'a, str>,
    keys: Vec<&'a str>,
    options: Options<'a>,
}

/// The options' prompt text, per format.
enum Options<'a> {
    /// The labels before System1-Omni's escaping.
    Omni(Vec<Cow<'a, str>>),
    Native(Vec<Candidate<'a>>),
}

/// A question's problem: its code and its detail.
type QuestionProblem = (Code, String);

/// The message for a value that must be text: upstream's wording, `<place> must be ...`.
fn not_text(place: &str) -> String {
    format!("{place} must be a string, an object or an array")
}

fn is_empty_value(value: &Value) -> bool {
    match value {
        Value::String(s) => s.is_empty(),
        Value::Array(items) => items.is_empty(),
        Value::Object(object) => object.is_empty(),
        _ => false,
    }
}

fn check_state(state: Option<&Value>, format: PromptFormat) -> Result<State<'_>, Problem> {
    let state = state.unwrap_or(&Value::Null);
    if is_empty_value(state) {
        return Err(Problem::new(
            Code::InvalidState,
            "'state' must not be empty",
        ));
    }
    if is_screenshot_state(state) {
        return Err(Problem::new(
            Code::UnsupportedModality,
            "screenshot state ({\"image\": data URL}) is not served by this build yet: it answers \
             accessibility-tree state only",
        ));
    }
    match format {
        PromptFormat::System1Omni => prompt::field_text(state)
            .map(State::Omni)
            .ok_or_else(|| Problem::new(Code::InvalidState, not_text("'state'"))),
        PromptFormat::CuaS1Native => check_native_state(state)
            .map(State::Native)
            .map_err(|detail| Problem::new(Code::InvalidState, detail)),
    }
}

const NATIVE_STATE_FIELDS: [&str; 3] = ["app", "task_family", "accessibility_tree"];
const NATIVE_OPTION_FIELDS: [&str; 4] = ["role", "label", "action", "entity_id"];

fn check_native_state(state: &Value) -> Result<Screen<'_>, String> {
    let Value::Object(object) = state else {
        return Err(format!(
            "'state' must be an object with 'app', 'task_family' and 'accessibility_tree' \
             for '{PROMPT_FORMAT_FIELD}' '{}'",
            PromptFormat::CuaS1Native.name()
        ));
    };
    check_known_keys(object, &NATIVE_STATE_FIELDS, "'state'")?;
    let field = |name: &str| non_empty_string(object, name, "'state'");
    Ok(Screen {
        app: field("app")?,
        task_family: field("task_family")?,
        accessibility_tree: field("accessibility_tree")?,
    })
}

/// Unknown fields of the native objects are refused: a misspelt field must not silently drop
/// out of the prompt.
fn check_known_keys(object: &Object, known: &[&str], place: &str) -> Result<(), String> {
    match object.keys().find(|key| !known.contains(key)) {
        Some(key) => Err(format!("{place}: unknown field {}", pyjson::dumps_str(key))),
        None => Ok(()),
    }
}

fn non_empty_string<'a>(object: &'a Object, name: &str, place: &str) -> Result<&'a str, String> {
    match object.get(name) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s),
        _ => Err(format!("{place}: '{name}' must be a non-empty string")),
    }
}

fn check_question<'a>(
    name: &'a str,
    question: &'a Value,
    format: PromptFormat,
) -> Result<CheckedQuestion<'a>, QuestionProblem> {
    let place = question_place(name);
    let Value::Object(question) = question else {
        return Err((Code::InvalidQuestion, format!("{place} must be an object")));
    };
    match question.get("type") {
        Some(Value::String(kind)) if kind == "choice" => {}
        Some(Value::String(kind)) if kind == "score" || kind == "noul" => {
            return Err((
                Code::UnsupportedQuestionType,
                format!(
                    "{place}: type '{kind}' is not supported; this model answers 'choice' \
                     questions only"
                ),
            ))
        }
        kind => {
            let shown = kind.map_or_else(|| "null".to_string(), pyjson::dumps);
            return Err((
                Code::UnknownQuestionType,
                format!("{place}: unknown type {shown}"),
            ));
        }
    }
    let goal = match question.get("instructions") {
        None => {
            return Err((
                Code::MissingInstructions,
                format!("{place}: 'instructions' is required"),
            ))
        }
        Some(Value::Null) => Cow::Borrowed(""),
        Some(value) => prompt::field_text(value)
            .ok_or_else(|| (Code::InvalidInstructions, not_text(&place)))?,
    };
    let criteria = match question.get("criteria") {
        Some(Value::Object(criteria)) if (1..=MAX_OPTIONS).contains(&criteria.len()) => criteria,
        _ => {
            return Err((
                Code::InvalidCriteria,
                format!("{place}: 'criteria' must be an object with 1 to {MAX_OPTIONS} options"),
            ))
        }
    };
    let options = match format {
        PromptFormat::System1Omni => Options::Omni(
            criteria
                .iter()
                .map(|(key, value)| omni_label(&place, key, value))
                .collect::<Result<_, _>>()?,
        ),
        PromptFormat::CuaS1Native => Options::Native(
            criteria
                .iter()
                .map(|(key, value)| native_candidate(&place, key, value))
                .collect::<Result<_, _>>()?,
        ),
    };
    Ok(CheckedQuestion {
        name,
        goal,
        keys: criteria.keys().collect(),
        options,
    })
}

/// A System1-Omni label: the value's text, or the key for `null`.
fn omni_label<'a>(
    place: &str,
    key: &'a str,
    value: &'a Value,
) -> Result<Cow<'a, str>, QuestionProblem> {
    match value {
        Value::Null => Ok(Cow::Borrowed(key)),
        value => prompt::field_text(value).ok_or_else(|| {
            let option = format!("{place}: {}", pyjson::dumps_str(key));
            (Code::InvalidOption, not_text(&option))
        }),
    }
}

fn native_candidate<'a>(
    place: &str,
    key: &'a str,
    value: &'a Value,
) -> Result<Candidate<'a>, QuestionProblem> {
    let option = format!("{place}: option {}", pyjson::dumps_str(key));
    let invalid = |detail: String| (Code::InvalidOption, detail);
    let Value::Object(fields) = value else {
        return Err(invalid(format!(
            "{option} must be an object with 'role', 'label' and 'action'"
        )));
    };
    check_known_keys(fields, &NATIVE_OPTION_FIELDS, &option).map_err(invalid)?;
    let role = non_empty_string(fields, "role", &option).map_err(invalid)?;
    let label = match fields.get("label") {
        Some(Value::String(label)) => label.as_str(),
        _ => return Err(invalid(format!("{option}: 'label' must be a string"))),
    };
    let action = non_empty_string(fields, "action", &option).map_err(invalid)?;
    let entity_id = match fields.get("entity_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(entity)) => Some(entity.as_str()),
        Some(_) => {
            return Err(invalid(format!(
                "{option}: 'entity_id' must be a string or null"
            )))
        }
    };
    Ok(Candidate {
        role,
        label,
        action,
        entity_id,
    })
}

fn render(state: &State<'_>, question: &CheckedQuestion<'_>) -> String {
    match (state, &question.options) {
        (State::Omni(state), Options::Omni(labels)) => {
            prompt::omni_user_text(&question.goal, state, labels)
        }
        (State::Native(screen), Options::Native(candidates)) => {
            prompt::user_text(&question.goal, screen, candidates)
        }
        (State::Screenshot(_), Options::Omni(labels)) => {
            prompt::omni_screenshot_user_text(&question.goal, labels)
        }
        _ => unreachable!("state and options are checked in the same prompt format"),
    }
}
