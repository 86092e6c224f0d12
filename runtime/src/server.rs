//! The HTTP surface: routing, authentication, body limits, request ids, timing headers, metrics,
//! and the `POST /v1/systemone` handler (validate → render → tokenize → admit → answer).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, AUTHORIZATION, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use instinct_model::readout::{confidence, first_argmax};
use instinct_scheduler::{Failure, Question, RejectReason, Scheduler};
use metrics::{counter, histogram};
use rayon::prelude::*;
use serde_json::{json, Map, Value};
use tokio::net::TcpListener;

use crate::budget::ByteBudget;
use crate::conn;
use crate::contract::{self, Request as ValidatedRequest};
use crate::engine::{Preparer, ScreenshotError};
use crate::framing::Head;
use crate::metrics as m;
use crate::problem::{Code, Problem};

/// Limits and identity of the server, fixed at start-up.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Name accepted in the request's `model` field.
    pub served_model_name: String,
    /// Identity reported in answers and `/health`.
    pub model_id: String,
    pub max_body_bytes: usize,
    /// Body limit of screenshot requests (when screenshots are served).
    pub max_screenshot_body_bytes: usize,
    pub max_prompt_tokens: usize,
    /// Longest a request may wait in the queue before it is answered 503.
    pub request_timeout: Option<Duration>,
    /// Bearer token required on `/v1/systemone` and `/v1/models`, if set.
    pub api_key: Option<String>,
    /// An engine thread silent for longer than this makes `/livez` fail.
    pub engine_stall: Duration,
    /// Longest the request head may take to arrive (and an idle keep-alive connection may wait).
    pub header_timeout: Duration,
    /// Longest the request body may take to arrive, from the end of the head.
    pub body_timeout: Duration,
    /// Longest a response write may make no progress before the connection is dropped.
    pub write_timeout: Duration,
    /// Largest request head (request line, header lines, empty line), in bytes.
    pub max_header_bytes: usize,
    /// Most header lines in a request head.
    pub max_headers: usize,
    /// Most connections served at once; more are answered 503 and closed.
    pub max_connections: usize,
    /// Most bytes held for requests in flight (bodies, parsed requests, token ids, screenshot
    /// features); a request that would take it over is answered 503 at once.
    pub max_inflight_bytes: usize,
    /// Most device memory the prefix states of questions running in chunks hold at once, where
    /// the engines keep them on the device; a request whose do not fit runs its questions whole.
    pub max_chunk_state_bytes: usize,
}

/// Default of `--max-inflight-mib`.
pub const DEFAULT_MAX_INFLIGHT_MIB: usize = 1024;
/// Default of `--max-chunk-state-mib`: four questions of 16,384 tokens on Qwen3.5-4B (each holds
/// two snapshots of ~1 GiB while a chunk runs).
pub const DEFAULT_MAX_CHUNK_STATE_MIB: usize = 8192;

impl Settings {
    /// Defaults of the `serve` command, for the given identity.
    pub fn new(served_model_name: impl Into<String>, model_id: impl Into<String>) -> Self {
        Self {
            served_model_name: served_model_name.into(),
            model_id: model_id.into(),
            max_body_bytes: contract::MAX_BODY_BYTES,
            max_screenshot_body_bytes: 8 * 1024 * 1024,
            max_prompt_tokens: contract::MAX_PROMPT_TOKENS,
            request_timeout: None,
            api_key: None,
            engine_stall: Duration::from_secs(60),
            header_timeout: Duration::from_millis(conn::DEFAULT_HEADER_TIMEOUT_MS),
            body_timeout: Duration::from_millis(conn::DEFAULT_BODY_TIMEOUT_MS),
            write_timeout: Duration::from_millis(conn::DEFAULT_WRITE_TIMEOUT_MS),
            max_header_bytes: conn::DEFAULT_MAX_HEADER_BYTES,
            max_headers: conn::DEFAULT_MAX_HEADERS,
            max_connections: conn::DEFAULT_MAX_CONNECTIONS,
            max_inflight_bytes: DEFAULT_MAX_INFLIGHT_MIB << 20,
            max_chunk_state_bytes: DEFAULT_MAX_CHUNK_STATE_MIB << 20,
        }
    }
}

