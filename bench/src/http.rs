//! `instinct bench --http URL`: one question at each latency length, over real HTTP to a
//! running `instinct serve`, single client, one kept-alive connection.
//!
//! A request's token ids cannot be chosen (the system prompt and the chat template are the
//! server's), so each request is a `cua-s1-native` question built from the row's fixture text
//! (app, task family, goal, options; `bench_prompts.py` puts it in the prompts file) whose
//! accessibility tree is cut, or repeated, to the length in characters that makes the prompt
//! exactly the row's token count. The count is made the way the server makes it (the request
//! contract, the snapshot's chat template and tokenizer), and each answer's
//! `usage.input_tokens` must equal it. Where a short row cannot hold every option (or the goal),
//! fewer options (then no goal) are used; the row records what it used.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderMap, ACCEPT, CONTENT_TYPE, USER_AGENT};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use instinct_model::chat::ChatTemplate;
use instinct_model::prompt::{LETTERS, SYSTEM_PROMPT};
use instinct_model::tokenizer::Tokenizer;
use serde_json::{json, Map, Value};

use crate::{
    push, summarize, Bench, ModelSource, OptionText, PromptSet, Row, RowKind, TextSource,
    UserMessageOf,
};

/// Most options a question letters (the request contract's limit: one letter each).
const MAX_OPTIONS: usize = LETTERS.len();
/// How far around the first fitting tree length to look for an exact token count.
const SCAN: usize = 24;
/// How many rotations of the tree's lines to try: a token count that one cut skips (a character
/// that adds two tokens) is usually reached with the lines in another order.
const ROTATIONS: usize = 8;
/// Longest wait for one answer.
const READ_TIMEOUT: Duration = Duration::from_secs(300);

pub(crate) fn run(
    bench: &mut Bench<'_>,
    url: &str,
    source: &ModelSource,
    prompts: &PromptSet,
    user_message_of: UserMessageOf<'_>,
) -> Result<()> {
    let args = bench.args;
    let client = Client::new(url)?;
    let tokenizer = Tokenizer::from_snapshot(&source.model_dir)?;
    let chat = ChatTemplate::from_snapshot(&source.model_dir)?;
    let server = Server {
        tokenizer: &tokenizer,
        chat: &chat,
        user_message_of,
    };
    bench.report.insert("url".into(), json!(url));
    bench.report.insert(
        "request_fitting".into(),
        json!(
            "cua-s1-native request from the row's fixture text, accessibility tree cut or \
               repeated to the character count that gives exactly the row's token count with the \
               snapshot's chat template and tokenizer (the server's); checked against each \
               answer's usage.input_tokens"
        ),
    );

    let waited = Instant::now();
    if args.wait_ready_s > 0.0 {
        client.wait_ready(Duration::from_secs_f64(args.wait_ready_s))?;
    }
    bench.report.insert(
        "server_ready_wait_s".into(),
        json!(waited.elapsed().as_secs_f64()),
    );
    bench.report.insert("latency".into(), json!([]));
    bench.report.insert("skipped".into(), json!([]));
    bench.save()?;

    let mut rows: Vec<_> = prompts
        .rows
        .iter()
        .filter(|r| r.kind == RowKind::Latency)
        .collect();
    ensure!(!rows.is_empty(), "--http needs latency rows");
    rows.sort_by_key(|r| r.tokens());
    let mut failed = Vec::new();
    for row in rows {
        let target = row.tokens();
        ensure!(
            target <= args.max_prompt_tokens,
            "row {}: a prompt of {target} tokens is longer than --max-prompt-tokens {} (the \
             longest question the server takes)",
            row.name,
            args.max_prompt_tokens
        );
        if bench.over_budget() {
            eprintln!("[bench] http {} skipped: past --budget-s", row.name);
            push(&mut bench.report, "skipped", json!(row.name));
            bench.save()?;
            continue;
        }
        match row_over_http(bench, &client, &server, row) {
            Ok(out) => push(&mut bench.report, "latency", Value::Object(out)),
            Err(e) => {
                eprintln!("[bench] http {} FAILED: {e:#}", row.name);
                failed.push(format!("{} ({e:#})", row.name));
                let out = json!({"name": row.name, "kind": "latency", "target_tokens": target,
                                 "error": format!("{e:#}")});
                push(&mut bench.report, "latency", out);
            }
        }
        bench.save()?;
    }
    bench.finish()?;
    ensure!(failed.is_empty(), "rows failed: {}", failed.join("; "));
    Ok(())
}

