#!/usr/bin/env python3
"""Writes the fuzz seeds into the corpus (fuzz/corpus/<target>/) from the fixtures, the test images and the
request shapes of runtime/tests/contract_errors.rs. tools/fuzz.sh minimizes the corpus, with what
AFL++ finds, after each run.

Usage: tools/fuzz-seeds.py [FIXTURES_JSON]  (default ../shared/fixtures/cua-s1-4b-0.2-text.json)
"""
import base64
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    REPO, "..", "shared", "fixtures", "cua-s1-4b-0.2-text.json")
OUT = os.path.join(REPO, "fuzz", "corpus")
IMAGES = os.path.join(REPO, "model", "tests", "data", "images")
MODEL = "cua-s1-4b-0.2"  # instinct_fuzz::SERVED_MODEL

fixtures = json.load(open(FIXTURES))["fixtures"]
# The shortest few keep the seeds small; all families and apps still appear.
short = sorted(fixtures, key=lambda f: len(f["chat"]))[:4]


def write(target, name, data):
    os.makedirs(os.path.join(OUT, target), exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(OUT, target, name), "wb") as f:
        f.write(data)


def dumps(value):
    return json.dumps(value, ensure_ascii=False)


def omni(fixture):
    criteria = {o["element_id"]: o["label"] for o in fixture["options"]}
    return {"model": MODEL, "state": fixture["ax_tree"], "questions": {
        "q": {"type": "choice", "instructions": fixture["goal"], "criteria": criteria}}}


def native(fixture):
    criteria = {o["element_id"]: {k: o[k] for k in ("role", "label", "action", "entity_id")}
                for o in fixture["options"]}
    state = {"app": fixture["app"], "task_family": fixture["family"],
             "accessibility_tree": fixture["ax_tree"]}
    return {"prompt_format": "cua-s1-native", "state": state, "questions": {
        "q": {"type": "choice", "instructions": fixture["goal"], "criteria": criteria}}}


def question(criteria, instructions="Pick one."):
    return {"type": "choice", "instructions": instructions, "criteria": criteria}


def data_url(name, mime):
    raw = open(os.path.join(IMAGES, name), "rb").read()
    return f"data:{mime};base64," + base64.b64encode(raw).decode()


# request_body: fixture requests in both formats, accepted edge cases, one body per error class.
for i, f in enumerate(short[:2]):
    write("request_body", f"fixture_omni_{i}.json", dumps(omni(f)))
    write("request_body", f"fixture_native_{i}.json", dumps(native(f)))
one = lambda q, state="Screen": dumps({"model": MODEL, "state": state, "questions": {"q": q}})
requests = {
    "omni_structured_state.json": one(question({"a": None, "b": "Say \"hi\"\n\\", "c": ["x", 1]}),
                                      state={"tree": [1, 2.5, None, True, "é"]}),
    "omni_null_instructions.json": one(question({"a": "A"}, instructions=None)),
    "two_questions.json": dumps({"state": "S", "questions": {
        "first": question({"y": "Yes", "n": "No"}), "second": question({"z": {"k": "v"}})}}),
    "screenshot_png.json": dumps({"model": MODEL, "state": {"image": data_url("png_rgb_33x47.png", "image/png")},
                                  "questions": {"q": question({"a": "OK", "b": "Cancel"})}}),
    "screenshot_jpeg.json": dumps({"state": {"image": data_url("jpeg_rgb_33x47.jpg", "image/jpeg")},
                                   "questions": {"q": question({"a": "OK"})}}),
    "screenshot_vision_token.json": dumps({"state": {"image": "data:image/png;base64,iVBORw0KGgo="},
                                           "questions": {"q": question({"a": "<|image_pad|>"})}}),
    "screenshot_extra_field.json": dumps({"state": {"image": "data:image/gif;base64,R0lG"}, "x": 1,
                                          "questions": {"q": question({"a": "A"})}}),
    "native_fill_entity.json": dumps({"prompt_format": "cua-s1-native", "state": {
        "app": "a", "task_family": "f", "accessibility_tree": "t"}, "questions": {"q": question(
            {"a": {"role": "Edit", "label": "", "action": "fill", "entity_id": "ent_0"}})}}),
    "native_unknown_field.json": dumps({"prompt_format": "cua-s1-native", "state": {
        "app": "a", "task_family": "f", "accessibility_tree": "t", "x": 1},
        "questions": {"q": question({"a": {"role": "r", "label": "l", "action": "x", "y": 0}})}}),
    "wrong_model.json": dumps({"model": "other", "state": "S", "questions": {"q": question({"a": 1})}}),
    "wrong_prompt_format.json": dumps({"prompt_format": 3, "state": "", "questions": {}}),
    "question_types.json": dumps({"state": "S", "questions": {
        "s": {"type": "score", "instructions": "x", "criteria": {"a": "A"}},
        "u": {"type": "other"}, "m": {"type": "choice", "criteria": {"a": "A"}},
        "i": {"type": "choice", "instructions": 5, "criteria": {"a": "A"}},
        "c": {"type": "choice", "instructions": "x", "criteria": {}}, "n": 7}}),
    "too_many_options.json": one(question({f"o{i}": None for i in range(27)})),
    "too_many_questions.json": dumps({"state": "S", "questions": {
        f"q{i}": question({"a": "A"}) for i in range(65)}}),
    "not_object.json": "[1, 2, 3]",
    "invalid_json.json": '{"state": "S", "questions": {"q": }',
    "bom.json": "\ufeff{}",
    "nan.json": '{"state": NaN}',
    "out_of_range.json": '{"state": 1e400, "n": 123456789012345678901234567890}',
    "lone_surrogate.json": '{"state": "\\ud800", "ok": "\\ud83d\\ude00"}',
    "duplicate_key.json": '{"state": "a", "state": "b"}',
    "deep.json": "[" * 127 + "]" * 127,
    "too_deep.json": "[" * 128 + "]" * 128,
    "control_char.json": '{"state": "a\x01b"}',
    "numbers.json": '[0, -0, 1.5e-3, -12E+2, 1e-400, 0.1, 100000000000000000000000]',
}
for name, body in requests.items():
    write("request_body", name, body)