/// What serves once the model is loaded.
pub struct Ready {
    pub preparer: Preparer,
    pub scheduler: Scheduler,
}

/// Everything a request handler needs; shared by all connections.
pub struct AppState {
    pub settings: Settings,
    /// Set once the model is loaded and a warm-up decision has run.
    ready: OnceLock<Ready>,
    draining: AtomicBool,
    pub(crate) connections: conn::Connections,
    /// Bytes held for requests in flight.
    pub inflight: Arc<ByteBudget>,
    /// Device memory held for chunked questions' prefix states (engines that keep them there).
    pub chunk_states: Arc<ByteBudget>,
}

impl AppState {
    pub fn new(settings: Settings) -> Self {
        m::install();
        metrics::gauge!(m::READY).set(0.0);
        let inflight = ByteBudget::new(settings.max_inflight_bytes);
        let chunk_states = ByteBudget::with_gauges(
            settings.max_chunk_state_bytes,
            (m::CHUNK_STATE_BYTES, m::CHUNK_STATE_BYTES_LIMIT),
        );
        Self {
            settings,
            ready: OnceLock::new(),
            draining: AtomicBool::new(false),
            connections: conn::Connections::default(),
            inflight,
            chunk_states,
        }
    }

    /// Marks the server ready. Call after the warm-up decision succeeded.
    pub fn set_ready(&self, ready: Ready) {
        if self.ready.set(ready).is_ok() {
            metrics::gauge!(m::READY).set(1.0);
        }
    }

    /// The loaded model, if any.
    pub fn ready(&self) -> Option<&Ready> {
        self.ready.get()
    }

    /// Stops admitting work: readiness goes to 503 and new requests get 503 `draining`; queued
    /// and running requests finish.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
        metrics::gauge!(m::READY).set(0.0);
        if let Some(r) = self.ready.get() {
            r.scheduler.drain();
        }
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Client connections being served now.
    pub fn open_connections(&self) -> usize {
        self.connections.open()
    }
}

type Body = Full<Bytes>;

