//! Error answers as RFC 9457 problem details (`application/problem+json`).
//!
//! Every problem has a stable snake_case `code`; its `type` is the URI
//! `urn:instinct:problem:<code>` (an identifier: clients match on it or on `code`, and
//! must not expect to fetch it). `title` is a short fixed summary of the code, `detail` the
//! specific message, worded as System1-Omni words it wherever System1-Omni has the same error,
//! so clients that only read `detail` see what they saw upstream. Problems about single
//! questions also list every such question in `invalid_questions`, not just the first one.

use serde::Serialize;

/// The media type of a problem body.
pub const CONTENT_TYPE: &str = "application/problem+json";

/// The prefix of every problem `type` URI; the code follows it.
pub const TYPE_BASE: &str = "urn:instinct:problem:";

/// What went wrong, one value per rule; each has a fixed HTTP status and title. `Code::VARIANTS`
/// lists them all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, strum::VariantArray)]
#[serde(rename_all = "snake_case")]
pub enum Code {
    /// 400: the body is not strict JSON (syntax, UTF-8, BOM, NaN, range, surrogate, duplicate
    /// key, nesting).
    InvalidJson,
    /// 400: valid JSON whose top level is not an object.
    BodyNotObject,
    /// 400: the request's framing is ambiguous (`Content-Length` with `Transfer-Encoding`, a
    /// transfer coding other than `chunked`) or its body broke off or is malformed; the
    /// connection is closed.
    InvalidFraming,
    /// 408: the request body did not arrive within `--body-timeout-ms`; the connection is closed.
    BodyTimeout,
    /// 431: the request head is over `--max-header-bytes` or `--max-headers`; the connection is
    /// closed.
    HeadersTooLarge,
    /// 413: the body is over the byte limit.
    BodyTooLarge,
    /// 413: more questions than the limit.
    TooManyQuestions,
    /// 413: a question's prompt has more tokens than the limit.
    PromptTooLong,
    /// 422: `model` names a model this server does not serve.
    UnknownModel,
    /// 422: `prompt_format` is not a known format.
    InvalidPromptFormat,
    /// 422: `state` is missing, empty, or of a wrong type or shape.
    InvalidState,
    /// 422: `questions` is not a non-empty object.
    InvalidQuestions,
    /// 422: a question is not an object.
    InvalidQuestion,
    /// 422: a question type the model does not answer (`score`, `noul`).
    UnsupportedQuestionType,
    /// 422: a question type that does not exist, or none.
    UnknownQuestionType,
    /// 422: a question without the `instructions` key.
    MissingInstructions,
    /// 422: `instructions` of a wrong type.
    InvalidInstructions,
    /// 422: `criteria` is not an object with 1 to 26 options.
    InvalidCriteria,
    /// 422: one option of `criteria` has a wrong type or shape.
    InvalidOption,
    /// 500: the model failed (no internal detail is given out).
    InferenceFailed,
    /// 422: a kind of input this build does not serve (screenshot state).
    UnsupportedModality,
    /// 422: the screenshot is not a valid PNG/JPEG data URL, or breaks an image limit.
    InvalidImage,
    /// 422: a screenshot request breaks one of its own rules (fields, question count, names,
    /// text length, vision control tokens).
    InvalidScreenshotRequest,
    /// 404: no such route.
    NotFound,
    /// 405: the route exists but not for this method.
    MethodNotAllowed,
    /// 415: the body is declared as something other than JSON.
    UnsupportedMediaType,
    /// 401: a bearer token is required and was missing or wrong.
    Unauthorized,
    /// 503: the model is still loading or warming up.
    NotReady,
    /// 503: the admission queue is full; retry after `Retry-After` seconds.
    Overloaded,
    /// 503: the server is shutting down and admits no new work.
    Draining,
    /// 503: the request waited in the queue past its deadline.
    DeadlineExceeded,
    /// 503: `--max-connections` connections are open; this one is answered and closed.
    TooManyConnections,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::InvalidJson => "invalid_json",
            Code::BodyNotObject => "body_not_object",
            Code::InvalidFraming => "invalid_framing",
            Code::BodyTimeout => "body_timeout",
            Code::HeadersTooLarge => "headers_too_large",
            Code::BodyTooLarge => "body_too_large",
            Code::TooManyQuestions => "too_many_questions",
            Code::PromptTooLong => "prompt_too_long",
            Code::UnknownModel => "unknown_model",
            Code::InvalidPromptFormat => "invalid_prompt_format",
            Code::InvalidState => "invalid_state",
            Code::InvalidQuestions => "invalid_questions",
            Code::InvalidQuestion => "invalid_question",
            Code::UnsupportedQuestionType => "unsupported_question_type",
            Code::UnknownQuestionType => "unknown_question_type",
            Code::MissingInstructions => "missing_instructions",
            Code::InvalidInstructions => "invalid_instructions",
            Code::InvalidCriteria => "invalid_criteria",
            Code::InvalidOption => "invalid_option",
            Code::InferenceFailed => "inference_failed",
            Code::UnsupportedModality => "unsupported_modality",
            Code::InvalidImage => "invalid_image",
            Code::InvalidScreenshotRequest => "invalid_screenshot_request",
            Code::NotFound => "not_found",
            Code::MethodNotAllowed => "method_not_allowed",
            Code::UnsupportedMediaType => "unsupported_media_type",
            Code::Unauthorized => "unauthorized",
            Code::NotReady => "not_ready",
            Code::Overloaded => "overloaded",
            Code::Draining => "draining",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::TooManyConnections => "too_many_connections",
        }
    }

    pub fn status(self) -> u16 {
        match self {
            Code::InvalidJson | Code::BodyNotObject | Code::InvalidFraming => 400,
            Code::BodyTimeout => 408,
            Code::HeadersTooLarge => 431,
            Code::BodyTooLarge | Code::TooManyQuestions | Code::PromptTooLong => 413,
            Code::InferenceFailed => 500,
            Code::NotFound => 404,
            Code::MethodNotAllowed => 405,
            Code::UnsupportedMediaType => 415,
            Code::Unauthorized => 401,
            Code::NotReady | Code::Overloaded | Code::Draining | Code::DeadlineExceeded => 503,
            // One line per arm: tests/openapi.rs reads these arms.
            Code::TooManyConnections => 503,
            _ => 422,
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Code::InvalidJson => "Request body is not valid JSON",
            Code::BodyNotObject => "Request body is not a JSON object",
            Code::InvalidFraming => "Invalid request framing",
            Code::BodyTimeout => "Request body timeout",
            Code::HeadersTooLarge => "Request header fields too large",
            Code::BodyTooLarge => "Request body too large",
            Code::TooManyQuestions => "Too many questions",
            Code::PromptTooLong => "Prompt too long",
            Code::UnknownModel => "Unknown model",
            Code::InvalidPromptFormat => "Invalid prompt format",
            Code::InvalidState => "Invalid state",
            Code::InvalidQuestions => "Invalid questions",
            Code::InvalidQuestion => "Invalid question",
            Code::UnsupportedQuestionType => "Unsupported question type",
            Code::UnknownQuestionType => "Unknown question type",
            Code::MissingInstructions => "Missing instructions",
            Code::InvalidInstructions => "Invalid instructions",
            Code::InvalidCriteria => "Invalid criteria",
            Code::InvalidOption => "Invalid option",
            Code::InferenceFailed => "Inference failed",
            Code::UnsupportedModality => "Unsupported modality",
            Code::InvalidImage => "Invalid image",
            Code::InvalidScreenshotRequest => "Invalid screenshot request",
            Code::NotFound => "Not found",
            Code::MethodNotAllowed => "Method not allowed",
            Code::UnsupportedMediaType => "Unsupported media type",
            Code::Unauthorized => "Unauthorized",
            Code::NotReady => "Not ready",
            Code::Overloaded => "Overloaded",
            Code::Draining => "Draining",
            Code::DeadlineExceeded => "Deadline exceeded",
            Code::TooManyConnections => "Too many connections",
        }
    }
}

