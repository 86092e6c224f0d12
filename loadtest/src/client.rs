//! The HTTP side: send one `POST /v1/systemone` and classify what came back.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderMap, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;

use crate::server_timing;
use crate::target::Target;

/// What one request ended as.
#[derive(Debug, Clone, PartialEq)]
pub enum OutcomeKind {
    /// 200 with a well-formed answer.
    Ok,
    /// 503: the server shed load. Counted apart, never in latency percentiles.
    Overloaded { retry_after_s: Option<f64> },
    /// Anything else; `key` is the status code ("422") or a transport failure ("timeout",
    /// "connection", "invalid_response").
    Error { key: String },
}

/// One request's result, with its timing.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub kind: OutcomeKind,
    /// When the request was actually handed to the connection pool.
    pub sent_at: Instant,
    /// When the whole response body had arrived (or the request failed).
    pub done_at: Instant,
    /// `Server-Timing` phases (name, milliseconds).
    pub server_timing: Vec<(String, f64)>,
    pub request_id: Option<String>,
    /// Answers in the response (= decisions made).
    pub decisions: u64,
    /// `usage.input_tokens` of the response.
    pub input_tokens: u64,
}

/// A pooled HTTP/1 client bound to one target.
#[derive(Clone)]
pub struct Client {
    http: HyperClient<HttpConnector, Full<Bytes>>,
    target: Target,
    timeout: Duration,
}

impl Client {
    pub fn new(target: Target, timeout: Duration) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let http = HyperClient::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Self {
            http,
            target,
            timeout,
        }
    }

    pub fn target(&self) -> &Target {
        &self.target
    }

    /// Sends one decision request with `questions` questions and classifies the answer.
    pub async fn decide(&self, body: Bytes, questions: usize) -> Outcome {
        let sent_at = Instant::now();
        let result = tokio::time::timeout(self.timeout, self.post_systemone(body)).await;
        let done_at = Instant::now();
        let mut outcome = Outcome {
            kind: OutcomeKind::Error {
                key: "timeout".into(),
            },
            sent_at,
            done_at,
            server_timing: Vec::new(),
            request_id: None,
            decisions: 0,
            input_tokens: 0,
        };
        let (status, headers, body) = match result {
            Err(_elapsed) => return outcome,
            Ok(Err(e)) => {
                outcome.kind = OutcomeKind::Error {
                    key: transport_error_key(&e),
                };
                return outcome;
            }
            Ok(Ok(parts)) => parts,
        };
        outcome.server_timing = headers
            .get_all("server-timing")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(server_timing::parse)
            .collect();
        outcome.request_id = headers
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        outcome.kind = match status {
            StatusCode::OK => match parse_answer(&body, questions) {
                Ok((decisions, tokens)) => {
                    outcome.decisions = decisions;
                    outcome.input_tokens = tokens;
                    OutcomeKind::Ok
                }
                Err(_) => OutcomeKind::Error {
                    key: "invalid_response".into(),
                },
            },
            StatusCode::SERVICE_UNAVAILABLE => OutcomeKind::Overloaded {
                retry_after_s: headers
                    .get(RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<f64>().ok()),
            },
            other => OutcomeKind::Error {
                key: other.as_u16().to_string(),
            },
        };
        outcome
    }

    async fn post_systemone(&self, body: Bytes) -> Result<(StatusCode, HeaderMap, Bytes)> {
        let request = Request::builder()
            .method(Method::POST)
            .uri(self.target.uri("/v1/systemone"))
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(body))?;
        let response = self.http.request(request).await?;
        let (parts, body) = response.into_parts();
        let bytes = body.collect().await?.to_bytes();
        Ok((parts.status, parts.headers, bytes))
    }

    /// `GET /metrics` as text.
    pub async fn scrape_metrics(&self) -> Result<String> {
        let request = Request::builder()
            .method(Method::GET)
            .uri(self.target.uri("/metrics"))
            .body(Full::new(Bytes::new()))?;
        let response = tokio::time::timeout(self.timeout, self.http.request(request))
            .await
            .context("GET /metrics timed out")?
            .context("GET /metrics failed")?;
        let status = response.status();
        let bytes = response.into_body().collect().await?.to_bytes();
        if status != StatusCode::OK {
            bail!("GET /metrics answered {status}");
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

fn transport_error_key(e: &anyhow::Error) -> String {
    if let Some(e) = e.downcast_ref::<hyper_util::client::legacy::Error>() {
        if e.is_connect() {
            return "connection".into();
        }
    }
    "transport".into()
}

/// Checks a 200 body: one answer per question; returns (answers, usage.input_tokens).
/// `answers` is an object keyed by question name (the server's form); a list is accepted too.
fn parse_answer(body: &[u8], questions: usize) -> Result<(u64, u64)> {
    let value: serde_json::Value = serde_json::from_slice(body).context("body is not JSON")?;
    let answers = match value.get("answers") {
        Some(serde_json::Value::Object(by_name)) => by_name.len(),
        Some(serde_json::Value::Array(list)) => list.len(),
        _ => bail!("no answers object"),
    };
    if answers != questions {
        bail!("{answers} answers for {questions} questions");
    }
    let tokens = value
        .pointer("/usage/input_tokens")
        .and_then(|t| t.as_u64())
        .unwrap_or(0);
    Ok((answers as u64, tokens))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_checked_against_the_question_count() {
        let body = br#"{"model":"m","answers":{"a":{"type":"choice"},"b":{"type":"choice"}},"usage":{"input_tokens":300,"output_tokens":0}}"#;
        assert_eq!(parse_answer(body, 2).unwrap(), (2, 300));
        assert!(parse_answer(body, 3).is_err());
        let list = br#"{"answers":[{"type":"choice"}],"usage":{"input_tokens":7}}"#;
        assert_eq!(parse_answer(list, 1).unwrap(), (1, 7));
        assert!(parse_answer(br#"{"answers":"x"}"#, 1).is_err());
        assert!(parse_answer(b"{}", 1).is_err());
        assert!(parse_answer(b"oops", 1).is_err());
    }
}
