//! System1-Omni requests map to the chat strings upstream builds. The expected strings were
//! produced by a Python reference of the mapping (`json.dumps(..., ensure_ascii=False)` for
//! structured values and labels) and are committed as literals.

use instinct::contract::{parse_request, PromptFormat};

/// (request body, [(question name, chat string)]).
const PYTHON_OMNI: &[(&str, &[(&str, &str)])] = &[
    (
        "{\"model\": \"cua-s1-4b-0.2\", \"state\": \"Dialog \\\"Delete 3 files?\\\"\\n- Button \\\"Delete\\\" @ [10, 20, 80, 40]\\n- Button \\\"Cancel\\\" @ [90, 20, 160, 40]\", \"questions\": {\"confirm\": {\"type\": \"choice\", \"instructions\": \"Keep the files.\", \"criteria\": {\"delete\": \"Press Delete\", \"cancel\": \"Press Cancel\"}}}}",
        &[
            ("confirm", "<|im_start|>system\nYou are a one-pass computer-use decision model. You are shown the current state of a screen and a fixed, closed list of candidate (element, action) options, each given a single letter. Choose exactly one option: the single best next action to take. Answer with ONLY that option's letter -- no words, no punctuation, no explanation.<|im_end|>\n<|im_start|>user\nGoal: Keep the files.\n\nApp: Cua Driver\nTask family: closed-candidate decision\n\nAccessibility tree:\nDialog \"Delete 3 files?\"\n- Button \"Delete\" @ [10, 20, 80, 40]\n- Button \"Cancel\" @ [90, 20, 160, 40]\n\nOptions:\nA. Decision \"Press Delete\" -> select\nB. Decision \"Press Cancel\" -> select\n\nAnswer with a single letter.<|im_end|>\n<|im_start|>assistant\n<think>\n"),
        ],
    ),
    (
        "{\"state\": {\"app\": \"Réglages\", \"zoom\": 1.0, \"scale\": 1e16, \"tiny\": 0.00001, \"ratio\": 0.1, \"big\": 12345678901234567890123, \"neg\": -0, \"negf\": -0.0, \"items\": [{\"id\": \"e1\", \"on\": true, \"label\": \"Wi\\u2011Fi \\u2028 😀\", \"ctl\": \"a\\u0001b\\tc\"}, null, []]}, \"questions\": {\"which\": {\"type\": \"choice\", \"instructions\": {\"ask\": \"Which one?\", \"n\": 2.50}, \"criteria\": {\"e1\": {\"action\": \"click\", \"element\": \"e1\"}, \"e2\": [\"click\", \"e2\"], \"quote\": \"Click \\\"Submit\\\"\\n(tab\\there) C:\\\\Users\", \"save\": \"点击「保存」\", \"sep\": \"line\\u2028sep\\u0007bell\", \"abstain\": null}}, \"other\": {\"type\": \"choice\", \"instructions\": null, \"criteria\": {\"only\": null}}, \"empty_goal\": {\"type\": \"choice\", \"instructions\": \"\", \"criteria\": {\"x\": \"X\", \"y\": \"Y\"}, \"extra\": \"ignored\"}}, \"unknown_top\": 1}",
        &[
            ("which", "<|im_start|>system\nYou are a one-pass computer-use decision model. You are shown the current state of a screen and a fixed, closed list of candidate (element, action) options, each given a single letter. Choose exactly one option: the single best next action to take. Answer with ONLY that option's letter -- no words, no punctuation, no explanation.<|im_end|>\n<|im_start|>user\nGoal: {\"ask\": \"Which one?\", \"n\": 2.5}\n\nApp: Cua Driver\nTask family: closed-candidate decision\n\nAccessibility tree:\n{\"app\": \"Réglages\", \"zoom\": 1.0, \"scale\": 1e+16, \"tiny\": 1e-05, \"ratio\": 0.1, \"big\": 12345678901234567890123, \"neg\": 0, \"negf\": -0.0, \"items\": [{\"id\": \"e1\", \"on\": true, \"label\": \"Wi\u{2011}Fi \u{2028} 😀\", \"ctl\": \"a\\u0001b\\tc\"}, null, []]}\n\nOptions:\nA. Decision \"{\\\"action\\\": \\\"click\\\", \\\"element\\\": \\\"e1\\\"}\" -> select\nB. Decision \"[\\\"click\\\", \\\"e2\\\"]\" -> select\nC. Decision \"Click \\\"Submit\\\"\\n(tab\\there) C:\\\\Users\" -> select\nD. Decision \"点击「保存」\" -> select\nE. Decision \"line\u{2028}sep\\u0007bell\" -> select\nF. Decision \"abstain\" -> select\n\nAnswer with a single letter.<|im_end|>\n<|im_start|>assistant\n<think>\n"),
            ("other", "<|im_start|>system\nYou are a one-pass computer-use decision model. You are shown the current state of a screen and a fixed, closed list of candidate (element, action) options, each given a single letter. Choose exactly one option: the single best next action to take. Answer with ONLY that option's letter -- no words, no punctuation, no explanation.<|im_end|>\n<|im_start|>user\nApp: Cua Driver\nTask family: closed-candidate decision\n\nAccessibility tree:\n{\"app\": \"Réglages\", \"zoom\": 1.0, \"scale\": 1e+16, \"tiny\": 1e-05, \"ratio\": 0.1, \"big\": 12345678901234567890123, \"neg\": 0, \"negf\": -0.0, \"items\": [{\"id\": \"e1\", \"on\": true, \"label\": \"Wi\u{2011}Fi \u{2028} 😀\", \"ctl\": \"a\\u0001b\\tc\"}, null, []]}\n\nOptions:\nA. Decision \"only\" -> select\n\nAnswer with a single letter.<|im_end|>\n<|im_start|>assistant\n<think>\n"),
            ("empty_goal", "<|im_start|>system\nYou are a one-pass computer-use decision model. You are shown the current state of a screen and a fixed, closed list of candidate (element, action) options, each given a single letter. Choose exactly one option: the single best next action to take. Answer with ONLY that option's letter -- no words, no punctuation, no explanation.<|im_end|>\n<|im_start|>user\nApp: Cua Driver\nTask family: closed-candidate decision\n\nAccessibility tree:\n{\"app\": \"Réglages\", \"zoom\": 1.0, \"scale\": 1e+16, \"tiny\": 1e-05, \"ratio\": 0.1, \"big\": 12345678901234567890123, \"neg\": 0, \"negf\": -0.0, \"items\": [{\"id\": \"e1\", \"on\": true, \"label\": \"Wi\u{2011}Fi \u{2028} 😀\", \"ctl\": \"a\\u0001b\\tc\"}, null, []]}\n\nOptions:\nA. Decision \"X\" -> select\nB. Decision \"Y\" -> select\n\nAnswer with a single letter.<|im_end|>\n<|im_start|>assistant\n<think>\n"),
        ],
    ),
    (
        "{\"state\": [\"a\", 1.5e+300, {\"k\": \"v\"}], \"questions\": {\"q\": {\"type\": \"choice\", \"instructions\": [\"step 1\", \"step 2\"], \"criteria\": {\"<|im_end|>\": null, \"b\": \"{\\\"nested\\\": \\\"json text\\\"}\"}}}}",
        &[
            ("q", "<|im_start|>system\nYou are a one-pass computer-use decision model. You are shown the current state of a screen and a fixed, closed list of candidate (element, action) options, each given a single letter. Choose exactly one option: the single best next action to take. Answer with ONLY that option's letter -- no words, no punctuation, no explanation.<|im_end|>\n<|im_start|>user\nGoal: [\"step 1\", \"step 2\"]\n\nApp: Cua Driver\nTask family: closed-candidate decision\n\nAccessibility tree:\n[\"a\", 1.5e+300, {\"k\": \"v\"}]\n\nOptions:\nA. Decision \"<|im_end|>\" -> select\nB. Decision \"{\\\"nested\\\": \\\"json text\\\"}\" -> select\n\nAnswer with a single letter.<|im_end|>\n<|im_start|>assistant\n<think>\n"),
        ],
    ),
];

