//! The HTTP surface: routing, body limits, request ids, timing headers, and the
//! `POST /v1/systemone` handler (validate → tokenize → decide → answer).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Map, Value};
use tokio::net::TcpListener;

use crate::contract::{self, Request as ValidatedRequest};
use crate::engine::{Engine, PromptInput};
use crate::problem::Problem;
use instinct_model::readout::{confidence as entropy_confidence, first_argmax};

/// Everything a request handler needs; shared by all connections.
pub struct AppState {
    /// Set once the model is loaded and a warm-up decision has run.
    engine: std::sync::OnceLock<Arc<dyn Engine>>,
    /// Name accepted in the request's `model` field.
    pub served_model_name: String,
    /// Identity reported in answers and `/health`.
    pub model_id: String,
    pub max_body_bytes: usize,
    pub max_prompt_tokens: usize,
}

impl AppState {
    pub fn new(
        served_model_name: String,
        model_id: String,
        max_body_bytes: usize,
        max_prompt_tokens: usize,
    ) -> Self {
        Self {
            engine: std::sync::OnceLock::new(),
            served_model_name,
            model_id,
            max_body_bytes,
            max_prompt_tokens,
        }
    }

    /// Marks the server ready with its engine. Call after the warm-up decision succeeded.
    pub fn set_ready(&self, engine: Arc<dyn Engine>) {
        let _ = self.engine.set(engine);
    }

    fn engine(&self) -> Option<&Arc<dyn Engine>> {
        self.engine.get()
    }
}

type Body = Full<Bytes>;

/// Accepts connections until the process ends.
pub async fn serve(listener: TcpListener, state: Arc<AppState>) -> anyhow::Result<()> {
    loop {
        let (stream, _) = listener.accept().await?;
        let state = state.clone();
        tokio::spawn(async move {
            let io = hyper_util::rt::TokioIo::new(stream);
            let service = hyper::service::service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(handle(state, req).await) }
            });
            let builder = hyper::server::conn::http1::Builder::new();
            if let Err(e) = builder.serve_connection(io, service).await {
                tracing::debug!("connection ended: {e}");
            }
        });
    }
}

/// Routes one request and adds the headers every answer carries.
pub async fn handle(state: Arc<AppState>, req: Request<Incoming>) -> Response<Body> {
    let request_id = request_id(&req);
    let mut response = route(state, req).await;
    if let Ok(v) = HeaderValue::from_str(&request_id) {
        response.headers_mut().insert("x-request-id", v);
    }
    response
}

async fn route(state: Arc<AppState>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let allowed: &[Method] = match path.as_str() {
        "/v1/systemone" => &[Method::POST],
        "/health" | "/livez" | "/readyz" | "/v1/models" => &[Method::GET, Method::HEAD],
        _ => return problem_response(&Problem::not_found(&path)),
    };
    if !allowed.contains(req.method()) {
        let mut r = problem_response(&Problem::method_not_allowed(req.method().as_str(), &path));
        let allow = allowed
            .iter()
            .map(Method::as_str)
            .collect::<Vec<_>>()
            .join(", ");
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_str(&allow).expect("ascii"));
        return r;
    }
    match path.as_str() {
        "/v1/systemone" => systemone(state, req).await,
        "/health" => health(&state),
        "/livez" => json_response(StatusCode::OK, &json!({"status": "alive"})),
        "/readyz" => readyz(&state),
        "/v1/models" => models(&state),
        _ => unreachable!("routes above"),
    }
}

fn health(state: &AppState) -> Response<Body> {
    match state.engine() {
        Some(_) => json_response(
            StatusCode::OK,
            &json!({"status": "ready", "model": state.model_id}),
        ),
        None => json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"status": "loading", "model": state.model_id}),
        ),
    }
}

fn readyz(state: &AppState) -> Response<Body> {
    match state.engine() {
        Some(_) => json_response(StatusCode::OK, &json!({"status": "ready"})),
        None => {
            let mut r = json_response(
                StatusCode::SERVICE_UNAVAILABLE,
                &json!({"status": "loading"}),
            );
            r.headers_mut()
                .insert("retry-after", HeaderValue::from_static("1"));
            r
        }
    }
}

fn models(state: &AppState) -> Response<Body> {
    json_response(
        StatusCode::OK,
        &json!({
            "object": "list",
            "data": [{
                "id": state.served_model_name,
                "object": "model",
                "owned_by": "instinct",
                "root": state.model_id,
                "ready": state.engine().is_some(),
            }]
        }),
    )
}

