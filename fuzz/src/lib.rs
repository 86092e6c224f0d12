//! Fuzz targets: one function per target, each taking arbitrary bytes and asserting the target's
//! invariants (a broken invariant panics). `fuzz/afl` drives them coverage-guided with AFL++;
//! `tests/corpus.rs` replays the committed corpus and the regression inputs under `cargo test`.
//!
//! The Qwen3.5 tokenizer needs the public vocabulary (`tools/fetch-qwen-vocab.sh`, or
//! `$INSTINCT_QWEN_VOCAB`), as the model's tokenizer tests do.

use std::collections::HashSet;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll, Waker};

use hyper::body::Body as _;
use hyper::header::CONTENT_TYPE;
use instinct::contract::{self, Request, MAX_OPTIONS, MAX_PROMPT_TOKENS, MAX_QUESTIONS};
use instinct::engine::Preparer;
use instinct::problem::{self, question_place, Code, InvalidQuestion, Problem, TYPE_BASE};
use instinct::screenshot::{MAX_IMAGE_BYTES, MAX_SCREENSHOT_QUESTIONS};
use instinct::server::{self, problem_response, Settings};
use instinct_model::chat::{py_strip, render_builtin, render_builtin_with_image, ChatTemplate};
use instinct_model::image::{
    decode_rgb, inspect, preprocess_rgb, ImageError, ImageFormat, ImageLimits, MAX_PIXELS,
    PATCH_SIZE, PATCH_VALUES, RESIZE_FACTOR,
};
use instinct_model::prompt::SYSTEM_PROMPT;
use instinct_model::pyjson;
use instinct_model::tokenizer::{build_qwen35_tokenizer, Tokenizer};
use instinct_scheduler::Question;
use strum::VariantArray;
use unicode_normalization_alignments::UnicodeNormalization;

/// A fuzz target: arbitrary bytes in, a panic when an invariant breaks.
pub type Target = fn(&[u8]);

/// Every target by name: the corpus directory `fuzz/corpus/<name>/` and the AFL binary share it.
pub const TARGETS: &[(&str, Target)] = &[
    ("request_body", request_body),
    ("image", image),
    ("chat_template", chat_template),
    ("tokenizer", tokenizer),
    ("problem_body", problem_body),
];

/// The target called `name`.
pub fn target(name: &str) -> Option<Target> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|&(_, f)| f)
}

/// The model name requests are validated against.
pub const SERVED_MODEL: &str = "cua-s1-4b-0.2";

/// Builds the shared tokenizer and templates, so an AFL fork server starts after the slow part.
pub fn init() {
    qwen_tokenizer();
    vocab_size();
    templates();
    preparers();
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The Qwen3.5 tokenizer as a server loads it (its `tokenizer.json` text read back), so the fast
/// encode path is the one serving runs.
pub fn qwen_tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let path =
            instinct_model::checkout::qwen_vocab(&repo_root()).unwrap_or_else(|e| panic!("{e}"));
        let built = build_qwen35_tokenizer(&path).expect("building the Qwen3.5 tokenizer");
        let json = built.to_string(false).expect("tokenizer.json text");
        let inner: tokenizers::Tokenizer = json.parse().expect("reading tokenizer.json back");
        let tokenizer = Tokenizer::new(inner).expect("the Qwen3.5 tokenizer");
        assert!(
            tokenizer.uses_fast_path(),
            "the Qwen3.5 pipeline runs the fast path"
        );
        tokenizer
    })
}

/// The tokenizer's vocabulary size, added tokens included (`tokenizers` copies the whole
/// vocabulary to count it, which would dominate a run).
fn vocab_size() -> usize {
    static SIZE: OnceLock<usize> = OnceLock::new();
    *SIZE.get_or_init(|| qwen_tokenizer().vocab_size())
}