/// One invalid question of a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InvalidQuestion {
    /// The question's name, as the request gave it.
    pub question: String,
    pub code: Code,
    pub detail: String,
}

/// An RFC 9457 problem body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    #[serde(rename = "type")]
    pub type_uri: String,
    pub title: &'static str,
    pub status: u16,
    pub detail: String,
    pub code: Code,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub invalid_questions: Vec<InvalidQuestion>,
    /// The request's id (its `X-Request-Id` header), so a client can quote it when reporting a
    /// failure; set by the server when it answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

impl Problem {
    pub fn new(code: Code, detail: impl Into<String>) -> Problem {
        Problem {
            type_uri: format!("{TYPE_BASE}{}", code.as_str()),
            title: code.title(),
            status: code.status(),
            detail: detail.into(),
            code,
            invalid_questions: Vec::new(),
            request_id: None,
        }
    }

    /// A problem about questions: `detail` and `code` are the first question's (as upstream,
    /// which stops at the first), and every one is listed.
    pub fn questions(invalid: Vec<InvalidQuestion>) -> Option<Problem> {
        let first = invalid.first()?;
        let mut problem = Problem::new(first.code, first.detail.clone());
        problem.invalid_questions = invalid;
        Some(problem)
    }

    /// 400 for a body that is not strict JSON; `error` is the parser's message.
    pub fn invalid_json(error: impl std::fmt::Display) -> Problem {
        Problem::new(
            Code::InvalidJson,
            format!("request body is not valid JSON: {error}"),
        )
    }