/// Accepts connections until the task is dropped.
pub async fn serve(listener: TcpListener, state: Arc<AppState>) -> anyhow::Result<()> {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => conn::accept(stream, &state),
            Err(e) => {
                // Out of file descriptors and the like: keep serving the connections we have.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Routes one request and adds the headers every answer carries. `head` is what the framing
/// tracker saw of this request, if it could follow the connection.
pub async fn handle(
    state: Arc<AppState>,
    req: Request<Incoming>,
    head: Option<Head>,
) -> Response<Body> {
    let request_id = request_id(&req);
    let refused = head.and_then(|h| head_problem(&state.settings, &h, &req));
    let answer = async move {
        match refused {
            Some(problem) => {
                if req.uri().path() == "/v1/systemone" {
                    m::count_request(problem.status, problem.code.as_str());
                }
                closing(problem_response(&problem))
            }
            None => route(state, req).await,
        }
    };
    let mut response = REQUEST_ID.scope(request_id.clone(), answer).await;
    if let Ok(v) = HeaderValue::from_str(&request_id) {
        response.headers_mut().insert("x-request-id", v);
    }
    response
}

tokio::task_local! {
    /// The id of the request being answered, for the problem bodies rendered on its task.
    static REQUEST_ID: String;
}

/// The problem with a request's head that hyper let through: ambiguous framing (smuggling), or
/// a head over the limits below hyper's own ceiling.
fn head_problem<B>(settings: &Settings, head: &Head, req: &Request<B>) -> Option<Problem> {
    if head.method != req.method().as_str() || head.target != req.uri().to_string() {
        // Never judge a request by another one's head.
        tracing::debug!(
            "framing tracker saw {} {}, hyper {} {}; not checked",
            head.method,
            head.target,
            req.method(),
            req.uri()
        );
        return None;
    }
    if let Some(why) = head.ambiguous {
        return Some(Problem::ambiguous_framing(why));
    }
    (head.bytes > settings.max_header_bytes || head.headers > settings.max_headers).then(|| {
        Problem::headers_too_large(
            head.bytes,
            head.headers,
            settings.max_header_bytes,
            settings.max_headers,
        )
    })
}

/// Marks an answer as the connection's last: hyper closes after writing it.
fn closing(mut r: Response<Body>) -> Response<Body> {
    r.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    r
}

/// Every route and the methods it answers; `docs/openapi.json` is checked against this list.
pub const ROUTES: &[(&str, &[Method])] = &[
    ("/v1/systemone", &[Method::POST]),
    ("/v1/models", &[Method::GET, Method::HEAD]),
    ("/health", &[Method::GET, Method::HEAD]),
    ("/livez", &[Method::GET, Method::HEAD]),
    ("/readyz", &[Method::GET, Method::HEAD]),
    ("/metrics", &[Method::GET, Method::HEAD]),
    ("/openapi.json", &[Method::GET, Method::HEAD]),
];

async fn route(state: Arc<AppState>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let Some(&(_, allowed)) = ROUTES.iter().find(|(route, _)| *route == path) else {
        return problem_response(&Problem::not_found(&path));
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
    let needs_auth = matches!(path.as_str(), "/v1/systemone" | "/v1/models");
    if needs_auth && !authorized(&state.settings, &req) {
        let mut r = problem_response(&Problem::unauthorized());
        r.headers_mut().insert(
            "www-authenticate",
            HeaderValue::from_static("Bearer realm=\"instinct\""),
        );
        if path == "/v1/systemone" {
            m::count_request(401, Code::Unauthorized.as_str());
        }
        return r;
    }
    match path.as_str() {
        "/v1/systemone" => {
            let r = systemone(&state, req).await;
            let code = problem_code(&r);
            m::count_request(r.status().as_u16(), code);
            r
        }
        "/health" => health(&state),
        "/livez" => livez(&state),
        "/readyz" => readyz(&state),
        "/v1/models" => models(&state),
        "/metrics" => Response::builder()
            .header(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")
            .body(Full::new(Bytes::from(m::render())))
            .expect("valid response"),
        "/openapi.json" => Response::builder()
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from_static(
                crate::openapi::DOCUMENT.as_bytes(),
            )))
            .expect("valid response"),
        _ => unreachable!("routes above"),
    }
}

/// Bearer-token check in constant time (the token's length is not secret).
fn authorized<B>(settings: &Settings, req: &Request<B>) -> bool {
    use subtle::ConstantTimeEq;
    let Some(key) = &settings.api_key else {
        return true;
    };
    let Some(given) = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return false;
    };
    given.len() == key.len() && bool::from(given.as_bytes().ct_eq(key.as_bytes()))
}

fn health(state: &AppState) -> Response<Body> {
    let (status, word) = match (state.ready().is_some(), state.is_draining()) {
        (true, false) => (StatusCode::OK, "ready"),
        (_, true) => (StatusCode::SERVICE_UNAVAILABLE, "draining"),
        (false, false) => (StatusCode::SERVICE_UNAVAILABLE, "loading"),
    };
    json_response(
        status,
        &json!({"status": word, "model": state.settings.model_id}),
    )
}

/// Alive unless an engine thread has stopped or stalled, or every engine is lost.
fn livez(state: &AppState) -> Response<Body> {
    if let Some(ready) = state.ready() {
        let now = Instant::now();
        let stats = ready.scheduler.stats();
        if stats.serving_engines() == 0 {
            return json_response(
                StatusCode::SERVICE_UNAVAILABLE,
                &json!({"status": "engines_lost", "engines": stats.engines.len()}),
            );
        }
        let wedged: Vec<usize> = stats
            .engines
            .iter()
            .enumerate()
            .filter(|(_, e)| e.is_wedged(now, state.settings.engine_stall))
            .map(|(i, _)| i)
            .collect();
        if !wedged.is_empty() {
            return json_response(
                StatusCode::SERVICE_UNAVAILABLE,
                &json!({"status": "wedged", "engines": wedged}),
            );
        }
    }
    json_response(StatusCode::OK, &json!({"status": "alive"}))
}

/// Ready when loaded, warmed up and not draining; the limits a client should know are listed.
fn readyz(state: &AppState) -> Response<Body> {
    let s = &state.settings;
    let limits = json!({
        "max_body_bytes": s.max_body_bytes,
        "max_prompt_tokens": s.max_prompt_tokens,
        "max_questions": contract::MAX_QUESTIONS,
        "max_options": contract::MAX_OPTIONS,
    });
    let engines = state.ready().map(|r| {
        let stats = r.scheduler.stats();
        (stats.serving_engines(), stats.engines.len())
    });
    match (engines, state.is_draining()) {
        (Some((0, _)), false) => with_retry_after(
            json_response(
                StatusCode::SERVICE_UNAVAILABLE,
                &json!({"status": "engines_lost"}),
            ),
            Duration::from_secs(1),
        ),
        // Ready while any engine serves; `engines` tells how much of the capacity is left.
        (Some((serving, total)), false) => json_response(
            StatusCode::OK,
            &json!({
                "status": "ready",
                "limits": limits,
                "engines": {"serving": serving, "lost": total - serving},
            }),
        ),
        (_, draining) => {
            let word = if draining { "draining" } else { "loading" };
            with_retry_after(
                json_response(StatusCode::SERVICE_UNAVAILABLE, &json!({"status": word})),
                Duration::from_secs(1),
            )
        }
    }
}

fn models(state: &AppState) -> Response<Body> {
    json_response(
        StatusCode::OK,
        &json!({
            "object": "list",
            "data": [{
                "id": state.settings.served_model_name,
                "object": "model",
                "owned_by": "instinct",
                "root": state.settings.model_id,
                "ready": state.ready().is_some() && !state.is_draining(),
            }]
        }),
    )
}

async fn systemone(state: &Arc<AppState>, req: Request<Incoming>) -> Response<Body> {
    let started = Instant::now();
    let settings = &state.settings;
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
    // Screenshot requests may be larger; text requests are held to their own limit after parsing.
    let screenshots = state
        .ready()
        .is_some_and(|r| r.preparer.serves_screenshots());
    let body_limit = if screenshots {
        settings
            .max_body_bytes
            .max(settings.max_screenshot_body_bytes)
    } else {
        settings.max_body_bytes
    };
    if declared.is_some_and(|n| n > body_limit as u64) {
        return problem_response(&Problem::body_too_large());
    }
    // Reserve the body's bytes before reading it (all the limit allows when its length is not
    // declared); refused at once when requests in flight hold the budget.
    let expected = declared.map_or(body_limit, |n| n as usize);
    let Some(mut held) = state.inflight.try_reserve(expected) else {
        return inflight_full(expected);
    };
    // The whole body within the body timeout: a client dripping it slowly cannot hold the
    // connection (and the memory of its partial body) for longer.
    let collect = Limited::new(req.into_body(), body_limit).collect();
    let body = match tokio::time::timeout(settings.body_timeout, collect).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
            return problem_response(&Problem::body_too_large());
        }
        // A broken chunk or a connection lost mid-body: what follows cannot be trusted.
        Ok(Err(e)) => return closing(problem_response(&Problem::unreadable_body(e))),
        Err(_) => {
            counter!(m::CONNECTION_TIMEOUTS_TOTAL, "phase" => "body").increment(1);
            return closing(problem_response(&Problem::body_timeout(
                settings.body_timeout,
            )));
        }
    };
    if state.is_draining() {
        return draining(Duration::from_secs(1));
    }
    if state.ready().is_none() {
        return with_retry_after(
            problem_response(&Problem::not_ready()),
            Duration::from_secs(1),
        );
    }
    let received = Instant::now();

    // Parsing, rendering and tokenization are CPU work: keep them off the reactor threads.
    let prep_state = state.clone();
    let body_bytes = body.len();
    if !held.resize(body_bytes) {
        // Unreachable: the body is never longer than what was reserved for it.
        return inflight_full(body_bytes);
    }
    let prepared = tokio::task::spawn_blocking(move || {
        let ready = prep_state.ready().expect("checked above");
        let (request, mut questions) = prepare(&prep_state.settings, &ready.preparer, &body)?;
        // Comparing the questions' ids is CPU work too.
        ready
            .preparer
            .keep_shared_prompts_whole(&mut questions, ready.scheduler.longest_whole_question());
        Ok((request, questions))
    })
    .await;
    let (request, mut questions) = match prepared {
        Ok(Ok(p)) => p,
        Ok(Err(problem)) => return problem_response(&problem),
        Err(e) => {
            tracing::error!("prepare task failed: {e}");
            return problem_response(&Problem::inference_failed());
        }
    };
    // Until answered: the parsed request (about the body's size) and what the questions hold,
    // with the prefix states of questions run in chunks (in this budget where the engines keep
    // them in host memory, in the device's where they keep them there). When those states do not
    // fit now, the questions run whole instead (as with chunking off) rather than waiting or
    // being refused.
    let holding = body_bytes + crate::engine::held_bytes(&questions);
    let ready = state.ready().expect("checked above");
    let chunk_states = ready
        .preparer
        .chunk_state_bytes(&questions, |q| ready.scheduler.chunk_size_for(q).is_some());
    let device_budget = ready
        .preparer
        .chunk_states_on_device()
        .then_some(&state.chunk_states);
    let Ok((chunked, _device_held)) =
        hold_chunk_states(&mut held, holding, chunk_states, device_budget)
    else {
        return inflight_full(holding);
    };
    if !chunked {
        for q in &mut questions {
            q.resumable = false;
        }
    }
    let prepared_at = Instant::now();
    histogram!(m::PREPARE_SECONDS).record((prepared_at - received).as_secs_f64());
    let model_id = if request.image.is_some() {
        multimodal_id(&settings.model_id)
    } else {
        settings.model_id.clone()
    };
    let input_tokens: usize = questions.iter().map(|q| q.ids.len()).sum();
    let n_options: Vec<usize> = questions.iter().map(|q| q.n_options).collect();

    let deadline = settings.request_timeout.map(|t| received + t);
    // Dropping the ticket (the client hung up and hyper dropped this future) cancels the request.
    let ticket = match ready.scheduler.submit(questions, deadline) {
        Ok(ticket) => ticket,
        Err(rejection) => {
            let retry = rejection.retry_after.unwrap_or(Duration::from_secs(1));
            return match rejection.reason {
                RejectReason::QueueFullRequests | RejectReason::QueueFullTokens => overloaded(
                    Code::Overloaded,
                    "the queue is full; retry after the time in Retry-After",
                    retry,
                ),
                RejectReason::Draining => draining(retry),
                RejectReason::NoEngine => {
                    with_retry_after(problem_response(&Problem::no_engine()), retry)
                }
                RejectReason::TooLarge => problem_response(&Problem::new(
                    Code::PromptTooLong,
                    format!(
                        "the request's {input_tokens} prompt tokens are more than this server can \
                         queue at once"
                    ),
                )),
                RejectReason::Invalid => {
                    tracing::error!("scheduler refused a validated request as invalid");
                    problem_response(&Problem::inference_failed())
                }
            };
        }
    };
    let answer = match ticket.await {
        Ok(answer) => answer,
        Err(Failure::DeadlineExceeded) => {
            return overloaded(
                Code::DeadlineExceeded,
                "the request waited in the queue longer than the server's request timeout",
                Duration::from_secs(1),
            )
        }
        Err(Failure::ShuttingDown) => return draining(Duration::from_secs(1)),
        Err(Failure::Internal(e)) => {
            tracing::error!("inference failed: {e}");
            return problem_response(&Problem::inference_failed());
        }
    };

    let body = match answer_body(
        &model_id,
        &request,
        &n_options,
        input_tokens,
        &answer.probabilities,
    ) {
        Ok(b) => b,
        Err(e) => {
            tracing::error!("answer rejected: {e:#}");
            return problem_response(&Problem::inference_failed());
        }
    };
    let done = Instant::now();
    histogram!(m::REQUEST_DURATION_SECONDS).record((done - received).as_secs_f64());
    histogram!(m::SCHEDULER_SECONDS).record((done - prepared_at).as_secs_f64());
    histogram!(m::REQUEST_PROMPT_TOKENS).record(input_tokens as f64);
    counter!(m::DECISIONS_TOTAL).increment(request.questions.len() as u64);
    counter!(m::PROMPT_TOKENS_TOTAL).increment(input_tokens as u64);

    let mut r = json_response(StatusCode::OK, &body);
    let timing = format!(
        "prepare;dur={:.3}, queue;dur={:.3}, infer;dur={:.3}, total;dur={:.3}",
        ms(prepared_at - received),
        ms(answer.queued),
        ms(answer.infer),
        ms(done - started)
    );
    r.headers_mut().insert(
        "server-timing",
        HeaderValue::from_str(&timing).expect("ascii"),
    );
    r
}