# image: the small test images (every PNG colour type and JPEG kind the goldens cover).
for name in sorted(os.listdir(IMAGES)):
    if ("_33x47" in name or "_1x1" in name or "_200x1" in name) and not name.endswith(".pillow.png"):
        write("image", name, open(os.path.join(IMAGES, name), "rb").read())

# chat_template: "system NUL user", or the user message alone (the Cua-S1 system message).
for i, f in enumerate(short[:2]):
    chat = f["chat"]
    system = chat.split("<|im_start|>system\n", 1)[1].split("<|im_end|>", 1)[0]
    user = chat.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
    write("chat_template", f"fixture_{i}.txt", system + "\0" + user)
    write("chat_template", f"fixture_user_{i}.txt", user)
for i, text in enumerate(["", "  \t\n", " x ", "\x1c\x1dA\x1e\x1f", "\u3000\u00a0\u2028text\u0085",
                          "sys\0  user  \n", "<|im_end|>\n<|im_start|>user\n", "{{ x }}{% if %}"]):
    write("chat_template", f"edge_{i}.txt", text)

# tokenizer: fixture chats, and the pre-tokenizer's, NFC's and the added tokens' corner cases.
for i, f in enumerate(short[:2]):
    write("tokenizer", f"fixture_chat_{i}.txt", f["chat"])
for i, text in enumerate(["Hello world", "I'm here, you'll see; they've 12345 items.",
                          "  \n\n\t x\r\n", "中文字符测试 and 日本語", "😀👍🏽 e\u0301 \u212b A\u030a",
                          "<|im_start|><|im_end|><|endoftext|><think></think><|image_pad|>",
                          "<|im_start|x <|im_end", "\u0000\u0001\u007f\u0085\ufffd",
                          "ﬁ ℌ ① Ａ", "$$$!!!...,,,   ---", "abc123DEF'S'LL'Re"]):
    write("tokenizer", f"edge_{i}.txt", text)

# problem_body: selector byte, then NUL-separated strings (see instinct_fuzz::problem_body).
for i, (selector, text) in enumerate([(0, "plain detail"), (10, "é\"\\\n\x01"), (1, "expected value at line 1"),
                                      (3, "/v1/unknown?q=ü"), (4, "DELETE\0/v1/systemone"),
                                      (5, "text/plain; charset=\"x\""), (6, "x" * 70), (7, "q1\0q2\0\U0001F600"),
                                      (8, "q\0detail\0r"), (9, "name \"with\" quotes\ud7ff")]):
    write("problem_body", f"seed_{i}.bin", bytes([selector]) + text.encode())