/// The Jinja chat templates in the repository, each meant to render Cua-S1 prompts exactly as
/// the built-in rendering does.
pub fn templates() -> &'static [(&'static str, ChatTemplate)] {
    static TEMPLATES: OnceLock<Vec<(&'static str, ChatTemplate)>> = OnceLock::new();
    TEMPLATES.get_or_init(compile_templates)
}

fn compile_templates() -> Vec<(&'static str, ChatTemplate)> {
    [
        (
            "model/tests/data/qwen35_like_chat_template.jinja",
            include_str!("../../model/tests/data/qwen35_like_chat_template.jinja"),
        ),
        (
            "model/assets/tiny/chat_template.jinja",
            include_str!("../../model/assets/tiny/chat_template.jinja"),
        ),
    ]
    .into_iter()
    .map(|(name, source)| {
        let template = ChatTemplate::from_jinja(source)
            .unwrap_or_else(|e| panic!("{name} does not compile: {e:#}"));
        (name, template)
    })
    .collect()
}

/// Text-only preparers as a server builds them, one with the built-in rendering first, then
/// one per Jinja template.
pub fn preparers() -> &'static [(&'static str, Preparer)] {
    static PREPARERS: OnceLock<Vec<(&'static str, Preparer)>> = OnceLock::new();
    PREPARERS.get_or_init(|| {
        let tokenizer = qwen_tokenizer();
        std::iter::once(("built-in", ChatTemplate::builtin()))
            .chain(compile_templates())
            .map(|(name, chat)| (name, Preparer::text_only(tokenizer.clone(), chat)))
            .collect()
    })
}

/// Codes request parsing and validation may answer with: all 4xx, never a server error.
const REQUEST_CODES: &[Code] = &[
    Code::InvalidJson,
    Code::BodyNotObject,
    Code::TooManyQuestions,
    Code::UnknownModel,
    Code::InvalidPromptFormat,
    Code::InvalidState,
    Code::InvalidQuestions,
    Code::InvalidQuestion,
    Code::UnsupportedQuestionType,
    Code::UnknownQuestionType,
    Code::MissingInstructions,
    Code::InvalidInstructions,
    Code::InvalidCriteria,
    Code::InvalidOption,
    Code::UnsupportedModality,
    Code::InvalidImage,
    Code::InvalidScreenshotRequest,
];

/// The request body as a text-only server prepares it (`server::prepare`: validation, chat
/// rendering, tokenization, prompt limit) under the built-in rendering and each Jinja template,
/// then as a screenshot server validates it; and strict JSON against `serde_json`.
///
/// Invariants: nothing panics; `pyjson` accepts exactly what `serde_json` accepts except
/// repeated keys, and `dumps` round-trips; a refused body gets a well-formed problem whose code
/// is a request code (4xx; `invalid_json` when the body is not JSON), the same under every
/// template; an accepted one has 1 to 64 uniquely named questions of 1 to 26 unique options,
/// renders the same chat under every template, and its prepared ids are the fast path's and
/// Hugging Face `encode`'s alike, within the prompt limit; an accepted screenshot request has
/// exactly one image placeholder token per question.
pub fn request_body(data: &[u8]) {
    let parsed = json_parsers_agree(data);
    let settings = Settings::new(SERVED_MODEL, "fuzz");
    let [(_, builtin), jinja @ ..] = preparers() else {
        unreachable!("the built-in preparer comes first")
    };
    let prepared = server::prepare(&settings, builtin, data);
    let summary = |outcome: &Result<(Request, Vec<_>), Problem>| match outcome {
        Ok((request, questions)) => Ok((
            request.clone(),
            questions
                .iter()
                .map(|q: &Question| (q.ids.clone(), q.n_options))
                .collect::<Vec<_>>(),
        )),
        Err(problem) => Err(problem.clone()),
    };
    let expected = summary(&prepared);
    for (name, preparer) in jinja {
        let other = summary(&server::prepare(&settings, preparer, data));
        assert!(other == expected, "prepare differs under {name}");
    }
    match expected {
        Err(problem) => check_refusal(&problem, parsed, Some(Code::PromptTooLong)),
        Ok((request, questions)) => {
            assert!(parsed, "a body that is not JSON was accepted");
            assert_eq!(questions.len(), request.questions.len());
            let ids = check_request(&request, false);
            for ((prepared_ids, n_options), (question, ids)) in
                questions.iter().zip(request.questions.iter().zip(ids))
            {
                assert_eq!(*n_options, question.option_keys.len());
                assert_eq!(prepared_ids, &ids);
                assert!(ids.len() <= MAX_PROMPT_TOKENS);
            }
        }
    }
    match contract::parse_request_with(data, SERVED_MODEL, true) {
        Err(problem) => check_refusal(&problem, parsed, None),
        Ok(request) => {
            assert!(parsed, "a body that is not JSON was accepted");
            check_request(&request, true);
        }
    }
}

/// A refused request: a well-formed problem with a request code (or `extra`).
fn check_refusal(problem: &Problem, parsed: bool, extra: Option<Code>) {
    check_problem(problem);
    assert!(
        REQUEST_CODES.contains(&problem.code) || Some(problem.code) == extra,
        "a request is refused with {problem}"
    );
    if !parsed {
        assert_eq!(
            problem.code,
            Code::InvalidJson,
            "a body that is not JSON is refused with {problem}"
        );
    }
}

/// Whether `data` is strict JSON; asserts both parsers agree on it.
fn json_parsers_agree(data: &[u8]) -> bool {
    let ours = pyjson::parse(data);
    let reference = serde_json::from_slice::<serde_json::Value>(data);
    match (&ours, &reference) {
        (Ok(_), Err(e)) => panic!("pyjson accepts what serde_json refuses: {e}"),
        (Err(e), Ok(_)) => assert!(
            e.message.starts_with("duplicate key"),
            "pyjson refuses what serde_json accepts: {e}"
        ),
        _ => {}
    }
    let Ok(value) = ours else { return false };
    let dumped = pyjson::dumps(&value);
    assert_eq!(
        pyjson::parse(dumped.as_bytes()).as_ref(),
        Ok(&value),
        "dumps does not round-trip: {dumped}"
    );
    true
}

/// Checks an accepted request; returns each question's ids (fast path, equal to the reference).
fn check_request(request: &Request, screenshots: bool) -> Vec<Vec<u32>> {
    assert_eq!(request.model, SERVED_MODEL);
    let n = request.questions.len();
    assert!((1..=MAX_QUESTIONS).contains(&n), "{n} questions");
    let names: HashSet<&str> = request.questions.iter().map(|q| q.name.as_str()).collect();
    assert_eq!(names.len(), n, "question names repeat");
    if let Some(image) = &request.image {
        assert!(
            screenshots,
            "a screenshot request passed a text-only server"
        );
        assert!(n <= MAX_SCREENSHOT_QUESTIONS);
        assert!(image.bytes.len() <= MAX_IMAGE_BYTES);
        // The header check before decoding: a refusal, never a panic.
        if let Err(e) = ImageLimits::SERVING.check(&image.bytes, image.format.mime()) {
            assert!(!e.to_string().is_empty());
        }
    }
    let tokenizer = qwen_tokenizer();
    let image_pad = tokenizer.markers().image_pad.expect("<|image_pad|> id");
    let mut all_ids = Vec::with_capacity(n);
    for question in &request.questions {
        let k = question.option_keys.len();
        assert!((1..=MAX_OPTIONS).contains(&k), "{k} options");
        let keys: HashSet<&str> = question.option_keys.iter().map(String::as_str).collect();
        assert_eq!(keys.len(), k, "option keys repeat");

        let chat = match request.image {
            None => render_all(|t| t.render(SYSTEM_PROMPT, &question.user)),
            Some(_) => render_all(|t| t.render_with_image(SYSTEM_PROMPT, &question.user)),
        };
        assert!(chat.contains(py_strip(&question.user)), "{chat:?}");
        let ids = tokenizer.encode(&chat).expect("a rendered chat tokenizes");
        assert_eq!(
            ids,
            tokenizer.encode_reference(&chat).expect("reference encode"),
            "fast path and Hugging Face encode differ on {chat:?}"
        );
        if request.image.is_some() {
            // Vision control text is refused in screenshot questions: the one image placeholder
            // is the template's.
            let pads = ids.iter().filter(|&&id| id == image_pad).count();
            assert_eq!(pads, 1, "image placeholders in {chat:?}");
        }
        all_ids.push(ids);
    }
    all_ids
}

/// The built-in rendering, asserting every Jinja template renders the same string.
fn render_all(render: impl Fn(&ChatTemplate) -> anyhow::Result<String>) -> String {
    let builtin = render(&ChatTemplate::builtin()).expect("the built-in rendering cannot fail");
    assert!(builtin.starts_with("<|im_start|>system\n"), "{builtin:?}");
    assert!(
        builtin.ends_with("<|im_end|>\n<|im_start|>assistant\n<think>\n"),
        "{builtin:?}"
    );
    for (name, template) in templates() {
        let jinja = render(template).unwrap_or_else(|e| panic!("{name} fails: {e:#}"));
        assert_eq!(
            jinja, builtin,
            "{name} renders differently from the built-in rendering"
        );
    }
    builtin
}

/// A screenshot file: the header check, then (when it passes) decoding under the serving limits
/// and, for images up to 256x256 px, the rest of preprocessing.
///
/// Invariants: nothing panics; the header's format is the magic bytes' format; an image that
/// passes the check is within every serving limit; the decoder agrees with the header on the
/// size and yields exactly width x height RGB pixels; preprocessing gives sides that are
/// multiples of 32, within the pixel budget, and as many finite patch values as the grid says.
pub fn image(data: &[u8]) {
    let detected = ImageFormat::detect(data);
    let inspected = inspect(data);
    match &inspected {
        Ok(info) => assert_eq!(Some(info.format), detected),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
    let limits = ImageLimits::SERVING;
    for declared in [ImageFormat::Png, ImageFormat::Jpeg] {
        let checked = limits.check(data, declared.mime());
        if let Ok(info) = &inspected {
            if info.format != declared && data.len() <= limits.max_bytes {
                assert!(
                    matches!(checked, Err(ImageError::MimeMismatch { .. })),
                    "{checked:?}"
                );
            }
        }
    }
    let mime = detected.unwrap_or(ImageFormat::Png).mime();
    let Ok(info) = limits.check(data, mime) else {
        return;
    };
    let (w, h) = (info.width, info.height);
    assert!(w >= 1 && h >= 1 && w <= limits.max_side && h <= limits.max_side);
    assert!(u64::from(w) * u64::from(h) <= limits.max_pixels);
    assert!(w.max(h) <= w.min(h) * limits.max_aspect_ratio);
    assert!(info.frames == 1 && !info.animated);
    let rgb = match decode_rgb(data, &info, &limits) {
        Ok(rgb) => rgb,
        Err(ImageError::Decode(message)) => {
            assert!(
                !message.contains("differs from the header"),
                "the header check and the decoder disagree: {message}"
            );
            return;
        }
        Err(_) => return,
    };
    assert_eq!((rgb.width, rgb.height), (w, h));
    assert_eq!(rgb.pixels.len(), w as usize * h as usize * 3);
    // Larger images only cost time here: smart_resize scales every image to at least 256x256.
    if u64::from(w) * u64::from(h) > 65_536 {
        return;
    }
    let pre = preprocess_rgb(rgb).expect("a decoded image within the limits preprocesses");
    let (rw, rh) = pre.resized;
    assert!(rw % RESIZE_FACTOR == 0 && rh % RESIZE_FACTOR == 0 && rw > 0 && rh > 0);
    assert!(u64::from(rw) * u64::from(rh) <= MAX_PIXELS);
    let patch = PATCH_SIZE as u32;
    assert_eq!(pre.grid_thw, [1, rh / patch, rw / patch]);
    assert_eq!((pre.image.width, pre.image.height), (rw, rh));
    let values = pre.pixel_values();
    assert_eq!(
        values.len(),
        (rh / patch) as usize * (rw / patch) as usize * PATCH_VALUES
    );
    assert!(values.iter().all(|v| v.is_finite()));
}

/// Splits the input as UTF-8 (invalid bytes become U+FFFD) at its first NUL into the system and
/// user messages; without a NUL the system message is the Cua-S1 one.
fn messages(text: &str) -> (&str, &str) {
    text.split_once('\0').unwrap_or((SYSTEM_PROMPT, text))
}

/// Chat rendering of arbitrary system and user text, plain and with an image item.
///
/// Invariants: both Jinja templates render exactly what the built-in rendering gives (which
/// is what the fixtures' chats are), with and without the image item; the built-in rendering
/// holds the stripped messages between the turn markers.
pub fn chat_template(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let (system, user) = messages(&text);
    let chat = render_all(|t| t.render(system, user));
    assert_eq!(
        chat,
        format!(
            "<|im_start|>system\n{}<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n<think>\n",
            py_strip(system),
            py_strip(user)
        )
    );
    let with_image = render_all(|t| t.render_with_image(system, user));
    assert_eq!(with_image, render_builtin_with_image(system, user));
    assert_eq!(chat, render_builtin(system, user));
}

/// The Qwen3.5 tokenizer on arbitrary UTF-8 (invalid bytes become U+FFFD).
///
/// Invariants: the fast encode path gives exactly Hugging Face `encode`'s ids, twice (with its
/// piece cache cold and warm); every id is in the vocabulary; decoding gives the text back up
/// to NFC (the pipeline normalizes to NFC).
pub fn tokenizer(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let tokenizer = qwen_tokenizer();
    let ids = tokenizer.encode(&text).expect("encode");
    let reference = tokenizer.encode_reference(&text).expect("reference encode");
    assert_eq!(ids, reference, "fast path and Hugging Face encode differ");
    assert_eq!(tokenizer.encode(&text).expect("encode"), ids, "warm cache");
    let vocab = vocab_size();
    assert!(ids.iter().all(|&id| (id as usize) < vocab), "{ids:?}");
    let decoded = tokenizer.decode(&ids).expect("decode");
    assert_eq!(
        nfc(&decoded),
        nfc(&text),
        "decode(encode(text)) is not the text"
    );
}

fn nfc(text: &str) -> String {
    text.nfc().map(|(c, _)| c).collect()
}

/// Problem bodies built from arbitrary text by every constructor that takes caller text.
///
/// The first byte picks the constructor (and the code for `Problem::new`); the rest, as UTF-8,
/// split at NULs, gives its strings. Invariants: see [`check_problem`]; the problem keeps the
/// caller's text exactly; `question_place` quotes the name as JSON that reads back as the name.
pub fn problem_body(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let parts: Vec<&str> = text.split('\0').collect();
    let part = |i: usize| parts.get(i).copied().unwrap_or("");
    let problem = match selector % 10 {
        0 => {
            let code = Code::VARIANTS[usize::from(selector / 10) % Code::VARIANTS.len()];
            let problem = Problem::new(code, part(0));
            assert_eq!(problem.detail, part(0));
            problem
        }
        1 => Problem::invalid_json(part(0)),
        2 => Problem::unreadable_body(part(0)),
        3 => Problem::not_found(part(0)),
        4 => Problem::method_not_allowed(part(0), part(1)),
        5 => Problem::unsupported_media_type(part(0)),
        6 => Problem::too_many_questions(rest.len()),
        7 => {
            let over: Vec<(&str, usize)> = parts.iter().map(|name| (*name, name.len())).collect();
            let problem = Problem::prompts_too_long(&over, MAX_PROMPT_TOKENS)
                .expect("split gives at least one part");
            assert_eq!(problem.invalid_questions.len(), parts.len());
            problem
        }
        8 => {
            let invalid: Vec<InvalidQuestion> = parts
                .chunks(2)
                .enumerate()
                .map(|(i, pair)| InvalidQuestion {
                    question: pair[0].to_string(),
                    code: REQUEST_CODES[i % REQUEST_CODES.len()],
                    detail: pair.get(1).copied().unwrap_or("").to_string(),
                })
                .collect();
            Problem::questions(invalid.clone()).expect("at least one question")
        }
        _ => {
            let place = question_place(part(0));
            let quoted = place.strip_prefix("question ").expect("question prefix");
            let name: String = serde_json::from_str(quoted).expect("the name is quoted as JSON");
            assert_eq!(name, part(0));
            Problem::new(Code::InvalidQuestion, place)
        }
    };
    check_problem(&problem);
}

/// A problem's body and HTTP response: the body is a JSON object of exactly the RFC 9457 fields
/// plus `code` (and `invalid_questions` when there are any), each equal to the problem's own
/// values; `type` is the code's URN; the code's serialized name is its stable `as_str`, in
/// snake_case; the status is the code's, an error status; the response carries that status,
/// the problem media type and the body.
pub fn check_problem(problem: &Problem) {
    let code = problem.code.as_str();
    assert!(
        !code.is_empty() && code.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
        "{code:?}"
    );
    assert_eq!(serde_json::to_value(problem.code).expect("code"), code);
    assert_eq!(problem.status, problem.code.status());
    assert!((400..600).contains(&problem.status), "{problem}");
    assert!(!problem.code.title().is_empty());

    let body = problem.to_json();
    let value: serde_json::Value = serde_json::from_slice(&body).expect("the body is JSON");
    let object = value.as_object().expect("the body is an object");
    let expected_keys = if problem.invalid_questions.is_empty() {
        5
    } else {
        6
    };
    assert_eq!(object.len(), expected_keys, "{value}");
    assert_eq!(object["type"], format!("{TYPE_BASE}{code}"));
    assert_eq!(object["title"], problem.code.title());
    assert_eq!(object["status"], problem.status);
    assert_eq!(object["detail"], problem.detail.as_str());
    assert_eq!(object["code"], code);
    if !problem.invalid_questions.is_empty() {
        let listed = object["invalid_questions"].as_array().expect("a list");
        assert_eq!(listed.len(), problem.invalid_questions.len());
        for (entry, question) in listed.iter().zip(&problem.invalid_questions) {
            assert_eq!(entry["question"], question.question.as_str());
            assert_eq!(entry["code"], question.code.as_str());
            assert_eq!(entry["detail"], question.detail.as_str());
        }
    }

    let mut response = problem_response(problem);
    assert_eq!(response.status().as_u16(), problem.status);
    assert_eq!(
        response.headers().get(CONTENT_TYPE).map(|v| v.as_bytes()),
        Some(problem::CONTENT_TYPE.as_bytes())
    );
    // A full body is ready at once: one poll gives its only frame.
    let frame = Pin::new(response.body_mut()).poll_frame(&mut Context::from_waker(Waker::noop()));
    let Poll::Ready(Some(Ok(frame))) = frame else {
        panic!("the response body is not ready");
    };
    let sent = frame.into_data().expect("a data frame");
    assert_eq!(&sent[..], &body[..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The invariants are live: a problem whose parts disagree is caught.
    #[test]
    #[should_panic(expected = "assertion")]
    fn a_problem_with_the_wrong_status_fails_the_check() {
        let mut problem = Problem::new(Code::InvalidState, "x");
        problem.status = 500;
        check_problem(&problem);
    }

    #[test]
    #[should_panic(expected = "a request is refused with")]
    fn a_request_refused_as_a_server_error_fails_the_check() {
        check_refusal(&Problem::inference_failed(), true, None);
    }

    #[test]
    #[should_panic(expected = "is not JSON")]
    fn a_non_json_body_refused_with_another_code_fails_the_check() {
        check_refusal(&Problem::new(Code::InvalidState, "x"), false, None);
    }

    #[test]
    fn every_code_is_listed_once() {
        let unique: HashSet<&str> = Code::VARIANTS.iter().map(|c| c.as_str()).collect();
        assert_eq!(unique.len(), Code::VARIANTS.len());
        assert!(REQUEST_CODES.iter().all(|c| Code::VARIANTS.contains(c)));
    }

    #[test]
    fn targets_take_empty_and_odd_input() {
        for (_, target) in TARGETS {
            target(b"");
            target(b"\xff\x00\xfe");
        }
    }
}