/// Fits one row's request, then its warm-up and timed requests; its report entry.
fn row_over_http(
    bench: &Bench<'_>,
    client: &Client,
    server: &Server<'_>,
    row: &Row,
) -> Result<Map<String, Value>> {
    let args = bench.args;
    let target = row.tokens();
    let text = row.text.clone().unwrap_or_else(synthetic_text);
    let fitter = Fitter::new(server, &text);
    let fitted = fitter
        .fit(target)
        .with_context(|| format!("row {}: building a request of {target} tokens", row.name))?;
    let tokens = fitted.ids.len();
    let body = Bytes::from(fitted.body.clone());
    let send = |timings: Option<&mut Vec<HashMap<String, f64>>>| -> Result<()> {
        let reply = client.send(Method::POST, "/v1/systemone", Some(body.clone()))?;
        check_answer(&reply, tokens)?;
        if let Some(t) = timings {
            t.push(server_timing_of(&reply.headers));
        }
        Ok(())
    };
    let mut warmups = Vec::new();
    for _ in 0..args.warmup {
        let t = Instant::now();
        send(None)?;
        warmups.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let mut timings = Vec::new();
    let wanted = args.runs.max(1);
    let (times, cut, _) = bench.timed_runs(wanted, || send(Some(&mut timings)))?;
    let stats = summarize(&times);
    let median = stats["median_ms"].as_f64().unwrap_or(f64::NAN);
    let mut out = Map::new();
    out.insert("name".into(), json!(row.name));
    out.insert("kind".into(), json!("latency"));
    out.insert("questions".into(), json!(1));
    out.insert("target_tokens".into(), json!(target));
    out.insert("tokens".into(), json!(tokens));
    out.insert("exact_tokens".into(), json!(tokens == target));
    out.insert(
        "source".into(),
        json!(text.source.clone().or_else(|| row.source.clone())),
    );
    out.insert("n_options".into(), json!(fitted.cut.n_options));
    out.insert("goal_included".into(), json!(fitted.cut.goal));
    out.insert("tree_rotation_lines".into(), json!(fitted.cut.rotation));
    out.insert("tree_chars".into(), json!(fitted.cut.tree_chars));
    out.insert("body_bytes".into(), json!(fitted.body.len()));
    out.insert("warmup_ms".into(), json!(warmups));
    out.insert("runs_requested".into(), json!(wanted));
    out.insert("cut_by_max_row_s".into(), json!(cut));
    if let Value::Object(s) = stats {
        out.extend(s);
    }
    out.insert("server_timing_median_ms".into(), timing_medians(&timings));
    out.extend(bench.cost_columns(&[&fitted.ids], median, fitted.cut.n_options));
    eprintln!(
        "[bench] http {}: {tokens} tokens (target {target}), median {median:.3} ms over {} \
         runs",
        row.name,
        times.len()
    );
    Ok(out)
}

/// How a request is cut from its fixture text.
#[derive(Clone, Copy, Debug)]
struct Cut {
    goal: bool,
    n_options: usize,
    /// Lines moved from the front of the tree to its end.
    rotation: usize,
    /// Characters of the (repeated) tree.
    tree_chars: usize,
}

/// A request of a chosen size, and the ids the server will make of it.
struct Fitted {
    body: Vec<u8>,
    ids: Vec<u32>,
    cut: Cut,
}

/// What the server makes of a request: its user message (the server's request contract), rendered
/// by the snapshot's chat template and counted by its tokenizer.
struct Server<'a> {
    tokenizer: &'a Tokenizer,
    chat: &'a ChatTemplate,
    user_message_of: UserMessageOf<'a>,
}

