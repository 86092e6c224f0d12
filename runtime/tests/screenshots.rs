//! Screenshot questions end to end on the demo model (tiny vision tower + multimodal adapter):
//! a PNG or JPEG data URL in `state`, the upstream screenshot rules, the image encoded once and
//! cached across requests.

mod common;

use base64::Engine as _;
use common::*;
use serde_json::Value;

const TWO_QUESTIONS: &str = r#"{"save":{"type":"choice","instructions":"Save the form","criteria":{"save":"Save","cancel":"Cancel","help":null}},"close":{"type":"choice","instructions":null,"criteria":{"x":"Close"}}}"#;

fn counter(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(name) && !l.starts_with('#'))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_screenshot_request_is_answered_and_its_image_cached() {
    let addr = start(true).await;
    let png = image_file("png_rgb_320x240.png");
    let reply = post(addr, &screenshot_request("image/png", &png, TWO_QUESTIONS)).await;
    assert_ok(&reply);
    let body = reply.json();
    assert_eq!(body["model"], "instinct/demo-tiny-qwen3.5:multimodal");
    let answers = body["answers"].as_object().unwrap();
    assert_eq!(answers.keys().collect::<Vec<_>>(), ["save", "close"]);
    let p: Vec<f64> = answers["save"]["probabilities"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(p.len(), 3);
    assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-5);
    assert_eq!(answers["close"]["confidence"], 1.0);
    // The prompts hold the image tokens (at least 64: min_pixels 65,536 / 32²) plus the text.
    let tokens = body["usage"]["input_tokens"].as_u64().unwrap();
    assert!(tokens > 2 * 64, "{tokens}");

    let before = exchange(addr, "GET /metrics HTTP/1.1", b"").await;
    let before = String::from_utf8(before.body).unwrap();
    let again = post(addr, &screenshot_request("image/png", &png, TWO_QUESTIONS)).await;
    assert_eq!(
        again.json()["answers"],
        body["answers"],
        "same image, same answers"
    );
    let after = exchange(addr, "GET /metrics HTTP/1.1", b"").await;
    let after = String::from_utf8(after.body).unwrap();
    assert_eq!(
        counter(&after, "instinct_image_cache_hits_total"),
        counter(&before, "instinct_image_cache_hits_total") + 1.0,
        "the second request reuses the encoded image"
    );

    // Another image gives other answers; JPEG is accepted too.
    let jpeg = image_file("jpeg_rgb_640x480.jpg");
    let other = post(
        addr,
        &screenshot_request("image/jpeg", &jpeg, TWO_QUESTIONS),
    )
    .await;
    assert_eq!(
        other.status,
        200,
        "{}",
        String::from_utf8_lossy(&other.body)
    );
    assert_ne!(other.json()["answers"]["save"], body["answers"]["save"]);

    // Text requests are still answered by the text adapter.
    let text = post(
        addr,
        r#"{"state":"- Button \"Save\"","questions":{"q":{"type":"choice","instructions":null,"criteria":{"a":"Save","b":"Cancel"}}}}"#,
    )
    .await;
    assert_eq!(text.status, 200);
    assert_eq!(text.json()["model"], MODEL_ID);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn screenshot_rules_are_enforced_with_clear_problems() {
    let addr = start(true).await;
    let png = image_file("png_rgb_320x240.png");
    let nine: String = format!(
        "{{{}}}",
        (0..9)
            .map(|i| format!(
                r#""q{i}":{{"type":"choice","instructions":null,"criteria":{{"a":"A"}}}}"#
            ))
            .collect::<Vec<_>>()
            .join(",")
    );
    let big = image_file("png_rgb_1920x1080.png");
    let apng_like = b"not an image at all".to_vec();
    let cases: Vec<(String, u16, &str)> = vec![
        (screenshot_request("image/png", &png, &nine), 422, "invalid_screenshot_request"),
        (
            screenshot_request(
                "image/png",
                &png,
                r#"{"q":{"type":"choice","instructions":"click <|image_pad|>","criteria":{"a":"A"}}}"#,
            ),
            422,
            "invalid_screenshot_request",
        ),
        (
            screenshot_request(
                "image/png",
                &png,
                r#"{"q":{"type":"choice","instructions":null,"criteria":{"a":"A"},"extra":1}}"#,
            ),
            422,
            "invalid_screenshot_request",
        ),
        (screenshot_request("image/png", &big, TWO_QUESTIONS), 422, "invalid_image"),
        (screenshot_request("image/jpeg", &png, TWO_QUESTIONS), 422, "invalid_image"),
        (screenshot_request("image/png", &apng_like, TWO_QUESTIONS), 422, "invalid_image"),
        (
            r#"{"state":{"image":"data:image/gif;base64,R0lGOD"},"questions":{"q":{"type":"choice","instructions":null,"criteria":{"a":"A"}}}}"#.to_string(),
            422,
            "invalid_image",
        ),
        (
            format!(
                r#"{{"state":{{"image":"data:image/png;base64,{}"}},"questions":{},"extra":true}}"#,
                base64::engine::general_purpose::STANDARD.encode(&png),
                TWO_QUESTIONS
            ),
            422,
            "invalid_screenshot_request",
        ),
    ];
    for (i, (body, status, code)) in cases.iter().enumerate() {
        let reply = post(addr, body).await;
        let p: Value = reply.json();
        assert_eq!(reply.status, *status, "case {i}: {p}");
        assert_eq!(p["code"], *code, "case {i}: {p}");
    }
    // Healthy afterwards.
    let ok = post(addr, &screenshot_request("image/png", &png, TWO_QUESTIONS)).await;
    assert_eq!(ok.status, 200);
}
