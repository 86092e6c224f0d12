//! One client connection, as hostile clients see it: a bound on open connections (beyond it a
//! connection is answered 503 at once and closed, except an orchestrator's probe, which is
//! answered), hyper's HTTP/1 limits on the request head
//! (time, size, count), a response write that makes no progress for too long dropping the
//! connection, and the framing tracker ([`crate::framing`]) whose verdict the handler reads.
//!
//! Limits that hyper enforces itself:
//! - the whole head must arrive within `header_timeout`; the timer also runs while a keep-alive
//!   connection waits for its next request, so it bounds idle connections too. hyper closes the
//!   connection without an answer (it has no way to send one).
//! - heads over [`HARD_LIMIT_FACTOR`] times `--max-header-bytes` or `--max-headers` get hyper's
//!   own 431, which has no body, and the connection is closed without reading further. Heads
//!   between the limit and that ceiling get a 431 problem body from the handler.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::server::conn::http1;
use metrics::{counter, gauge};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;

use crate::framing::{Head, Tracker};
use crate::metrics as m;
use crate::problem::{Code, Problem};
use crate::server::{self, AppState};

/// Default of `--header-timeout-ms`.
pub const DEFAULT_HEADER_TIMEOUT_MS: u64 = 10_000;
/// Default of `--body-timeout-ms`.
pub const DEFAULT_BODY_TIMEOUT_MS: u64 = 30_000;
/// Default of `--write-timeout-ms`.
pub const DEFAULT_WRITE_TIMEOUT_MS: u64 = 10_000;
/// Default of `--max-header-bytes`.
pub const DEFAULT_MAX_HEADER_BYTES: usize = 16 * 1024;
/// Default of `--max-headers`.
pub const DEFAULT_MAX_HEADERS: usize = 100;
/// Default of `--max-connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// hyper refuses heads over this many times the configured limits by itself (a bare 431); the
/// handler answers the ones in between with a problem body.
pub const HARD_LIMIT_FACTOR: usize = 2;

/// Refused connections being answered at once; past it, more are closed without an answer, so a
/// connection flood cannot turn the refusals themselves into a pile-up.
const MAX_REFUSING: usize = 256;
/// Longest a refused connection is kept to deliver its 503.
const REFUSAL_LINGER: Duration = Duration::from_secs(1);

/// The open connections of one server.
#[derive(Debug, Default)]
pub struct Connections {
    open: AtomicUsize,
    refusing: AtomicUsize,
}

impl Connections {
    /// Connections being served now (refused ones not counted).
    pub fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }
}

/// A place among the open connections, given back when dropped.
struct Slot(Arc<AppState>);

impl Slot {
    fn take(state: &Arc<AppState>) -> Option<Slot> {
        let max = state.settings.max_connections;
        let open = &state.connections.open;
        open.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
            (n < max).then_some(n + 1)
        })
        .ok()?;
        gauge!(m::CONNECTIONS_OPEN).increment(1.0);
        Some(Slot(state.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.connections.open.fetch_sub(1, Ordering::SeqCst);
        gauge!(m::CONNECTIONS_OPEN).decrement(1.0);
    }
}

/// Serves one accepted connection, or refuses it when `--max-connections` are open.
pub fn accept(stream: TcpStream, state: &Arc<AppState>) {
    let _ = stream.set_nodelay(true);
    match Slot::take(state) {
        Some(slot) => {
            tokio::spawn(serve(stream, slot));
        }
        None => refuse(stream, state),
    }
}

/// What the connection's IO and its handler share.
struct Shared {
    tracker: Mutex<Tracker>,
    write_timed_out: AtomicBool,
}