/// Builds requests from one fixture text with a tree of a given length, and counts their tokens.
struct Fitter<'a> {
    server: &'a Server<'a>,
    text: &'a TextSource,
    options: Vec<OptionText>,
    /// The tree's lines, each rotation of them (first line moved to the end) followed by a
    /// newline, to be repeated as far as needed.
    trees: Vec<Vec<char>>,
}

impl<'a> Fitter<'a> {
    fn new(server: &'a Server<'a>, text: &'a TextSource) -> Self {
        let mut options: Vec<OptionText> = text.options.iter().take(MAX_OPTIONS).cloned().collect();
        if options.is_empty() {
            options.push(OptionText {
                role: "Button".into(),
                label: "OK".into(),
                action: "click".into(),
                entity_id: None,
            });
        }
        let lines: Vec<&str> = if text.accessibility_tree.is_empty() {
            vec!["- Window"]
        } else {
            text.accessibility_tree.lines().collect()
        };
        let trees = (0..ROTATIONS.min(lines.len()))
            .map(|r| {
                let (head, tail) = lines.split_at(r);
                let rotated: Vec<&str> = tail.iter().chain(head).copied().collect();
                format!("{}\n", rotated.join("\n")).chars().collect()
            })
            .collect();
        Self {
            server,
            text,
            options,
            trees,
        }
    }

    fn body(&self, cut: Cut) -> Vec<u8> {
        let source = &self.trees[cut.rotation];
        let tree: String = (0..cut.tree_chars)
            .map(|i| source[i % source.len()])
            .collect();
        let criteria: Map<String, Value> = self.options[..cut.n_options]
            .iter()
            .enumerate()
            .map(|(i, o)| {
                let option = json!({
                    "role": o.role, "label": o.label, "action": o.action, "entity_id": o.entity_id,
                });
                (format!("o{i}"), option)
            })
            .collect();
        let instructions = if cut.goal {
            self.text.goal.as_str()
        } else {
            ""
        };
        json!({
            "prompt_format": "cua-s1-native",
            "state": {
                "app": self.text.app,
                "task_family": self.text.task_family,
                "accessibility_tree": tree,
            },
            "questions": {
                "q": {"type": "choice", "instructions": instructions, "criteria": criteria},
            },
        })
        .to_string()
        .into_bytes()
    }

    /// The request and the server's ids for it.
    fn build(&self, cut: Cut) -> Result<Fitted> {
        let body = self.body(cut);
        let server = self.server;
        let user = (server.user_message_of)(&body)?;
        let ids = server
            .tokenizer
            .encode(&server.chat.render(SYSTEM_PROMPT, &user)?)?;
        Ok(Fitted { body, ids, cut })
    }

    /// A request of exactly `target` tokens if one is found (else the nearest): the most options
    /// and the goal that fit, then the tree length (doubling, then bisection, then a scan around
    /// it), in one rotation of the tree's lines after another.
    fn fit(&self, target: usize) -> Result<Fitted> {
        let all = self.options.len();
        let has_goal = !self.text.goal.is_empty();
        let mut ladder = vec![(has_goal, all)];
        for n in [8, 4, 2] {
            ladder.push((has_goal, n.min(all)));
        }
        ladder.extend([(false, 2.min(all)), (false, 1)]);
        ladder.dedup();
        let mut shortest = usize::MAX;
        for (goal, n_options) in ladder {
            let mut best: Option<(usize, Cut)> = None;
            for rotation in 0..self.trees.len() {
                let cut = |tree_chars| Cut {
                    goal,
                    n_options,
                    rotation,
                    tree_chars,
                };
                let count = |chars: usize| self.build(cut(chars)).map(|f| f.ids.len());
                let first = count(1)?;
                shortest = shortest.min(first);
                if first > target {
                    break;
                }
                if first == target {
                    return self.build(cut(1));
                }
                // Smallest tree length reaching the target: double, then bisect (f(lo) < target).
                let (mut lo, mut hi) = (1usize, target.max(2));
                let cap = 64 * target + 4096;
                while count(hi)? < target {
                    lo = hi;
                    hi *= 2;
                    ensure!(
                        hi <= cap,
                        "the tree does not grow the prompt to {target} tokens"
                    );
                }
                while hi - lo > 1 {
                    let mid = lo + (hi - lo) / 2;
                    if count(mid)? < target {
                        lo = mid;
                    } else {
                        hi = mid;
                    }
                }
                for d in 0..=SCAN {
                    for chars in [hi.saturating_sub(d), hi + d] {
                        if chars == 0 {
                            continue;
                        }
                        let got = count(chars)?;
                        if got == target {
                            return self.build(cut(chars));
                        }
                        let miss = got.abs_diff(target);
                        if best.is_none_or(|(b, _)| miss < b) {
                            best = Some((miss, cut(chars)));
                        }
                    }
                }
            }
            if let Some((_, cut)) = best {
                return self.build(cut);
            }
        }
        bail!("the shortest request built has {shortest} tokens, more than {target}")
    }
}