    /// 400 for a JSON body whose top level is not an object.
    pub fn body_not_object() -> Problem {
        Problem::new(Code::BodyNotObject, "request body must be a JSON object")
    }

    /// 413 for a body over the byte limit (the HTTP layer enforces it).
    pub fn body_too_large() -> Problem {
        Problem::new(Code::BodyTooLarge, "request body too large")
    }

    /// 413 for more than `limit` questions.
    pub fn too_many_questions(limit: usize) -> Problem {
        Problem::new(
            Code::TooManyQuestions,
            format!("more than {limit} questions"),
        )
    }

    /// 413 for the questions whose prompts are over `limit` tokens, given as `(name, tokens)`
    /// in request order; `None` when the list is empty.
    pub fn prompts_too_long(over: &[(&str, usize)], limit: usize) -> Option<Problem> {
        let invalid = over
            .iter()
            .map(|&(name, tokens)| InvalidQuestion {
                question: name.to_string(),
                code: Code::PromptTooLong,
                detail: format!(
                    "{}: {tokens} prompt tokens, over {limit}",
                    question_place(name)
                ),
            })
            .collect();
        Problem::questions(invalid)
    }

    /// 500 for a failed inference; the cause stays in the server's log.
    pub fn inference_failed() -> Problem {
        Problem::new(Code::InferenceFailed, "inference failed")
    }

    /// 404 for a path the server does not have.
    pub fn not_found(path: &str) -> Problem {
        Problem::new(Code::NotFound, format!("unknown route {path}"))
    }

    /// 405 for a route asked with the wrong method.
    pub fn method_not_allowed(method: &str, path: &str) -> Problem {
        Problem::new(
            Code::MethodNotAllowed,
            format!("method {method} is not allowed on {path}"),
        )
    }

    /// 415 for a body declared as something other than JSON.
    pub fn unsupported_media_type(content_type: &str) -> Problem {
        Problem::new(
            Code::UnsupportedMediaType,
            format!("Content-Type must be application/json, got {content_type:?}"),
        )
    }

    /// 400 for a body that could not be read (a malformed chunk, or the connection broke
    /// mid-body).
    pub fn unreadable_body(error: impl std::fmt::Display) -> Problem {
        Problem::new(
            Code::InvalidFraming,
            format!("request body could not be read: {error}"),
        )
    }

    /// 400 for a request whose framing could be read two ways (`why`).
    pub fn ambiguous_framing(why: &str) -> Problem {
        Problem::new(
            Code::InvalidFraming,
            format!("ambiguous request framing: {why}"),
        )
    }

    /// 408 for a body that did not arrive within `timeout`.
    pub fn body_timeout(timeout: std::time::Duration) -> Problem {
        Problem::new(
            Code::BodyTimeout,
            format!(
                "the request body did not arrive within {} ms",
                timeout.as_millis()
            ),
        )
    }

    /// 431 for a head of `bytes` bytes and `headers` header lines, over one of the limits.
    pub fn headers_too_large(
        bytes: usize,
        headers: usize,
        max_bytes: usize,
        max_headers: usize,
    ) -> Problem {
        Problem::new(
            Code::HeadersTooLarge,
            format!(
                "the request head has {bytes} bytes and {headers} header lines; the limits are \
                 {max_bytes} bytes and {max_headers} header lines"
            ),
        )
    }

    /// 401 for a missing or wrong bearer token.
    pub fn unauthorized() -> Problem {
        Problem::new(Code::Unauthorized, "invalid or missing bearer token")
    }

    /// 503 while the model is loading or warming up.
    pub fn not_ready() -> Problem {
        Problem::new(Code::NotReady, "the model is loading; retry shortly")
    }

    /// 503 once every engine is lost to a device failure: this replica is about to exit.
    pub fn no_engine() -> Problem {
        Problem::new(
            Code::NotReady,
            "no engine is left on this replica (its device failed); it is restarting: retry on \
             another replica",
        )
    }

    /// The body, as compact JSON.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_else(|_| {
            // Serializing plain strings and numbers cannot fail; keep a valid body regardless.
            br#"{"type":"about:blank","title":"Internal Server Error","status":500}"#.to_vec()
        })
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status, self.code.as_str(), self.detail)
    }
}

impl std::error::Error for Problem {}

/// How messages name a question: `question "name"`, the name quoted as a JSON string.
pub fn question_place(name: &str) -> String {
    format!("question {}", instinct_model::pyjson::dumps_str(name))
}