async fn serve(stream: TcpStream, slot: Slot) {
    let state = slot.0.clone();
    let s = &state.settings;
    let ceiling_bytes = s.max_header_bytes * HARD_LIMIT_FACTOR;
    let ceiling_headers = s.max_headers * HARD_LIMIT_FACTOR;
    let shared = Arc::new(Shared {
        tracker: Mutex::new(Tracker::new(ceiling_bytes, ceiling_headers)),
        write_timed_out: AtomicBool::new(false),
    });
    let io = hyper_util::rt::TokioIo::new(Guarded {
        io: stream,
        shared: shared.clone(),
        write_timeout: s.write_timeout,
        stall: None,
    });
    let handler_shared = shared.clone();
    let handler_state = state.clone();
    let service = hyper::service::service_fn(move |req| {
        // hyper calls this once per request, in order: the tracker's next head is this one's.
        let head: Option<Head> = handler_shared.tracker.lock().next_head();
        let state = handler_state.clone();
        async move { Ok::<_, Infallible>(server::handle(state, req, head).await) }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(s.header_timeout)
        .max_header_size(ceiling_bytes)
        .max_headers(ceiling_headers);
    if let Err(e) = builder.serve_connection(io, service).await {
        let phase = if shared.write_timed_out.load(Ordering::SeqCst) {
            Some("write")
        } else if e.is_timeout() {
            Some(if shared.tracker.lock().mid_head() {
                "head"
            } else {
                "idle"
            })
        } else {
            None
        };
        if let Some(phase) = phase {
            counter!(m::CONNECTION_TIMEOUTS_TOTAL, "phase" => phase).increment(1);
        }
        tracing::debug!("connection ended: {e}");
    }
    drop(slot);
}

/// Answers a connection past the limit: an orchestrator's probe (`GET /livez`, `/readyz` or
/// `/health` as its first bytes) is served as usual, one request and closed, so a connection flood
/// does not make the orchestrator restart or unroute a replica that is only busy; anything else
/// gets 503 `too_many_connections` without its request being read, then the connection closes.
fn refuse(stream: TcpStream, state: &Arc<AppState>) {
    let refusing = &state.connections.refusing;
    if refusing.fetch_add(1, Ordering::SeqCst) >= MAX_REFUSING {
        refusing.fetch_sub(1, Ordering::SeqCst);
        counter!(m::CONNECTIONS_REFUSED_TOTAL).increment(1);
        return;
    }
    let state = state.clone();
    tokio::spawn(async move {
        let answer = async {
            if is_probe(&stream).await {
                serve_probe(stream, &state).await;
                Ok(())
            } else {
                counter!(m::CONNECTIONS_REFUSED_TOTAL).increment(1);
                answer_refusal(stream, &state).await
            }
        };
        let _ = tokio::time::timeout(REFUSAL_LINGER, answer).await;
        state.connections.refusing.fetch_sub(1, Ordering::SeqCst);
    });
}

/// The paths answered past the connection limit.
const PROBE_PATHS: &[&str] = &["/livez", "/readyz", "/health"];
/// How long a connection past the limit may take to show its request line before it is refused.
const PROBE_PEEK: Duration = Duration::from_millis(50);

/// Whether the connection's first bytes (peeked, not consumed) are a probe's request line.
async fn is_probe(stream: &TcpStream) -> bool {
    let mut first = [0u8; 32];
    let Ok(Ok(n)) = tokio::time::timeout(PROBE_PEEK, stream.peek(&mut first)).await else {
        return false;
    };
    let line = &first[..n];
    ["GET ", "HEAD "].iter().any(|method| {
        line.strip_prefix(method.as_bytes()).is_some_and(|rest| {
            PROBE_PATHS.iter().any(|path| {
                rest.strip_prefix(path.as_bytes())
                    .is_some_and(|after| after.starts_with(b" ") || after.starts_with(b"?"))
            })
        })
    })
}

/// One probe request on a connection past the limit, then close. Only the first request is
/// served (keep-alive off), and only a probe path is answered: a client that peeked as a probe
/// and sent something else still gets the refusal.
async fn serve_probe(stream: TcpStream, state: &Arc<AppState>) {
    let state = state.clone();
    let service = hyper::service::service_fn(move |req| {
        let state = state.clone();
        async move {
            let mut response = if PROBE_PATHS.contains(&req.uri().path()) {
                server::handle(state, req, None).await
            } else {
                counter!(m::CONNECTIONS_REFUSED_TOTAL).increment(1);
                server::problem_response(&too_many_connections(&state))
            };
            response.headers_mut().insert(
                hyper::header::CONNECTION,
                hyper::header::HeaderValue::from_static("close"),
            );
            Ok::<_, Infallible>(response)
        }
    });
    let io = hyper_util::rt::TokioIo::new(stream);
    let _ = http1::Builder::new()
        .keep_alive(false)
        .serve_connection(io, service)
        .await;
}

fn too_many_connections(state: &AppState) -> Problem {
    Problem::new(
        Code::TooManyConnections,
        format!(
            "this server has its {} connections open (--max-connections); retry after the \
             time in Retry-After",
            state.settings.max_connections
        ),
    )
}

async fn answer_refusal(mut stream: TcpStream, state: &AppState) -> io::Result<()> {
    let request_id = server::new_request_id();
    let mut problem = too_many_connections(state);
    problem.request_id = Some(request_id.clone());
    let body = problem.to_json();
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: {}\r\nretry-after: 1\r\n\
         connection: close\r\nx-request-id: {request_id}\r\ncontent-length: {}\r\n\r\n",
        crate::problem::CONTENT_TYPE,
        body.len()
    );
    stream.write_all(&[head.as_bytes(), &body].concat()).await?;
    stream.shutdown().await?;
    // Read until the client closes: closing with its request unread would reset the connection,
    // and a reset can destroy the answer before the client reads it.
    let mut sink = [0u8; 4096];
    while stream.read(&mut sink).await? > 0 {}
    Ok(())
}

/// The connection's socket, with the framing tracker fed from every read and a write timeout.
struct Guarded {
    io: TcpStream,
    shared: Arc<Shared>,
    write_timeout: Duration,
    /// Running while a write makes no progress.
    stall: Option<Pin<Box<Sleep>>>,
}

impl Guarded {
    /// Passes a write's result on; a write pending for longer than the write timeout fails.
    fn stalled<T>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if r.is_ready() {
            self.stall = None;
            return r;
        }
        let timeout = self.write_timeout;
        let stall = self
            .stall
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        if stall.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.shared.write_timed_out.store(true, Ordering::SeqCst);
        // Reset instead of a graceful close: the kernel drops the unread answer at once rather
        // than keep retrying it to a client that does not read.
        let _ = self.io.set_zero_linger();
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the client stopped reading its response",
        )))
    }
}

impl AsyncRead for Guarded {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.io).poll_read(cx, buf);
        let read = &buf.filled()[before..];
        if !read.is_empty() {
            this.shared.tracker.lock().feed(read);
        }
        r
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write(cx, buf);
        this.stalled(cx, r)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.stalled(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_flush(cx);
        this.stalled(cx, r)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_shutdown(cx);
        this.stalled(cx, r)
    }
}