/// A stand-in screen for rows without fixture text (synthetic prompts).
fn synthetic_text() -> TextSource {
    let tree: Vec<String> = (0..400)
        .map(|i| {
            let (x, y) = (40 * (i % 20), 24 * (i / 20));
            format!("- Button \"Item {i}\" @ [{x}, {y}, {}, {}]", x + 36, y + 20)
        })
        .collect();
    TextSource {
        source: Some("synthetic".into()),
        app: "Cua Driver".into(),
        task_family: "closed-candidate decision".into(),
        goal: "Open the item the task names.".into(),
        accessibility_tree: tree.join("\n"),
        options: (0..4)
            .map(|i| OptionText {
                role: "Button".into(),
                label: format!("Item {i}"),
                action: "click".into(),
                entity_id: None,
            })
            .collect(),
    }
}

/// A 200 answer to one question whose `usage.input_tokens` is `tokens`.
fn check_answer(reply: &Reply, tokens: usize) -> Result<()> {
    ensure!(
        reply.status == StatusCode::OK,
        "the server answered {}: {}",
        reply.status.as_u16(),
        String::from_utf8_lossy(&reply.body)
    );
    let body: Value = serde_json::from_slice(&reply.body).context("the answer is not JSON")?;
    let used = body["usage"]["input_tokens"].as_u64();
    ensure!(
        used == Some(tokens as u64),
        "the server counted {used:?} prompt tokens, the bench {tokens}: is it serving another \
         tokenizer or chat template than --model's?"
    );
    Ok(())
}

/// Every `Server-Timing` entry of an answer, by name.
fn server_timing_of(headers: &HeaderMap) -> HashMap<String, f64> {
    headers
        .get_all("server-timing")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(server_timing)
        .collect()
}

/// `name;dur=ms` entries of a `Server-Timing` header.
fn server_timing(header: &str) -> HashMap<String, f64> {
    header
        .split(',')
        .filter_map(|entry| {
            let mut parts = entry.trim().split(';');
            let name = parts.next()?.trim().to_string();
            let ms = parts.find_map(|p| p.trim().strip_prefix("dur=")?.parse().ok())?;
            Some((name, ms))
        })
        .collect()
}

fn timing_medians(timings: &[HashMap<String, f64>]) -> Value {
    let mut out = Map::new();
    for name in ["prepare", "queue", "infer", "total"] {
        let values: Vec<f64> = timings
            .iter()
            .filter_map(|t| t.get(name).copied())
            .collect();
        if !values.is_empty() {
            out.insert(name.into(), summarize(&values)["median_ms"].clone());
        }
    }
    Value::Object(out)
}

/// An HTTP answer, read whole.
struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

/// A single client on one kept-alive connection (a pool of one, which each request reuses in
/// turn), driven by its own current-thread runtime: the benchmark is blocking code, and a
/// request's time is the wall clock around `send`.
struct Client {
    /// `http://host[:port]`, no trailing slash.
    base: String,
    /// Declared before `runtime`, so that its connection is dropped first.
    http: HyperClient<HttpConnector, Full<Bytes>>,
    runtime: tokio::runtime::Runtime,
}

