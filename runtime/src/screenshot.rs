//! The screenshot contract (System1-Omni's multimodal workers): `state` is exactly
//! `{"image": "data:image/png;base64,…"}` (or JPEG), the body has only `model`, `state` and
//! `questions`, 1 to 8 questions with only `type`, `instructions` and `criteria`, names and option
//! keys of 1 to 256 characters, at most 16,384 characters of goal and labels per question, and no
//! vision control tokens in that text. The image's own limits are checked from its header by the
//! caller, before decoding.

use base64::Engine as _;
/// The declared format of a screenshot: the model's own, so the MIME type the request declared is
/// the one preprocessing checks against.
pub use instinct_model::image::ImageFormat;
use instinct_model::pyjson::{Object, Value};

use crate::problem::{question_place, Code, Problem};

/// Most questions of a screenshot request.
pub const MAX_SCREENSHOT_QUESTIONS: usize = 8;
/// Longest question name or option key, in characters.
pub const MAX_NAME_CHARS: usize = 256;
/// Most characters of goal plus labels in one question.
pub const MAX_TEXT_CHARS: usize = 16_384;
/// Largest image file, after base64 decoding.
pub const MAX_IMAGE_BYTES: usize = 4 * 1024 * 1024;
/// Text that would let a caller forge image placement.
pub const VISION_CONTROL_TOKENS: [&str; 4] = [
    "<|image_pad|>",
    "<|video_pad|>",
    "<|vision_start|>",
    "<|vision_end|>",
];

/// A screenshot as the request carried it, base64 decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Screenshot {
    pub format: ImageFormat,
    pub bytes: Vec<u8>,
}

/// True when `state` is a screenshot state (`{"image": "data:…"}`); such a state is never read as
/// accessibility-tree text.
pub fn is_screenshot_state(state: &Value) -> bool {
    match state {
        Value::Object(object) => {
            object.len() == 1
                && matches!(object.get("image"), Some(Value::String(url)) if url.starts_with("data:"))
        }
        _ => false,
    }
}

fn invalid(detail: impl Into<String>) -> Problem {
    Problem::new(Code::InvalidScreenshotRequest, detail)
}

/// The request-level rules: only `model`, `state` and `questions`; 1 to 8 questions.
pub fn check_request(body: &Object) -> Result<(), Problem> {
    if let Some(key) = body
        .keys()
        .find(|k| !["model", "state", "questions"].contains(k))
    {
        return Err(invalid(format!(
            "a screenshot request has only 'model', 'state' and 'questions'; found {:?}",
            key
        )));
    }
    if let Some(Value::Object(questions)) = body.get("questions") {
        if questions.len() > MAX_SCREENSHOT_QUESTIONS {
            return Err(invalid(format!(
                "a screenshot request has 1 to {MAX_SCREENSHOT_QUESTIONS} questions, got {}",
                questions.len()
            )));
        }
    }
    Ok(())
}

/// Decodes the data URL of a screenshot state.
pub fn decode_state(state: &Value) -> Result<Screenshot, Problem> {
    let url = match state {
        Value::Object(o) => match o.get("image") {
            Some(Value::String(url)) => url.as_str(),
            _ => {
                return Err(Problem::new(
                    Code::InvalidImage,
                    "'state.image' must be a data URL",
                ))
            }
        },
        _ => {
            return Err(Problem::new(
                Code::InvalidImage,
                "'state' must be {\"image\": data URL}",
            ))
        }
    };
    let (format, payload) = if let Some(p) = url.strip_prefix("data:image/png;base64,") {
        (ImageFormat::Png, p)
    } else if let Some(p) = url.strip_prefix("data:image/jpeg;base64,") {
        (ImageFormat::Jpeg, p)
    } else {
        return Err(Problem::new(
            Code::InvalidImage,
            "'state.image' must be a data:image/png;base64 or data:image/jpeg;base64 URL",
        ));
    };
    if payload.len() / 4 * 3 > MAX_IMAGE_BYTES + 3 {
        return Err(Problem::new(
            Code::InvalidImage,
            format!("the image is larger than {MAX_IMAGE_BYTES} bytes"),
        ));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(payload)
        .map_err(|e| {
            Problem::new(
                Code::InvalidImage,
                format!("the image is not valid base64: {e}"),
            )
        })?;
    if bytes.len() > MAX_IMAGE_BYTES {
        return Err(Problem::new(
            Code::InvalidImage,
            format!("the image is larger than {MAX_IMAGE_BYTES} bytes"),
        ));
    }
    Ok(Screenshot { format, bytes })
}

/// The per-question rules; the problem is `(code, detail)` for the question's list entry.
pub fn check_question(name: &str, question: &Value) -> Result<(), (Code, String)> {
    let place = question_place(name);
    let chars = name.chars().count();
    if chars == 0 || chars > MAX_NAME_CHARS {
        return Err((
            Code::InvalidScreenshotRequest,
            format!("{place}: a question name has 1 to {MAX_NAME_CHARS} characters"),
        ));
    }
    let Value::Object(q) = question else {
        return Ok(()); // the common rules report it
    };
    if let Some(key) = q
        .keys()
        .find(|k| !["type", "instructions", "criteria"].contains(k))
    {
        return Err((
            Code::InvalidScreenshotRequest,
            format!("{place}: unknown field {key:?} (screenshot questions have only 'type', 'instructions' and 'criteria')"),
        ));
    }
    if let Some(Value::Object(criteria)) = q.get("criteria") {
        if let Some(key) = criteria
            .keys()
            .find(|k| k.is_empty() || k.chars().count() > MAX_NAME_CHARS)
        {
            return Err((
                Code::InvalidScreenshotRequest,
                format!("{place}: option key {key:?} must have 1 to {MAX_NAME_CHARS} characters"),
            ));
        }
    }
    Ok(())
}

/// The text rules on a question's goal and labels (as they enter the prompt).
pub fn check_text<S: AsRef<str>>(
    name: &str,
    goal: &str,
    labels: &[S],
) -> Result<(), (Code, String)> {
    let place = question_place(name);
    let total: usize = goal.chars().count()
        + labels
            .iter()
            .map(|l| l.as_ref().chars().count())
            .sum::<usize>();
    if total > MAX_TEXT_CHARS {
        return Err((
            Code::InvalidScreenshotRequest,
            format!("{place}: goal and labels have {total} characters, over {MAX_TEXT_CHARS}"),
        ));
    }
    for text in std::iter::once(goal).chain(labels.iter().map(|l| l.as_ref())) {
        if let Some(token) = VISION_CONTROL_TOKENS.iter().find(|t| text.contains(*t)) {
            return Err((
                Code::InvalidScreenshotRequest,
                format!("{place}: the text must not contain {token}"),
            ));
        }
    }
    Ok(())
}
