//! Every metric that the Grafana dashboard (deploy/grafana/instinct.json) or the alert rules
//! (deploy/prometheus/rules.yml) read is one that the server exports: the real `instinct serve`
//! binary runs the demo model, answers text and screenshot requests, rejects a burst, and its
//! `/metrics` is scraped. A renamed metric, or a panel or alert on a metric that does not exist,
//! fails here instead of showing an empty panel or an alert that can never fire.

mod common;

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::*;
use serde_json::Value;

/// Series Prometheus makes itself, not the server.
const PROMETHEUS_OWN: &[&str] = &["up"];

/// Metrics the server exports only on a GPU (`--device cuda:N`), with the constant that names
/// them, so a rename on the server side still fails this test.
const GPU_ONLY: &[&str] = &[
    instinct::metrics::DEVICE_MEMORY_BYTES,
    instinct::metrics::GRAPH_REPLAYS_TOTAL,
    instinct::metrics::GRAPH_MISSES_TOTAL,
    instinct::metrics::GRAPH_FAILED_SHAPES,
    instinct::metrics::GRAPH_EVICTIONS_TOTAL,
];

fn repo_file(path: &str) -> String {
    let full = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// Metric names in a PromQL expression: identifiers standing where a series selector stands.
/// Skipped: strings, comments, label matchers `{...}`, ranges `[...]`, Grafana variables `$x`,
/// numbers and durations, function names (followed by `(`), keywords, and the label lists of
/// `by`/`without`/`on`/`ignoring`/`group_left`/`group_right`.
fn metric_names(expr: &str) -> BTreeSet<String> {
    // Aggregations may put `by (...)` before their parenthesis, so they are not always followed
    // by `(`; no metric is named like one.
    const KEYWORDS: &[&str] = &[
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "inf",
        "nan",
        "sum",
        "min",
        "max",
        "avg",
        "count",
        "group",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
    ];
    const LABEL_LISTS: &[&str] = &[
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    let chars: Vec<char> = expr.chars().collect();
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    // Index just past the bracket that closes the one at `open`, minding strings.
    let skip_group = |open: usize, close: char| {
        let opener = chars[open];
        let (mut depth, mut i, mut in_string) = (0usize, open, false);
        while i < chars.len() {
            let c = chars[i];
            if in_string {
                if c == '\\' {
                    i += 1;
                } else if c == '"' {
                    in_string = false;
                }
            } else if c == '"' {
                in_string = true;
            } else if c == opener {
                depth += 1;
            } else if c == close {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            i += 1;
        }
        chars.len()
    };
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => {
                i += 1;
                while i < chars.len() && chars[i] != c {
                    i += if chars[i] == '\\' { 2 } else { 1 };
                }
                i += 1;
            }
            '#' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '{' => i = skip_group(i, '}'),
            '[' => i = skip_group(i, ']'),
            '$' => {
                i += 1;
                while i < chars.len() && is_word(chars[i]) {
                    i += 1;
                }
            }
            c if c.is_ascii_digit() || c == '.' => {
                while i < chars.len() && (is_word(chars[i]) || chars[i] == '.') {
                    i += 1;
                }
            }
            c if is_word(c) => {
                let start = i;
                while i < chars.len() && is_word(chars[i]) {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let next = (i..chars.len()).find(|&j| !chars[j].is_whitespace());
                let before_paren = next.is_some_and(|j| chars[j] == '(');
                if LABEL_LISTS.contains(&word.as_str()) {
                    if let Some(j) = next.filter(|_| before_paren) {
                        i = skip_group(j, ')');
                    }
                } else if !before_paren && !KEYWORDS.contains(&word.to_ascii_lowercase().as_str()) {
                    names.insert(word);
                }
            }
            _ => i += 1,
        }
    }
    names
}

/// The `expr` of every rule in rules.yml (single-line or `|` block).
fn rule_expressions(yaml: &str) -> Vec<String> {
    let lines: Vec<&str> = yaml.lines().collect();
    let mut exprs = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix("expr:") {
            let indent = line.len() - trimmed.len();
            if rest.trim() == "|" {
                let mut block = String::new();
                i += 1;
                while i < lines.len() {
                    let l = lines[i];
                    let own_indent = l.len() - l.trim_start().len();
                    if !l.trim().is_empty() && own_indent <= indent {
                        break;
                    }
                    block.push_str(l);
                    block.push('\n');
                    i += 1;
                }
                exprs.push(block);
                continue;
            }
            exprs.push(rest.trim().to_string());
        }
        i += 1;
    }
    exprs
}

/// `(panel title, exprs)` of every panel that is not a row.
fn dashboard_panels(dashboard: &Value) -> Vec<(String, Vec<String>)> {
    dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .filter(|p| p["type"] != "row")
        .map(|p| {
            let exprs = p["targets"]
                .as_array()
                .map(|ts| {
                    ts.iter()
                        .filter_map(|t| t["expr"].as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            (
                p["title"].as_str().unwrap_or("(untitled)").to_string(),
                exprs,
            )
        })
        .collect()
}

/// Metric names exported in a text exposition: `# TYPE` families, histograms by base name.
fn exported(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// A name as written in PromQL, mapped to the family it belongs to (`_bucket`, `_sum` and
/// `_count` of a histogram belong to the histogram).
fn family<'a>(name: &'a str, histograms: &BTreeSet<String>) -> &'a str {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix) {
            if histograms.contains(base) {
                return base;
            }
        }
    }
    name
}

async fn get(addr: std::net::SocketAddr, path: &str) -> Reply {
    exchange(addr, &format!("GET {path} HTTP/1.1"), b"").await
}

fn text_request(tag: usize) -> String {
    format!(
        r#"{{"state":"- Button \"Save {tag}\"\n- Button \"Cancel\"","questions":{{"q":{{"type":"choice","instructions":"Save?","criteria":{{"save":"Save","cancel":"Cancel"}}}}}}}}"#
    )
}

fn screenshot_request() -> String {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../model/tests/data/images/png_rgb_320x240.png"
    );
    let png = std::fs::read(path).unwrap();
    let data = base64::engine::general_purpose::STANDARD.encode(png);
    format!(
        r#"{{"state":{{"image":"data:image/png;base64,{data}"}},"questions":{{"q":{{"type":"choice","instructions":"Save","criteria":{{"save":"Save","cancel":"Cancel"}}}}}}}}"#
    )
}