impl Client {
    fn new(url: &str) -> Result<Self> {
        let rest = url
            .strip_prefix("http://")
            .with_context(|| format!("--http {url}: expected http://host:port"))?
            .trim_end_matches('/');
        ensure!(
            !rest.is_empty() && !rest.contains('/'),
            "--http {url}: expected http://host:port (no path)"
        );
        let base = format!("http://{rest}");
        base.parse::<Uri>()
            .with_context(|| format!("--http {url}: expected http://host:port"))?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let http = HyperClient::builder(TokioExecutor::new())
            .pool_max_idle_per_host(1)
            .build(connector);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the HTTP client's runtime")?;
        Ok(Self {
            base,
            http,
            runtime,
        })
    }

    /// Polls `GET /readyz` until it answers 200.
    fn wait_ready(&self, limit: Duration) -> Result<()> {
        let t = Instant::now();
        loop {
            let last = match self.send(Method::GET, "/readyz", None) {
                Ok(reply) if reply.status == StatusCode::OK => return Ok(()),
                Ok(reply) => format!("/readyz answered {}", reply.status.as_u16()),
                Err(e) => format!("{e:#}"),
            };
            if t.elapsed() > limit {
                bail!(
                    "the server at {} was not ready after {limit:?}: {last}",
                    self.base
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Sends a request (a JSON body if any) and reads the whole answer, within [`READ_TIMEOUT`].
    fn send(&self, method: Method, path: &str, body: Option<Bytes>) -> Result<Reply> {
        let what = format!("{method} {}{path}", self.base);
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header(USER_AGENT, "instinct-bench")
            .header(ACCEPT, "application/json");
        if body.is_some() {
            request = request.header(CONTENT_TYPE, "application/json");
        }
        let request = request.body(Full::new(body.unwrap_or_default()))?;
        let exchange = async {
            let response = self.http.request(request).await?;
            let (parts, body) = response.into_parts();
            let body = body.collect().await?.to_bytes();
            anyhow::Ok(Reply {
                status: parts.status,
                headers: parts.headers,
                body,
            })
        };
        self.runtime
            .block_on(async { tokio::time::timeout(READ_TIMEOUT, exchange).await })
            .map_err(|_| anyhow!("{what}: no answer within {READ_TIMEOUT:?}"))?
            .with_context(|| what)
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use hyper::service::service_fn;
    use hyper::Response;
    use hyper_util::rt::TokioIo;

    use super::*;

    /// The timed requests of a row go over one connection: none is opened per request.
    #[test]
    fn requests_share_one_kept_alive_connection() {
        let server = tokio::runtime::Runtime::new().unwrap();
        let listener = server
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        server.spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let answer = service_fn(|_| async {
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"{}"))))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), answer)
                        .await;
                });
            }
        });
        let client = Client::new(&format!("http://{addr}")).unwrap();
        client.wait_ready(Duration::from_secs(5)).unwrap();
        for _ in 0..5 {
            let body = Some(Bytes::from_static(b"{}"));
            let reply = client.send(Method::POST, "/v1/systemone", body).unwrap();
            assert_eq!(reply.status, StatusCode::OK);
            assert_eq!(&reply.body[..], b"{}");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn server_timing_parses() {
        let t = server_timing("prepare;dur=0.250, queue;dur=1.5, infer;dur=10.000, total;dur=12");
        assert_eq!(t["prepare"], 0.25);
        assert_eq!(t["queue"], 1.5);
        assert_eq!(t["infer"], 10.0);
        assert_eq!(t["total"], 12.0);
    }

    #[test]
    fn urls_parse() {
        assert_eq!(
            Client::new("http://127.0.0.1:8000/").unwrap().base,
            "http://127.0.0.1:8000"
        );
        assert_eq!(
            Client::new("http://localhost").unwrap().base,
            "http://localhost"
        );
        assert!(Client::new("https://x:1").is_err());
        assert!(Client::new("http://x:1/v1").is_err());
    }
}
