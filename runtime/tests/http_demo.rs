//! The HTTP surface end to end on the built-in demo model: a real server on a loopback port, real
//! requests over TCP.

mod common;

use common::*;

const DELETE_REQUEST: &str = r#"{"model":"cua-s1-4b-0.2","state":"- Button \"Delete\"\n- Button \"Cancel\"","questions":{"confirm":{"type":"choice","instructions":"Delete 3 files?","criteria":{"delete":"Delete","cancel":"Cancel"}},"which":{"type":"choice","instructions":null,"criteria":{"a":null,"b":"B","c":{"x":1.5}}}}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_have_the_upstream_shape() {
    let addr = start(true).await;
    let reply = post(addr, DELETE_REQUEST).await;
    assert_ok(&reply);
    assert_eq!(reply.header("content-type"), Some("application/json"));
    assert!(reply.header("x-request-id").is_some_and(|v| !v.is_empty()));
    let timing = reply.header("server-timing").unwrap();
    assert!(
        timing.contains("prepare;dur=") && timing.contains("infer;dur="),
        "{timing}"
    );

    let body = reply.json();
    assert_eq!(body["model"], MODEL_ID);
    let answers = body["answers"].as_object().unwrap();
    assert_eq!(
        answers.keys().collect::<Vec<_>>(),
        ["confirm", "which"],
        "request order"
    );
    for (name, keys) in [
        ("confirm", vec!["delete", "cancel"]),
        ("which", vec!["a", "b", "c"]),
    ] {
        let a = answers[name].as_object().unwrap();
        assert_eq!(
            a.keys().collect::<Vec<_>>(),
            ["type", "choice", "probabilities", "confidence"]
        );
        assert_eq!(a["type"], "choice");
        let probs = a["probabilities"].as_object().unwrap();
        assert_eq!(probs.keys().collect::<Vec<_>>(), keys, "option order");
        let p: Vec<f64> = probs.values().map(|v| v.as_f64().unwrap()).collect();
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-5, "{p:?}");
        let best = p
            .iter()
            .enumerate()
            .fold(0, |b, (i, &x)| if x > p[b] { i } else { b });
        assert_eq!(a["choice"], keys[best]);
        let c = a["confidence"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&c));
    }
    let tokens = body["usage"]["input_tokens"].as_u64().unwrap();
    assert!(tokens > 200, "two full Cua-S1 prompts: {tokens}");
    assert_eq!(body["usage"]["output_tokens"], 0);

    // Same request, same answer; and a question's answer does not depend on its companions.
    let again = post(addr, DELETE_REQUEST).await.json();
    assert_eq!(again["answers"], body["answers"]);
    let alone = post(
        addr,
        r#"{"state":"- Button \"Delete\"\n- Button \"Cancel\"","questions":{"confirm":{"type":"choice","instructions":"Delete 3 files?","criteria":{"delete":"Delete","cancel":"Cancel"}}}}"#,
    )
    .await
    .json();
    let p_alone = &alone["answers"]["confirm"]["probabilities"];
    let p_pair = &body["answers"]["confirm"]["probabilities"];
    for key in ["delete", "cancel"] {
        let (x, y) = (
            p_alone[key].as_f64().unwrap(),
            p_pair[key].as_f64().unwrap(),
        );
        assert!((x - y).abs() < 1e-6, "{key}: {x} vs {y}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_problem_bodies_and_leave_the_server_healthy() {
    let addr = start(true).await;
    let cases: &[(&str, &[u8], u16, &str)] = &[
        (
            "POST /v1/systemone HTTP/1.1\r\nContent-Type: application/json",
            b"{",
            400,
            "invalid_json",
        ),
        (
            "POST /v1/systemone HTTP/1.1\r\nContent-Type: application/json",
            b"[]",
            400,
            "body_not_object",
        ),
        (
            "POST /v1/systemone HTTP/1.1\r\nContent-Type: text/plain",
            b"{}",
            415,
            "unsupported_media_type",
        ),
        (
            "POST /v1/systemone HTTP/1.1\r\nContent-Type: application/json",
            br#"{"model":"x","state":"s","questions":{}}"#,
            422,
            "unknown_model",
        ),
        ("GET /v1/systemone HTTP/1.1", b"", 405, "method_not_allowed"),
        ("GET /nowhere HTTP/1.1", b"", 404, "not_found"),
    ];
    for (head, body, status, code) in cases {
        let reply = exchange(addr, head, body).await;
        assert_eq!(reply.status, *status, "{head}");
        assert_eq!(
            reply.header("content-type"),
            Some("application/problem+json")
        );
        let p = reply.json();
        assert_eq!(p["code"], *code);
        assert_eq!(p["status"], *status);
        assert!(p["detail"].as_str().is_some_and(|d| !d.is_empty()));
    }
    let reply = exchange(addr, "GET /v1/systemone HTTP/1.1", b"").await;
    assert_eq!(reply.header("allow"), Some("POST"));

    // Over the 4 MiB body limit: refused from Content-Length before reading.
    let big = vec![b' '; (4 << 20) + 1];
    let reply = post(addr, std::str::from_utf8(&big).unwrap()).await;
    assert_eq!(reply.status, 413);
    assert_eq!(reply.json()["detail"], "request body too large");

    // A prompt over the token limit is refused before any model work, naming the question.
    let long_state = "x ".repeat(40_000);
    let body = format!(
        r#"{{"state":"{long_state}","questions":{{"long":{{"type":"choice","instructions":null,"criteria":{{"a":"A"}}}}}}}}"#
    );
    let reply = post(addr, &body).await;
    assert_eq!(reply.status, 413);
    let p = reply.json();
    assert_eq!(p["code"], "prompt_too_long");
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .starts_with("question \"long\": "),
        "{p}"
    );

    // Still healthy.
    assert_eq!(post(addr, DELETE_REQUEST).await.status, 200);
    let health = exchange(addr, "GET /health HTTP/1.1", b"").await;
    assert_eq!(health.status, 200);
    assert_eq!(
        health.json(),
        serde_json::json!({"status": "ready", "model": MODEL_ID})
    );
}

#[tokio::test]
async fn not_ready_until_the_model_is_loaded() {
    let addr = start(false).await;
    let readyz = exchange(addr, "GET /readyz HTTP/1.1", b"").await;
    assert_eq!(readyz.status, 503);
    assert!(readyz.header("retry-after").is_some());
    assert_eq!(exchange(addr, "GET /livez HTTP/1.1", b"").await.status, 200);
    let reply = post(addr, DELETE_REQUEST).await;
    assert_eq!(reply.status, 503);
    assert_eq!(reply.json()["code"], "not_ready");
    assert!(reply.header("retry-after").is_some());
    assert_eq!(
        exchange(addr, "GET /health HTTP/1.1", b"").await.status,
        503
    );
}

#[tokio::test]
async fn models_lists_the_served_name() {
    let addr = start(false).await;
    let reply = exchange(addr, "GET /v1/models HTTP/1.1", b"").await;
    assert_eq!(reply.status, 200);
    let body = reply.json();
    assert_eq!(body["data"][0]["id"], SERVED);
    assert_eq!(body["data"][0]["ready"], false);
}