#[test]
fn expressions_are_parsed_into_metric_names() {
    let names = metric_names(
        r#"histogram_quantile(0.99, sum by (namespace, le) (rate(instinct_x_bucket{a="b{c}"}[5m]))) > 0.25 and on (pod) up == 0 # instinct_comment"#,
    );
    assert_eq!(
        names,
        BTreeSet::from(["instinct_x_bucket".to_string(), "up".to_string()])
    );
    let exprs = rule_expressions("      - alert: A\n        expr: up == 0\n      - alert: B\n        expr: |\n          a\n          > 1\n        for: 5m\n");
    assert_eq!(
        exprs,
        vec![
            "up == 0".to_string(),
            "          a\n          > 1\n".to_string()
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_metric_in_the_dashboard_and_the_alerts_is_exported() {
    // What the deploy files read.
    let dashboard: Value =
        serde_json::from_str(&repo_file("deploy/grafana/instinct.json")).unwrap();
    let panels = dashboard_panels(&dashboard);
    assert!(panels.len() >= 10, "{} panels", panels.len());
    let mut wanted: Vec<(String, String)> = Vec::new(); // (metric, where)
    for (title, exprs) in &panels {
        assert!(!exprs.is_empty(), "panel {title:?} has no query");
        for expr in exprs {
            let names = metric_names(expr);
            assert!(!names.is_empty(), "panel {title:?}: no metric in {expr}");
            wanted.extend(names.into_iter().map(|n| (n, format!("panel {title:?}"))));
        }
    }
    // The autoscaler's query and the dashboard's variables read metrics too.
    let scaler = repo_file("deploy/k8s/scaledobject.yaml");
    let scaler_queries: Vec<&str> = scaler
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("query:"))
        .collect();
    assert!(!scaler_queries.is_empty(), "no query in scaledobject.yaml");
    for query in scaler_queries {
        wanted.extend(
            metric_names(query)
                .into_iter()
                .map(|n| (n, "KEDA query".to_string())),
        );
    }
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(definition) = variable["definition"].as_str() {
            // label_values(SELECTOR, label): the selector's metric.
            let selector = definition
                .trim_start_matches("label_values(")
                .rsplit_once(',')
                .map_or(definition, |(selector, _)| selector);
            let place = format!("variable {}", variable["name"]);
            wanted.extend(
                metric_names(selector)
                    .into_iter()
                    .map(|n| (n, place.clone())),
            );
        }
    }
    let rules = rule_expressions(&repo_file("deploy/prometheus/rules.yml"));
    assert!(rules.len() >= 8, "{} alert expressions", rules.len());
    for expr in &rules {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "no metric in alert {expr}");
        wanted.extend(
            names
                .into_iter()
                .map(|n| (n, format!("alert `{}`", expr.trim()))),
        );
    }

    // What the server exports after real traffic: text answers, a screenshot answered twice
    // (a cache miss, then a hit) and a burst over a queue of one (rejections).
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_instinct"))
        .args(["serve", "--bind", &format!("127.0.0.1:{port}")])
        .args(["--max-queue-requests", "1", "--max-batch-seqs", "1"])
        .env("INSTINCT_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting instinct serve");
    let _server = KillOnDrop(child);
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        if tokio::net::TcpStream::connect(addr).await.is_ok()
            && get(addr, "/readyz").await.status == 200
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the demo server never became ready"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(post(addr, &text_request(0)).await.status, 200);
    for _ in 0..2 {
        assert_eq!(post(addr, &screenshot_request()).await.status, 200);
    }
    let mut rejected = 0;
    for round in 0..5 {
        let burst: Vec<_> = (0..12)
            .map(|i| {
                tokio::spawn(async move { post(addr, &text_request(round * 100 + i + 1)).await })
            })
            .collect();
        for reply in burst {
            match reply.await.unwrap().status {
                200 => {}
                503 => rejected += 1,
                s => panic!("status {s}"),
            }
        }
        if rejected > 0 {
            break;
        }
    }
    assert!(rejected > 0, "bursts of 12 never overflowed a queue of 1");
    let scrape = get(addr, "/metrics").await;
    assert_eq!(scrape.status, 200);
    let exposition = String::from_utf8(scrape.body).unwrap();
    let families = exported(&exposition);
    let histograms: BTreeSet<String> = exposition
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter(|l| l.ends_with(" histogram"))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect();

    let mut missing = BTreeSet::new();
    for (name, place) in &wanted {
        let base = family(name, &histograms);
        if families.contains(base) || PROMETHEUS_OWN.contains(&base) || GPU_ONLY.contains(&base) {
            continue;
        }
        missing.insert(format!("{name} ({place})"));
    }
    assert!(
        missing.is_empty(),
        "read by the deploy files but not exported:\n  {}\nexported: {families:?}",
        missing.into_iter().collect::<Vec<_>>().join("\n  ")
    );
    // A GPU-only metric must at least be one the server declares.
    for name in GPU_ONLY {
        assert!(name.starts_with("instinct_"), "{name}");
    }
}
