//! Every error class of the contract, table-driven: status, stable code, upstream-worded detail
//! and the list of invalid questions; then the accepted edge cases.

use instinct::contract::{parse_request, PromptFormat, MAX_PROMPT_TOKENS};
use instinct::problem::{Code, Problem, CONTENT_TYPE};

const SERVED: &str = "cua-s1-4b-0.2";

/// A request with `state` and `questions` given as JSON text.
fn body_with(state: &str, questions: &str) -> String {
    format!(r#"{{"model": "cua-s1-4b-0.2", "state": {state}, "questions": {questions}}}"#)
}

/// A request with one question `q` given as JSON text.
fn one(question: &str) -> String {
    body_with(r#""Screen""#, &format!(r#"{{"q": {question}}}"#))
}

/// A valid question with the given criteria (JSON text).
fn choice(criteria: &str) -> String {
    format!(r#"{{"type": "choice", "instructions": "Pick one.", "criteria": {criteria}}}"#)
}

/// `n` valid questions named q0, q1, ...
fn questions(n: usize) -> String {
    let items: Vec<String> = (0..n)
        .map(|i| format!(r#""q{i}": {}"#, choice(r#"{"a": "A"}"#)))
        .collect();
    format!("{{{}}}", items.join(", "))
}

fn options(n: usize) -> String {
    let items: Vec<String> = (0..n).map(|i| format!(r#""o{i}": null"#)).collect();
    format!("{{{}}}", items.join(", "))
}

fn native(state: &str, criteria: &str) -> String {
    format!(
        r#"{{"prompt_format": "cua-s1-native", "state": {state}, "questions": {{"q": {}}}}}"#,
        choice(criteria)
    )
}

const SCREEN: &str = r#"{"app": "gui360_word", "task_family": "form_filling", "accessibility_tree": "- Edit \"Name\""}"#;
const OPTION: &str =
    r#"{"a": {"role": "Edit", "label": "Name", "action": "fill", "entity_id": "ent_0"}}"#;

struct Case {
    name: &'static str,
    body: Vec<u8>,
    status: u16,
    code: Code,
    detail: String,
    /// (question, code, detail) of every listed invalid question.
    invalid: Vec<(&'static str, Code, String)>,
}

fn case(
    name: &'static str,
    body: impl Into<Vec<u8>>,
    status: u16,
    code: Code,
    detail: &str,
) -> Case {
    Case {
        name,
        body: body.into(),
        status,
        code,
        detail: detail.to_string(),
        invalid: Vec::new(),
    }
}

/// A case with one invalid question `q` whose problem is also the request's.
fn question_case(name: &'static str, question: &str, code: Code, detail: &str) -> Case {
    let mut c = case(name, one(question), 422, code, detail);
    c.invalid = vec![("q", code, detail.to_string())];
    c
}

fn cases() -> Vec<Case> {
    let json = "request body is not valid JSON: ";
    let not_text_state = "'state' must be a string, an object or an array";
    let questions_shape = "'questions' must be a non-empty object";
    let criteria_shape = "question \"q\": 'criteria' must be an object with 1 to 26 options";
    let nested = format!(
        r#"{{"state": {{"a": {}1{}}}}}"#,
        "[".repeat(126),
        "]".repeat(126)
    );
    let mut cases = vec![
        // 400: the body is not strict JSON, or not an object.
        case("not json", "not json", 400, Code::InvalidJson, &format!("{json}expected value at line 1 column 1")),
        case("empty body", "", 400, Code::InvalidJson, &format!("{json}EOF while parsing a value at line 1 column 1")),
        case("trailing bytes", "{} x", 400, Code::InvalidJson, &format!("{json}trailing characters at line 1 column 4")),
        case("bom", b"\xef\xbb\xbf{}".to_vec(), 400, Code::InvalidJson, &format!("{json}byte order mark is not allowed at line 1 column 1")),
        case("invalid utf-8", b"{\"state\": \"\xff\xfe\"}".to_vec(), 400, Code::InvalidJson, &format!("{json}invalid UTF-8 at line 1 column 12")),
        case("nan", r#"{"state": NaN}"#, 400, Code::InvalidJson, &format!("{json}expected value at line 1 column 11")),
        case("infinity", r#"{"state": {"x": -Infinity}}"#, 400, Code::InvalidJson, &format!("{json}invalid number at line 1 column 18")),
        case("1e400", r#"{"state": {"x": 1e400}}"#, 400, Code::InvalidJson, &format!("{json}number out of range at line 1 column 17")),
        case("lone surrogate", r#"{"state": "\ud800"}"#, 400, Code::InvalidJson, &format!("{json}lone leading surrogate in hex escape at line 1 column 18")),
        case("duplicate top key", r#"{"state": "a", "state": "b"}"#, 400, Code::InvalidJson, &format!("{json}duplicate key \"state\" at line 1 column 16")),
        case("duplicate nested key", r#"{"state": {"x": 1, "x": 2}}"#, 400, Code::InvalidJson, &format!("{json}duplicate key \"x\" at line 1 column 20")),
        case("nesting 128", nested, 400, Code::InvalidJson, &format!("{json}recursion limit exceeded at line 1 column 142")),
        case("array body", "[1, 2]", 400, Code::BodyNotObject, "request body must be a JSON object"),
        case("string body", r#""{}""#, 400, Code::BodyNotObject, "request body must be a JSON object"),
        case("null body", "null", 400, Code::BodyNotObject, "request body must be a JSON object"),
        // 422: request-level fields, in upstream order.
        case("wrong model", r#"{"model": "english", "state": "S", "questions": {}}"#, 422, Code::UnknownModel, "'model' must be 'cua-s1-4b-0.2'"),
        case("model number", r#"{"model": 1, "state": "S"}"#, 422, Code::UnknownModel, "'model' must be 'cua-s1-4b-0.2'"),
        case("empty string state", body_with(r#""""#, &questions(1)), 422, Code::InvalidState, "'state' must not be empty"),
        case("empty object state", body_with("{}", &questions(1)), 422, Code::InvalidState, "'state' must not be empty"),
        case("empty array state", body_with("[]", &questions(1)), 422, Code::InvalidState, "'state' must not be empty"),
        case("null state", body_with("null", &questions(1)), 422, Code::InvalidState, not_text_state),
        case("number state", body_with("3", &questions(1)), 422, Code::InvalidState, not_text_state),
        case("screenshot state", body_with(r#"{"image": "data:image/png;base64,iVBORw0KGgo="}"#, &questions(1)), 422, Code::UnsupportedModality, "screenshot state ({\"image\": data URL}) is not served by this build yet: it answers accessibility-tree state only"),
        case("bool state", body_with("true", &questions(1)), 422, Code::InvalidState, not_text_state),
        case("missing state", format!(r#"{{"questions": {}}}"#, questions(1)), 422, Code::InvalidState, not_text_state),
        case("missing questions", r#"{"state": "S"}"#, 422, Code::InvalidQuestions, questions_shape),
        case("empty questions", body_with(r#""S""#, "{}"), 422, Code::InvalidQuestions, questions_shape),
        case("array questions", body_with(r#""S""#, r#"[{"type": "choice"}]"#), 422, Code::InvalidQuestions, questions_shape),
        case("string questions", body_with(r#""S""#, r#""q""#), 422, Code::InvalidQuestions, questions_shape),
        case("bad prompt_format", r#"{"prompt_format": "xml", "state": "S", "questions": {"q": {"type": "choice", "instructions": null, "criteria": {"a": null}}}}"#, 422, Code::InvalidPromptFormat, "'prompt_format' must be 'system1-omni' or 'cua-s1-native'"),
        case("null prompt_format", r#"{"prompt_format": null, "state": "S"}"#, 422, Code::InvalidPromptFormat, "'prompt_format' must be 'system1-omni' or 'cua-s1-native'"),
        // 413: too many questions (upstream checks model and state first).
        case("65 questions", body_with(r#""S""#, &questions(65)), 413, Code::TooManyQuestions, "more than 64 questions"),
        case("65 questions, bad model", format!(r#"{{"model": "x", "state": "S", "questions": {}}}"#, questions(65)), 422, Code::UnknownModel, "'model' must be 'cua-s1-4b-0.2'"),
        // 422: one question.
        question_case("question not object", r#"["choice"]"#, Code::InvalidQuestion, "question \"q\" must be an object"),
        question_case("question null", "null", Code::InvalidQuestion, "question \"q\" must be an object"),
        question_case("noul", r#"{"type": "noul", "instructions": null, "criteria": {"a": null}}"#, Code::UnsupportedQuestionType, "question \"q\": type 'noul' is not supported; this model answers 'choice' questions only"),
        question_case("score with list criteria", r#"{"type": "score", "criteria": ["low", "high"]}"#, Code::UnsupportedQuestionType, "question \"q\": type 'score' is not supported; this model answers 'choice' questions only"),
        question_case("unknown type", r#"{"type": "rank", "instructions": null, "criteria": {"a": null}}"#, Code::UnknownQuestionType, "question \"q\": unknown type \"rank\""),
        question_case("missing type", r#"{"instructions": null, "criteria": {"a": null}}"#, Code::UnknownQuestionType, "question \"q\": unknown type null"),
        question_case("number type", r#"{"type": 1, "instructions": null, "criteria": {"a": null}}"#, Code::UnknownQuestionType, "question \"q\": unknown type 1"),
        question_case("Choice is not choice", r#"{"type": "Choice", "instructions": null, "criteria": {"a": null}}"#, Code::UnknownQuestionType, "question \"q\": unknown type \"Choice\""),
        question_case("missing instructions", r#"{"type": "choice", "criteria": {"a": null}}"#, Code::MissingInstructions, "question \"q\": 'instructions' is required"),
        question_case("number instructions", r#"{"type": "choice", "instructions": 1, "criteria": {"a": null}}"#, Code::InvalidInstructions, "question \"q\" must be a string, an object or an array"),
        question_case("bool instructions", r#"{"type": "choice", "instructions": false, "criteria": {"a": null}}"#, Code::InvalidInstructions, "question \"q\" must be a string, an object or an array"),
        question_case("array criteria", &choice(r#"["a", "b"]"#), Code::InvalidCriteria, criteria_shape),
        question_case("empty criteria", &choice("{}"), Code::InvalidCriteria, criteria_shape),
        question_case("null criteria", &choice("null"), Code::InvalidCriteria, criteria_shape),
        question_case("missing criteria", r#"{"type": "choice", "instructions": null}"#, Code::InvalidCriteria, criteria_shape),
        question_case("27 options", &choice(&options(27)), Code::InvalidCriteria, criteria_shape),
        question_case("number option", &choice(r#"{"a": "A", "b": 1}"#), Code::InvalidOption, "question \"q\": \"b\" must be a string, an object or an array"),
        question_case("float option", &choice(r#"{"a": 2.5}"#), Code::InvalidOption, "question \"q\": \"a\" must be a string, an object or an array"),
        question_case("bool option", &choice(r#"{"a": true}"#), Code::InvalidOption, "question \"q\": \"a\" must be a string, an object or an array"),
        // 422: the native format's fields.
        case("native string state", native(r#""tree""#, OPTION), 422, Code::InvalidState, "'state' must be an object with 'app', 'task_family' and 'accessibility_tree' for 'prompt_format' 'cua-s1-native'"),
        case("native empty state", native("{}", OPTION), 422, Code::InvalidState, "'state' must not be empty"),
        case("native missing app", native(r#"{"task_family": "f", "accessibility_tree": "t"}"#, OPTION), 422, Code::InvalidState, "'state': 'app' must be a non-empty string"),
        case("native empty family", native(r#"{"app": "a", "task_family": "", "accessibility_tree": "t"}"#, OPTION), 422, Code::InvalidState, "'state': 'task_family' must be a non-empty string"),
        case("native object tree", native(r#"{"app": "a", "task_family": "f", "accessibility_tree": {"x": 1}}"#, OPTION), 422, Code::InvalidState, "'state': 'accessibility_tree' must be a non-empty string"),
        case("native unknown state field", native(r#"{"app": "a", "task_family": "f", "ax_tree": "t"}"#, OPTION), 422, Code::InvalidState, "'state': unknown field \"ax_tree\""),
    ];
    let native_option = |name: &'static str, criteria: &str, detail: &str| {
        let mut c = case(
            name,
            native(SCREEN, criteria),
            422,
            Code::InvalidOption,
            detail,
        );
        c.invalid = vec![("q", Code::InvalidOption, detail.to_string())];
        c
    };
    cases.extend([
        native_option(
            "native null option",
            r#"{"a": null}"#,
            "question \"q\": option \"a\" must be an object with 'role', 'label' and 'action'",
        ),
        native_option(
            "native string option",
            r#"{"a": "Name"}"#,
            "question \"q\": option \"a\" must be an object with 'role', 'label' and 'action'",
        ),
        native_option(
            "native missing role",
            r#"{"a": {"label": "x", "action": "click"}}"#,
            "question \"q\": option \"a\": 'role' must be a non-empty string",
        ),
        native_option(
            "native number label",
            r#"{"a": {"role": "Button", "label": 1, "action": "click"}}"#,
            "question \"q\": option \"a\": 'label' must be a string",
        ),
        native_option(
            "native missing label",
            r#"{"a": {"role": "Button", "action": "click"}}"#,
            "question \"q\": option \"a\": 'label' must be a string",
        ),
        native_option(
            "native empty action",
            r#"{"a": {"role": "Button", "label": "x", "action": ""}}"#,
            "question \"q\": option \"a\": 'action' must be a non-empty string",
        ),
        native_option(
            "native number entity",
            r#"{"a": {"role": "Edit", "label": "x", "action": "fill", "entity_id": 5}}"#,
            "question \"q\": option \"a\": 'entity_id' must be a string or null",
        ),
        native_option(
            "native unknown option field",
            r#"{"a": {"role": "Edit", "label": "x", "action": "fill", "element_id": "el_0"}}"#,
            "question \"q\": option \"a\": unknown field \"element_id\"",
        ),
    ]);
    // Every invalid question is listed; the first gives code and detail; valid ones are not.
    let mut many = case(
        "several invalid questions",
        body_with(
            r#""S""#,
            &format!(
                r#"{{"ok": {}, "bad type": {{"type": "noul"}}, "say \"hi\"": {{"type": "choice", "criteria": {{"a": null}}}}, "ok2": {}, "opts": {}}}"#,
                choice(r#"{"a": null}"#),
                choice(r#"{"a": null}"#),
                choice(r#"{"a": "A", "b": [], "c": 0}"#),
            ),
        ),
        422,
        Code::UnsupportedQuestionType,
        "question \"bad type\": type 'noul' is not supported; this model answers 'choice' questions only",
    );
    many.invalid = vec![
        (
            "bad type",
            Code::UnsupportedQuestionType,
            many.detail.clone(),
        ),
        (
            "say \"hi\"",
            Code::MissingInstructions,
            "question \"say \\\"hi\\\"\": 'instructions' is required".to_string(),
        ),
        (
            "opts",
            Code::InvalidOption,
            "question \"opts\": \"c\" must be a string, an object or an array".to_string(),
        ),
    ];
    cases.push(many);
    // A request-level problem comes first, and the invalid questions are still listed.
    let mut both = case(
        "bad state and a bad question",
        body_with(
            "7",
            r#"{"q": {"type": "choice", "instructions": null, "criteria": []}, "fine": {"type": "choice", "instructions": null, "criteria": {"a": null}}}"#,
        ),
        422,
        Code::InvalidState,
        not_text_state,
    );
    both.invalid = vec![("q", Code::InvalidCriteria, criteria_shape.to_string())];
    cases.push(both);
    cases
}

#[test]
fn every_error_class_has_its_status_code_and_detail() {
    let cases = cases();
    let mut names = std::collections::HashSet::new();
    for case in &cases {
        assert!(names.insert(case.name), "duplicate case name {}", case.name);
        let problem = match parse_request(&case.body, SERVED) {
            Ok(_) => panic!("{}: accepted", case.name),
            Err(problem) => problem,
        };
        assert_eq!(problem.status, case.status, "{}: {problem}", case.name);
        assert_eq!(problem.code, case.code, "{}: {problem}", case.name);
        assert_eq!(problem.code.status(), problem.status, "{}", case.name);
        assert_eq!(problem.detail, case.detail, "{}", case.name);
        let invalid: Vec<(&str, Code, String)> = problem
            .invalid_questions
            .iter()
            .map(|q| (q.question.as_str(), q.code, q.detail.clone()))
            .collect();
        assert_eq!(invalid, case.invalid, "{}", case.name);
    }
    assert!(cases.len() >= 60, "{} cases", cases.len());
}

#[test]
fn problem_body_is_rfc9457_json() {
    let problem = parse_request(one(r#"{"type": "noul"}"#).as_bytes(), SERVED).unwrap_err();
    let body: serde_json::Value = serde_json::from_slice(&problem.to_json()).unwrap();
    assert_eq!(
        body,
        serde_json::json!({
            "type": "urn:instinct:problem:unsupported_question_type",
            "title": "Unsupported question type",
            "status": 422,
            "detail": "question \"q\": type 'noul' is not supported; this model answers 'choice' questions only",
            "code": "unsupported_question_type",
            "invalid_questions": [{
                "question": "q",
                "code": "unsupported_question_type",
                "detail": "question \"q\": type 'noul' is not supported; this model answers 'choice' questions only",
            }],
        })
    );
    assert_eq!(CONTENT_TYPE, "application/problem+json");
    // Without invalid questions the list is left out.
    let body: serde_json::Value =
        serde_json::from_slice(&Problem::body_not_object().to_json()).unwrap();
    assert_eq!(body.as_object().unwrap().len(), 5);
    assert_eq!(body["type"], "urn:instinct:problem:body_not_object");
}

#[test]
fn limit_problems_for_the_caller() {
    let problem = Problem::body_too_large();
    assert_eq!((problem.status, problem.code), (413, Code::BodyTooLarge));
    assert_eq!(problem.detail, "request body too large");

    let problem =
        Problem::prompts_too_long(&[("q", 16390), ("say \"hi\"", 20000)], MAX_PROMPT_TOKENS)
            .unwrap();
    assert_eq!((problem.status, problem.code), (413, Code::PromptTooLong));
    assert_eq!(
        problem.detail,
        "question \"q\": 16390 prompt tokens, over 16384"
    );
    assert_eq!(problem.invalid_questions.len(), 2);
    assert_eq!(
        problem.invalid_questions[1].detail,
        "question \"say \\\"hi\\\"\": 20000 prompt tokens, over 16384"
    );
    assert!(Problem::prompts_too_long(&[], MAX_PROMPT_TOKENS).is_none());

    let problem = Problem::inference_failed();
    assert_eq!(
        (problem.status, problem.detail.as_str()),
        (500, "inference failed")
    );
}

#[test]
fn accepted_edge_cases() {
    let accept = |body: &str| {
        parse_request(body.as_bytes(), SERVED).unwrap_or_else(|p| panic!("{body}: {p}"))
    };
    // 1 and 26 options, null labels, 64 questions.
    let request = accept(&one(&choice(&options(1))));
    assert_eq!(request.questions[0].option_keys, ["o0"]);
    assert!(request.questions[0]
        .chat_builtin()
        .contains("\nA. Decision \"o0\" -> select\n\n"));
    let request = accept(&one(&choice(&options(26))));
    assert_eq!(request.questions[0].option_keys.len(), 26);
    assert!(request.questions[0]
        .chat_builtin()
        .contains("\nZ. Decision \"o25\" -> select\n\n"));
    let many = accept(&body_with(r#""S""#, &questions(64)));
    assert_eq!(many.questions.len(), 64);
    assert_eq!(many.questions[63].name, "q63");
    // null and "" instructions leave the goal out; object instructions are json.dumps'ed.
    for instructions in ["null", r#""""#] {
        let body = one(&format!(
            r#"{{"type": "choice", "instructions": {instructions}, "criteria": {{"a": null}}}}"#
        ));
        assert!(accept(&body).questions[0]
            .chat_builtin()
            .contains("<|im_start|>user\nApp: Cua Driver\n"));
    }
    let body =
        one(r#"{"type": "choice", "instructions": {"goal": 1.50}, "criteria": {"a": null}}"#);
    assert!(accept(&body).questions[0]
        .chat_builtin()
        .contains("user\nGoal: {\"goal\": 1.5}\n\n"));
    // model omitted or null means the served model; unknown top-level and question fields are
    // ignored, as upstream does.
    let body = r#"{"state": "S", "questions": {"q": {"type": "choice", "instructions": null, "criteria": {"a": null}, "weight": 2}}, "trace": {"id": 1}}"#;
    assert_eq!(accept(body).model, SERVED);
    let body = r#"{"model": null, "state": "S", "questions": {"q": {"type": "choice", "instructions": null, "criteria": {"a": null}}}}"#;
    assert_eq!(accept(body).model, SERVED);
    // Whitespace-only state is not empty.
    assert_eq!(
        accept(&body_with(r#"" ""#, &questions(1))).questions.len(),
        1
    );
    // 127 levels of nesting are accepted.
    let deep = format!(
        r#"{{"state": {{"a": {}1{}}}, "questions": {}}}"#,
        "[".repeat(125),
        "]".repeat(125),
        questions(1)
    );
    assert_eq!(accept(&deep).questions.len(), 1);
}

#[test]
fn served_model_name_comes_from_the_caller() {
    let body = r#"{"model": "other-model", "state": "S", "questions": {"q": {"type": "choice", "instructions": null, "criteria": {"a": null}}}}"#;
    assert_eq!(
        parse_request(body.as_bytes(), "other-model").unwrap().model,
        "other-model"
    );
    let problem = parse_request(body.as_bytes(), SERVED).unwrap_err();
    assert_eq!(problem.detail, "'model' must be 'cua-s1-4b-0.2'");
    let problem =
        parse_request(one(&choice(r#"{"a": null}"#)).as_bytes(), "other-model").unwrap_err();
    assert_eq!(problem.detail, "'model' must be 'other-model'");
}

#[test]
fn native_format_renders_the_training_layout() {
    let body = native(
        SCREEN,
        r#"{"name": {"role": "Edit", "label": "Say \"hi\"", "action": "fill", "entity_id": "ent_0"}, "skip": {"role": "Button", "label": "OK", "action": "skip", "entity_id": null}, "bare": {"role": "Button", "label": "", "action": "click"}}"#,
    );
    let request = parse_request(body.as_bytes(), SERVED).unwrap();
    assert_eq!(request.prompt_format, PromptFormat::CuaS1Native);
    let question = &request.questions[0];
    assert_eq!(question.option_keys, ["name", "skip", "bare"]);
    assert!(question.chat_builtin().contains(
        "<|im_start|>user\nGoal: Pick one.\n\nApp: gui360_word\nTask family: form_filling\n\n\
         Accessibility tree:\n- Edit \"Name\"\n\nOptions:\nA. Edit \"Say \"hi\"\" -> fill (with entity 'ent_0')\n\
         B. Button \"OK\" -> skip\nC. Button \"\" -> click\n\nAnswer with a single letter.<|im_end|>"
    ));
}