#[test]
fn omni_requests_render_like_python() {
    for (body, expected) in PYTHON_OMNI {
        let request = parse_request(body.as_bytes(), "cua-s1-4b-0.2")
            .unwrap_or_else(|problem| panic!("{body}: {problem}"));
        assert_eq!(request.prompt_format, PromptFormat::System1Omni);
        assert_eq!(request.model, "cua-s1-4b-0.2");
        assert_eq!(request.questions.len(), expected.len(), "{body}");
        for (question, (name, chat)) in request.questions.iter().zip(expected.iter()) {
            assert_eq!(question.name, *name);
            assert_eq!(question.chat_builtin(), *chat, "question {name}");
        }
    }
}

#[test]
fn explicit_system1_omni_format_is_the_default() {
    let (body, expected) = PYTHON_OMNI[0];
    let explicit = body.replacen('{', "{\"prompt_format\": \"system1-omni\", ", 1);
    let request = parse_request(explicit.as_bytes(), "cua-s1-4b-0.2").unwrap();
    assert_eq!(request.questions[0].chat_builtin(), expected[0].1);
}

#[test]
fn option_keys_keep_request_order() {
    let (body, _) = PYTHON_OMNI[1];
    let request = parse_request(body.as_bytes(), "cua-s1-4b-0.2").unwrap();
    let names: Vec<&str> = request.questions.iter().map(|q| q.name.as_str()).collect();
    assert_eq!(names, ["which", "other", "empty_goal"]);
    assert_eq!(
        request.questions[0].option_keys,
        ["e1", "e2", "quote", "save", "sep", "abstain"]
    );
}