/// Validates the whole request, renders and tokenizes every question, and checks the prompt limit
/// for all of them before any model work. Public for the fuzz targets, which run it on arbitrary
/// bodies.
pub fn prepare(
    settings: &Settings,
    preparer: &Preparer,
    body: &[u8],
) -> Result<(ValidatedRequest, Vec<Question>), Problem> {
    let parsed = contract::parse_request_with(
        body,
        &settings.served_model_name,
        preparer.serves_screenshots(),
    );
    // Only a valid screenshot request may use the larger screenshot body limit.
    let over_text_limit = body.len() > settings.max_body_bytes;
    let request = match parsed {
        Ok(request) if over_text_limit && request.image.is_none() => {
            return Err(Problem::body_too_large())
        }
        Err(_) if over_text_limit => return Err(Problem::body_too_large()),
        parsed => parsed?,
    };
    let questions = match &request.image {
        // A request's questions are rendered and tokenized in parallel: each is independent, and
        // a request's prepare time is otherwise the sum of its questions'.
        None => request
            .questions
            .par_iter()
            .map(|q| {
                preparer
                    .render(&q.user)
                    .and_then(|chat| preparer.tokenize(&chat))
                    .map(|ids| Question::text(ids, q.option_keys.len()))
                    .map_err(|e| {
                        tracing::error!("prompt preparation failed: {e:#}");
                        Problem::inference_failed()
                    })
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(image) => {
            let users: Vec<(&str, usize)> = request
                .questions
                .iter()
                .map(|q| (q.user.as_str(), q.option_keys.len()))
                .collect();
            match preparer.screenshot_questions(image, &users) {
                Ok(prepared) => prepared.questions,
                Err(ScreenshotError::Image(detail)) => {
                    return Err(Problem::new(Code::InvalidImage, detail))
                }
                Err(ScreenshotError::Internal(e)) => {
                    tracing::error!("screenshot preparation failed: {e:#}");
                    return Err(Problem::inference_failed());
                }
            }
        }
    };
    let mut over = Vec::new();
    for (q, prepared) in request.questions.iter().zip(&questions) {
        if prepared.ids.len() > settings.max_prompt_tokens {
            over.push((q.name.as_str(), prepared.ids.len()));
        }
    }
    if let Some(problem) = Problem::prompts_too_long(&over, settings.max_prompt_tokens) {
        return Err(problem);
    }
    Ok((request, questions))
}

/// Builds the upstream-shaped answer: per question, in request order, the choice (first argmax),
/// the probabilities per option key in request order, and the normalized-entropy confidence.
fn answer_body(
    model_id: &str,
    request: &ValidatedRequest,
    n_options: &[usize],
    input_tokens: usize,
    probabilities: &[Vec<f32>],
) -> anyhow::Result<Value> {
    anyhow::ensure!(
        probabilities.len() == request.questions.len(),
        "engine answered {} of {} questions",
        probabilities.len(),
        request.questions.len()
    );
    let mut answers = Map::new();
    for ((q, p), &n) in request.questions.iter().zip(probabilities).zip(n_options) {
        anyhow::ensure!(
            p.len() == n && n == q.option_keys.len(),
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
        let mut probs = Map::new();
        for (key, &pk) in q.option_keys.iter().zip(p) {
            probs.insert(key.clone(), json!(f64::from(pk)));
        }
        let mut answer = Map::new();
        answer.insert("type".into(), json!("choice"));
        answer.insert("choice".into(), json!(q.option_keys[first_argmax(p)]));
        answer.insert("probabilities".into(), Value::Object(probs));
        answer.insert("confidence".into(), json!(confidence(p)));
        answers.insert(q.name.clone(), Value::Object(answer));
    }
    Ok(json!({
        "model": model_id,
        "answers": answers,
        "usage": {"input_tokens": input_tokens, "output_tokens": 0},
    }))
}

/// The identity of answers to screenshot questions: upstream's `…:multimodal` form.
fn multimodal_id(text_id: &str) -> String {
    match text_id.strip_suffix(":text") {
        Some(base) => format!("{base}:multimodal"),
        None => format!("{text_id}:multimodal"),
    }
}

/// 503 `draining`: this replica is shutting down; another one should take the request.
/// Holds `holding` bytes in `held` and, where a request has chunk states (`chunk_states > 0`),
/// those states too: in `device` when given (engines that keep them on the device), else in
/// `held`. Returns whether the states are held (its questions may run in chunks) and the device
/// reservation, which must live until the request is answered; `Err` when `holding` itself does
/// not fit.
fn hold_chunk_states(
    held: &mut crate::budget::Reservation,
    holding: usize,
    chunk_states: usize,
    device: Option<&Arc<ByteBudget>>,
) -> Result<(bool, Option<crate::budget::Reservation>), ()> {
    let (chunked, device_held) = match (chunk_states, device) {
        (0, _) => (false, None),
        (_, Some(device)) => {
            let reserved = device.try_reserve(chunk_states);
            (reserved.is_some(), reserved)
        }
        (_, None) => (held.resize(holding + chunk_states), None),
    };
    if chunk_states > 0 && !chunked {
        tracing::debug!(
            chunk_states,
            "chunk states do not fit their budget now: run whole"
        );
    }
    if (!chunked || device.is_some()) && !held.resize(holding) {
        return Err(());
    }
    Ok((chunked, device_held))
}

/// 503 for a request whose bytes do not fit the in-flight budget now.
fn inflight_full(bytes: usize) -> Response<Body> {
    overloaded(
        Code::Overloaded,
        &format!(
            "requests in flight hold the server's memory budget (--max-inflight-mib); this one \
             needs {bytes} bytes: retry after the time in Retry-After"
        ),
        Duration::from_secs(1),
    )
}

fn draining(retry_after: Duration) -> Response<Body> {
    overloaded(Code::Draining, "the server is shutting down", retry_after)
}

fn overloaded(code: Code, detail: &str, retry_after: Duration) -> Response<Body> {
    with_retry_after(problem_response(&Problem::new(code, detail)), retry_after)
}

/// Adds `Retry-After` in whole seconds, rounded up, at least 1.
fn with_retry_after(mut r: Response<Body>, after: Duration) -> Response<Body> {
    let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
    r.headers_mut()
        .insert("retry-after", HeaderValue::from(secs.max(1)));
    r
}

/// The problem `code` of an error response (read back for the request counter), `ok` for 2xx.
fn problem_code(r: &Response<Body>) -> &'static str {
    if r.status().is_success() {
        return "ok";
    }
    r.extensions()
        .get::<Code>()
        .map(|c| c.as_str())
        .unwrap_or("unknown")
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

pub(crate) fn new_request_id() -> String {
    use std::sync::atomic::AtomicU64;
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

fn ms(d: Duration) -> f64 {
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

/// An RFC 9457 problem response; its code rides along as an extension for the request counter.
/// Inside a request's task, the body carries the request's id.
pub fn problem_response(problem: &Problem) -> Response<Body> {
    let mut body = problem.clone();
    if body.request_id.is_none() {
        body.request_id = REQUEST_ID.try_with(Clone::clone).ok();
    }
    let mut r = Response::builder()
        .status(problem.status)
        .header(CONTENT_TYPE, crate::problem::CONTENT_TYPE)
        .body(Full::new(Bytes::from(body.to_json())))
        .expect("valid response");
    r.extensions_mut().insert(problem.code);
    r
}

#[cfg(test)]
mod tests {

    #[test]
    fn chunk_states_go_to_the_device_budget_where_the_engines_keep_them() {
        let host = ByteBudget::new(1000);
        let device = ByteBudget::with_gauges(500, ("test_device_used", "test_device_limit"));
        // Host states: the request and its states in one reservation; they fit.
        let mut held = host.try_reserve(100).unwrap();
        let (chunked, dev) = hold_chunk_states(&mut held, 300, 600, None).unwrap();
        assert!(chunked && dev.is_none());
        assert_eq!(host.used(), 900);
        drop(held);
        // Host states that do not fit: the request alone, run whole.
        let mut held = host.try_reserve(100).unwrap();
        let (chunked, _) = hold_chunk_states(&mut held, 300, 800, None).unwrap();
        assert!(!chunked);
        assert_eq!(host.used(), 300);
        drop(held);
        // Device states: the host holds the request only, the device its states, until dropped.
        let mut held = host.try_reserve(100).unwrap();
        let (chunked, dev) = hold_chunk_states(&mut held, 300, 450, Some(&device)).unwrap();
        assert!(chunked);
        assert_eq!((host.used(), device.used()), (300, 450));
        // A second request's states do not fit the device now: it runs whole.
        let mut other = host.try_reserve(10).unwrap();
        let (chunked, none) = hold_chunk_states(&mut other, 20, 100, Some(&device)).unwrap();
        assert!(!chunked && none.is_none());
        assert_eq!((host.used(), device.used()), (320, 450));
        drop(dev);
        assert_eq!(device.used(), 0);
        // A request that does not fit the host budget itself is refused, holding nothing more.
        let mut big = host.try_reserve(10).unwrap();
        assert!(hold_chunk_states(&mut big, 5000, 100, Some(&device)).is_err());
        assert_eq!(device.used(), 0);
        // No chunk states: nothing reserved on the device.
        let (chunked, none) = hold_chunk_states(&mut other, 20, 0, Some(&device)).unwrap();
        assert!(!chunked && none.is_none());
        drop((held, other, big));
    }

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

    #[test]
    fn bearer_tokens_are_checked() {
        let mut s = Settings::new("m", "id");
        let req = |auth: Option<&str>| {
            let mut b = Request::builder();
            if let Some(a) = auth {
                b = b.header(AUTHORIZATION, a);
            }
            b.body(()).unwrap()
        };
        assert!(authorized(&s, &req(None)), "no key configured: open");
        s.api_key = Some("secret".into());
        assert!(authorized(&s, &req(Some("Bearer secret"))));
        assert!(!authorized(&s, &req(Some("Bearer secreT"))));
        assert!(!authorized(&s, &req(Some("Bearer secret2"))));
        assert!(!authorized(&s, &req(Some("secret"))));
        assert!(!authorized(&s, &req(None)));
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        let r = |d| {
            with_retry_after(json_response(StatusCode::OK, &json!({})), d)
                .headers()
                .get("retry-after")
                .unwrap()
                .to_str()
                .unwrap()
                .to_string()
        };
        assert_eq!(r(Duration::from_millis(10)), "1");
        assert_eq!(r(Duration::from_millis(1500)), "2");
        assert_eq!(r(Duration::from_secs(7)), "7");
    }
}