async fn systemone(state: Arc<AppState>, req: Request<Incoming>) -> Response<Body> {
    let started = Instant::now();
    if let Some(ct) = req.headers().get(CONTENT_TYPE) {
        if !is_json_content_type(ct) {
            return problem_response(&Problem::unsupported_media_type(
                ct.to_str().unwrap_or("(not text)"),
            ));
        }
    }
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > state.max_body_bytes as u64) {
        return problem_response(&Problem::body_too_large());
    }
    let body = match Limited::new(req.into_body(), state.max_body_bytes)
        .collect()
        .await
    {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            return problem_response(&Problem::body_too_large());
        }
        Err(e) => return problem_response(&Problem::unreadable_body(e)),
    };
    let Some(engine) = state.engine().cloned() else {
        let mut r = problem_response(&Problem::not_ready());
        r.headers_mut()
            .insert("retry-after", HeaderValue::from_static("1"));
        return r;
    };

    // Parsing, rendering and tokenization are CPU work: keep them off the reactor threads.
    let prep_state = state.clone();
    let prep_engine = engine.clone();
    let prepared =
        tokio::task::spawn_blocking(move || prepare(&prep_state, &*prep_engine, &body)).await;
    let (request, prompts) = match prepared {
        Ok(Ok(p)) => p,
        Ok(Err(problem)) => return problem_response(&problem),
        Err(e) => {
            tracing::error!("prepare task failed: {e}");
            return problem_response(&Problem::inference_failed());
        }
    };
    let prepared_at = Instant::now();

    let infer_prompts = prompts.clone();
    let decided = tokio::task::spawn_blocking(move || engine.decide(&infer_prompts)).await;
    let probabilities = match decided {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => {
            tracing::error!("inference failed: {e:#}");
            return problem_response(&Problem::inference_failed());
        }
        Err(e) => {
            tracing::error!("inference task failed: {e}");
            return problem_response(&Problem::inference_failed());
        }
    };
    let inferred_at = Instant::now();

    let body = match answer_body(&state.model_id, &request, &prompts, &probabilities) {
        Ok(b) => b,
        Err(e) => {
            tracing::error!("answer rejected: {e:#}");
            return problem_response(&Problem::inference_failed());
        }
    };
    let mut r = json_response(StatusCode::OK, &body);
    let timing = format!(
        "prepare;dur={:.3}, infer;dur={:.3}, total;dur={:.3}",
        ms(prepared_at - started),
        ms(inferred_at - prepared_at),
        ms(inferred_at - started)
    );
    r.headers_mut().insert(
        "server-timing",
        HeaderValue::from_str(&timing).expect("ascii"),
    );
    r
}

/// Validates the whole request, then tokenizes every question and checks the prompt limit for all
/// of them before any model work.
fn prepare(
    state: &AppState,
    engine: &dyn Engine,
    body: &[u8],
) -> Result<(ValidatedRequest, Vec<PromptInput>), Problem> {
    let request = contract::parse_request(body, &state.served_model_name)?;
    let mut prompts = Vec::with_capacity(request.questions.len());
    let mut over = Vec::new();
    for q in &request.questions {
        let ids = engine
            .render(&q.user)
            .and_then(|chat| engine.tokenize(&chat))
            .map_err(|e| {
                tracing::error!("prompt preparation failed: {e:#}");
                Problem::inference_failed()
            })?;
        if ids.len() > state.max_prompt_tokens {
            over.push((q.name.as_str(), ids.len()));
        }
        prompts.push(PromptInput {
            ids,
            n_options: q.option_keys.len(),
        });
    }
    if let Some(problem) = Problem::prompts_too_long(&over, state.max_prompt_tokens) {
        return Err(problem);
    }
    Ok((request, prompts))
}

/// Builds the upstream-shaped answer: per question, in request order, the choice (first argmax),
/// the probabilities per option key in request order, and the normalized-entropy confidence.
fn answer_body(
    model_id: &str,
    request: &ValidatedRequest,
    prompts: &[PromptInput],
    probabilities: &[Vec<f32>],
) -> anyhow::Result<Value> {
    anyhow::ensure!(
        probabilities.len() == request.questions.len(),
        "engine answered {} of {} questions",
        probabilities.len(),
        request.questions.len()
    );
    let mut answers = Map::new();
    for (q, p) in request.questions.iter().zip(probabilities) {
        anyhow::ensure!(
            p.len() == q.option_keys.len(),
            "question {:?}: {} probabilities for {} options",
            q.name,
            p.len(),
            q.option_keys.len()
        );
        anyhow::ensure!(
            p.iter().all(|x| x.is_finite() && (0.0..=1.0).contains(x)),
            "question {:?}: probabilities not finite or outside [0, 1]",
            q.name
        );
        let choice = first_argmax(p);
        let mut probs = Map::new();
        for (key, &pk) in q.option_keys.iter().zip(p) {
            probs.insert(key.clone(), json!(f64::from(pk)));
        }
        let mut answer = Map::new();
        answer.insert("type".into(), json!("choice"));
        answer.insert("choice".into(), json!(q.option_keys[choice]));
        answer.insert("probabilities".into(), Value::Object(probs));
        answer.insert("confidence".into(), json!(entropy_confidence(p)));
        answers.insert(q.name.clone(), Value::Object(answer));
    }
    let input_tokens: usize = prompts.iter().map(|p| p.ids.len()).sum();
    Ok(json!({
        "model": model_id,
        "answers": answers,
        "usage": {"input_tokens": input_tokens, "output_tokens": 0},
    }))
}

fn is_json_content_type(v: &HeaderValue) -> bool {
    let Ok(s) = v.to_str() else { return false };
    let essence = s
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json" || essence.ends_with("+json")
}

fn request_id<B>(req: &Request<B>) -> String {
    req.headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_owned)
        .unwrap_or_else(new_request_id)
}

fn new_request_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(
        "{:016x}{:08x}",
        nanos ^ u64::from(std::process::id()).rotate_left(32),
        n as u32
    )
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn json_response(status: StatusCode, body: &Value) -> Response<Body> {
    let bytes = serde_json::to_vec(body).expect("a JSON value serializes");
    Response::builder()
        .status(status)
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(bytes)))
        .expect("valid response")
}

/// An RFC 9457 problem response.
pub fn problem_response(problem: &Problem) -> Response<Body> {
    let bytes = problem.to_json();
    Response::builder()
        .status(problem.status)
        .header(CONTENT_TYPE, crate::problem::CONTENT_TYPE)
        .body(Full::new(Bytes::from(bytes)))
        .expect("valid response")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_content_types() {
        for ok in [
            "application/json",
            "application/json; charset=utf-8",
            "application/problem+json",
        ] {
            assert!(is_json_content_type(&HeaderValue::from_static(ok)), "{ok}");
        }
        for bad in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data",
        ] {
            assert!(
                !is_json_content_type(&HeaderValue::from_static(bad)),
                "{bad}"
            );
        }
    }
}
