//! `instinct bench` on the built-in demo model (CPU): forward rows, a prompts file, the ceilings,
//! the HTTP rows against a real demo server, the vision tower rows, and the errors.

mod common;

use std::path::{Path, PathBuf};

use clap::Parser;
use instinct::bench::BenchArgs;
use instinct::cli::{Cli, Command};
use instinct_bench::{prompts_digest, Row, RowKind, PROMPTS_FORMAT};
use serde_json::{json, Value};

fn parse(args: &[&str]) -> Result<BenchArgs, clap::Error> {
    let argv = ["instinct", "bench"].iter().chain(args).copied();
    match Cli::try_parse_from(argv)?.command {
        Some(Command::Bench(args)) => Ok(*args),
        other => panic!("parsed as {other:?}"),
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("instinct-bench-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn read(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("{v} is not a number"))
}

/// Every row has its raw runs, ordered statistics and the analytic columns.
fn check_row(row: &Value, runs: usize, tokens: usize) {
    assert_eq!(row["runs"], runs, "{row}");
    assert_eq!(row["runs_ms"].as_array().unwrap().len(), runs);
    assert_eq!(row["tokens"], tokens);
    let (p10, median, p90) = (f(&row["p10_ms"]), f(&row["median_ms"]), f(&row["p90_ms"]));
    assert!(median > 0.0 && p10 <= median && median <= p90, "{row}");
    assert!(f(&row["min_ms"]) <= p10 && p90 <= f(&row["max_ms"]));
    assert!(f(&row["tokens_per_s"]) > 0.0);
    assert!(f(&row["flops"]["total"]) > f(&row["flops"]["dense"]));
    assert!(f(&row["flops"]["attention"]) > 0.0 && f(&row["flops"]["delta_rule"]) > 0.0);
    assert!(row["weight_bytes"].as_u64().unwrap() > 0);
}

#[test]
fn forward_rows_on_the_demo_model() {
    let dir = scratch("forward");
    let out = dir.join("bench.json");
    let ceilings = dir.join("peer.json");
    std::fs::write(
        &ceilings,
        json!({"device": "test", "ceilings": {"copy_GBps_read_plus_write": 50.0, "gemm_bf16_TFLOPs": 0.5}})
            .to_string(),
    )
    .unwrap();
    let args = parse(&[
        "--device",
        "cpu",
        "--lengths",
        "8,40,96",
        "--batch-sizes",
        "2,3",
        "--batch-prompt-tokens",
        "16",
        "--runs",
        "3",
        "--batch-runs",
        "2",
        "--warmup",
        "1",
        "--revision",
        "abc123",
        "--hardware",
        "test cpu",
        "--ceilings",
        ceilings.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ])
    .unwrap();
    instinct::bench::run(&args).unwrap();
    let report = read(&out);
    assert_eq!(report["mode"], "forward");
    assert_eq!(report["revision"], "abc123");
    assert_eq!(report["hardware"], "test cpu");
    assert_eq!(report["backend"], "cpu");
    assert_eq!(report["demo_model"], true);
    assert!(report["command"].is_array());
    assert!(f(&report["load"]["model_load_s"]) > 0.0);
    assert!(f(&report["warmup"]["first_call_ms"]) > 0.0);
    assert_eq!(report["limits"], json!({"max_tokens": 96, "max_seqs": 3}));
    assert_eq!(report["ceilings"]["measured"]["gemm_bf16_TFLOPs"], 0.5);
    assert_eq!(report["skipped"], json!([]));
    assert_eq!(
        report["prompts"]["sha256"].as_str().unwrap().len(),
        64,
        "{}",
        report["prompts"]
    );

    let latency = report["latency"].as_array().unwrap();
    let names: Vec<&str> = latency
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["8", "40", "96"]);
    for (row, tokens) in latency.iter().zip([8, 40, 96]) {
        check_row(row, 3, tokens);
        assert_eq!(row["questions"], 1);
        assert_eq!(row["warmup_ms"].as_array().unwrap().len(), 1);
        let p: Vec<f64> = row["probs_26"].as_array().unwrap().iter().map(f).collect();
        assert_eq!(p.len(), 26);
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-4);
        let ceiling = &row["ceiling"];
        let bound = f(&ceiling["bound_ms"]);
        assert_eq!(
            bound,
            f(&ceiling["bandwidth_ms"]).max(f(&ceiling["flops_ms"]))
        );
        let want_fraction = bound / f(&row["median_ms"]);
        assert!((f(&ceiling["fraction_of_ceiling"]) - want_fraction).abs() < 1e-12);
    }
    // Attention grows with the square of the length, the dense work linearly.
    let dense = |i: usize| f(&latency[i]["flops"]["dense"]);
    assert!((dense(2) / dense(0) - 12.0).abs() < 1e-9);

    let batch = report["batch"].as_array().unwrap();
    let names: Vec<&str> = batch.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["2x16", "3x16"]);
    for (row, questions) in batch.iter().zip([2, 3]) {
        check_row(row, 2, 16 * questions);
        assert_eq!(row["questions"], questions);
        assert_eq!(row["lengths"], json!(vec![16; questions]));
        assert_eq!(row["forward_passes"], 1);
        assert!(f(&row["questions_per_s"]) > 0.0);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--resume-tokens`: the timed runs resume each question from a snapshot of its first ids and
/// answer as the whole question does; a question no longer than the prefix runs whole.
#[test]
fn resumed_rows_answer_as_whole_ones() {
    let dir = scratch("resumed");
    let run = |resume: &str| {
        let out = dir.join(format!("bench-{resume}.json"));
        let args = parse(&[
            "--lengths",
            "8,40",
            "--batch-sizes",
            "2",
            "--batch-prompt-tokens",
            "30",
            "--runs",
            "2",
            "--batch-runs",
            "1",
            "--warmup",
            "1",
            "--resume-tokens",
            resume,
            "--out",
            out.to_str().unwrap(),
        ])
        .unwrap();
        instinct::bench::run(&args).unwrap();
        read(&out)
    };
    let (whole, resumed) = (run("0"), run("16"));
    let (want, got) = (
        whole["latency"].as_array().unwrap(),
        resumed["latency"].as_array().unwrap(),
    );
    for (w, g) in want.iter().zip(got) {
        let probs = |row: &Value| -> Vec<f64> {
            row["probs_26"].as_array().unwrap().iter().map(f).collect()
        };
        for (a, b) in probs(w).iter().zip(probs(g)) {
            assert!((a - b).abs() <= 1e-5, "{w} against {g}");
        }
        assert!(w.get("resumed_from_tokens").is_none());
    }
    assert!(
        got[0].get("resumed_from_tokens").is_none(),
        "8 ids run whole"
    );
    assert_eq!(got[1]["resumed_from_tokens"], json!([16]));
    assert_eq!(resumed["batch"][0]["resumed_from_tokens"], json!([16, 16]));
    let e = parse(&["--http", "http://127.0.0.1:1", "--resume-tokens", "16"]).unwrap_err();
    assert!(e.to_string().contains("--resume-tokens"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn prompts_file_ids_are_run_and_its_digest_is_checked() {
    let dir = scratch("prompts");
    let rows = vec![
        Row {
            name: "12".into(),
            kind: RowKind::Latency,
            seqs: vec![(100..112).collect()],
            source: Some("fixture-a".into()),
            text: None,
        },
        Row {
            name: "2x300".into(),
            kind: RowKind::Batch,
            seqs: vec![(0..10).collect(), (500..507).collect()],
            source: None,
            text: None,
        },
    ];
    let digest = prompts_digest(&rows);
    let mut file = json!({
        "format": PROMPTS_FORMAT,
        "generator": "test",
        "sha256": digest,
        "latency": [{"name": "12", "source": "fixture-a", "ids": rows[0].seqs[0]}],
        "batches": [{"name": "2x300", "questions": 2, "prompts": rows[1].seqs}],
    });
    let prompts = dir.join("prompts.json");
    let out = dir.join("bench.json");
    std::fs::write(&prompts, file.to_string()).unwrap();
    let argv = [
        "--prompts",
        prompts.to_str().unwrap(),
        "--runs",
        "2",
        "--batch-runs",
        "2",
        "--warmup",
        "0",
        "--out",
        out.to_str().unwrap(),
    ];
    instinct::bench::run(&parse(&argv).unwrap()).unwrap();
    let report = read(&out);
    assert_eq!(report["prompts"]["sha256"], digest.as_str());
    assert_eq!(report["latency"][0]["source"], "fixture-a");
    check_row(&report["latency"][0], 2, 12);
    check_row(&report["batch"][0], 2, 17);
    assert_eq!(report["batch"][0]["lengths"], json!([10, 7]));
    assert_eq!(report["ceilings"], Value::Null);
    assert_eq!(report["latency"][0]["ceiling"], Value::Null);

    // Ids that are not the digest's are refused.
    file["latency"][0]["ids"][0] = json!(101);
    std::fs::write(&prompts, file.to_string()).unwrap();
    let e = format!(
        "{:#}",
        instinct::bench::run(&parse(&argv).unwrap()).unwrap_err()
    );
    assert!(e.contains("SHA-256"), "{e}");
    // Ids outside the vocabulary are refused before any work.
    file["latency"][0]["ids"][0] = json!(5_000_000);
    file["sha256"] = json!(prompts_digest(&[
        Row {
            seqs: vec![file["latency"][0]["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect()],
            ..rows[0].clone()
        },
        rows[1].clone()
    ]));
    std::fs::write(&prompts, file.to_string()).unwrap();
    let e = format!(
        "{:#}",
        instinct::bench::run(&parse(&argv).unwrap()).unwrap_err()
    );
    assert!(e.contains("outside the model's vocabulary"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn refuses_long_prompts_unknown_devices_and_mixed_prompt_sources() {
    let run = |args: &[&str]| {
        let e = instinct::bench::run(&parse(args).unwrap()).unwrap_err();
        format!("{e:#}")
    };
    let e = run(&["--lengths", "20000", "--batch-sizes", "1"]);
    assert!(e.contains("--max-prompt-tokens 16384"), "{e}");
    let e = run(&[
        "--lengths",
        "64",
        "--batch-sizes",
        "1",
        "--max-prompt-tokens",
        "50",
    ]);
    assert!(
        e.contains("64 tokens is longer than --max-prompt-tokens 50"),
        "{e}"
    );
    let e = run(&[
        "--lengths",
        "64",
        "--batch-sizes",
        "4",
        "--max-batch-tokens",
        "100",
    ]);
    assert!(e.contains("do not fit in one forward pass"), "{e}");
    // An unknown device is refused by the command line itself, before anything loads.
    for device in ["tpu:0", "cuda", "cuda:first"] {
        let e = parse(&["--device", device, "--lengths", "8"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("expected cpu or cuda:N"), "{device}: {e}");
    }
    let e = run(&["--http", "https://127.0.0.1:1", "--lengths", "300"]);
    assert!(e.contains("expected http://host:port"), "{e}");
    assert!(parse(&["--prompts", "p.json", "--lengths", "8"]).is_err());
}

/// `--image-sizes`: the demo model's vision tower alone, one row per size, preprocessing and
/// encoding timed apart.
#[test]
fn vision_rows_on_the_demo_model() {
    let dir = scratch("vision");
    let out = dir.join("vision.json");
    let args = parse(&[
        "--image-sizes",
        "64x64,200x100",
        "--runs",
        "3",
        "--warmup",
        "1",
        "--seed",
        "11",
        "--out",
        out.to_str().unwrap(),
    ])
    .unwrap();
    instinct::bench::run(&args).unwrap();
    let report = read(&out);
    assert_eq!(report["mode"], "vision");
    assert_eq!(report["backend"], "cpu");
    assert_eq!(report["demo_model"], true);
    // The demo model brings its multimodal adapter, whose vision modules are merged.
    assert!(report["multimodal_adapter"].is_string(), "{report}");
    assert!(f(&report["load"]["tower_load_s"]) > 0.0);
    assert_eq!(
        report["settings"]["image_sizes"],
        json!(["64x64", "200x100"])
    );
    assert_eq!(report["skipped"], json!([]));
    assert!(report.get("latency").is_none() && report.get("prompts").is_none());
    let rows = report["vision"].as_array().unwrap();
    // smart_resize: 64x64 grows to 256x256 (the minimum pixels), 200x100 to 384x192.
    let want = [((64, 64), [1, 16, 16]), ((200, 100), [1, 12, 24])];
    assert_eq!(rows.len(), want.len());
    for (row, ((width, height), grid)) in rows.iter().zip(want) {
        assert_eq!(row["name"], format!("{width}x{height}"));
        assert_eq!(
            (row["width"].clone(), row["height"].clone()),
            (json!(width), json!(height))
        );
        assert_eq!(row["grid_thw"], json!(grid));
        let patches = grid.iter().product::<u64>();
        assert_eq!(row["patches"], patches, "{row}");
        assert_eq!(row["image_tokens"], patches / 4, "{row}");
        assert!(row["png_bytes"].as_u64().unwrap() > 0);
        assert_eq!(row["runs_requested"], 3);
        assert_eq!(row["cut_by_max_row_s"], false);
        for phase in ["preprocess", "encode"] {
            let s = &row[phase];
            assert_eq!(s["runs"], 3, "{phase}: {s}");
            assert_eq!(s["runs_ms"].as_array().unwrap().len(), 3);
            let (p10, median, p90) = (f(&s["p10_ms"]), f(&s["median_ms"]), f(&s["p90_ms"]));
            assert!(
                median > 0.0 && p10 <= median && median <= p90,
                "{phase}: {s}"
            );
            assert_eq!(row["warmup_ms"][phase].as_array().unwrap().len(), 1);
        }
        let flops = &row["flops"];
        assert!(
            f(&flops["attention"]) > 0.0 && f(&flops["blocks"]) > 0.0,
            "{flops}"
        );
        let total = f(&flops["total"]);
        let achieved = total / (f(&row["encode"]["median_ms"]) / 1e3) / 1e12;
        assert!((f(&row["achieved_TFLOPs"]) - achieved).abs() <= 1e-12 * achieved.max(1.0));
    }
    // More patches, more work.
    assert!(f(&rows[1]["flops"]["total"]) > f(&rows[0]["flops"]["total"]));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn refuses_malformed_image_sizes_and_text_options_beside_them() {
    for bad in ["64", "64x", "0x64", "64by64", "64x64,", "axb"] {
        let e = parse(&["--image-sizes", bad]).unwrap_err().to_string();
        assert!(e.contains("--image-sizes"), "{bad}: {e}");
        assert!(e.contains("expected WxH"), "{bad}: {e}");
    }
    for other in [
        &["--lengths", "8"][..],
        &["--http", "http://127.0.0.1:1"],
        &["--resume-tokens", "4"],
        &["--text-adapter", "t"],
    ] {
        let mut args = vec!["--image-sizes", "64x64"];
        args.extend_from_slice(other);
        let e = parse(&args).unwrap_err().to_string();
        assert!(e.contains("cannot be used with"), "{other:?}: {e}");
    }
    // The adapter is the tower's: without --image-sizes it is refused.
    let e = parse(&["--multimodal-adapter", "a"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("--image-sizes"), "{e}");
    // A size the server would refuse fails its row with the preprocessor's reason.
    let e = instinct::bench::run(&parse(&["--image-sizes", "4096x64", "--runs", "1"]).unwrap())
        .unwrap_err();
    let e = format!("{e:#}");
    assert!(e.contains("4096x64") && e.contains("2048"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_rows_against_the_demo_server() {
    let addr = common::start(true).await;
    let dir = scratch("http");
    let out = dir.join("http.json");
    let url = format!("http://{addr}");
    let args = parse(&[
        "--http",
        &url,
        "--wait-ready-s",
        "30",
        "--lengths",
        "240,300",
        "--runs",
        "3",
        "--warmup",
        "1",
        "--out",
        out.to_str().unwrap(),
    ])
    .unwrap();
    tokio::task::spawn_blocking(move || instinct::bench::run(&args))
        .await
        .unwrap()
        .unwrap();
    let report = read(&out);
    assert_eq!(report["mode"], "http");
    assert_eq!(report["url"], url.as_str());
    let rows = report["latency"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for (row, tokens) in rows.iter().zip([240, 300]) {
        check_row(row, 3, tokens);
        assert_eq!(row["target_tokens"], tokens);
        assert_eq!(row["exact_tokens"], true);
        assert!(f(&row["server_timing_median_ms"]["infer"]) > 0.0, "{row}");
        assert!(f(&row["server_timing_median_ms"]["total"]) <= f(&row["max_ms"]));
    }

    // Shorter than any request the native format can make: a clear error.
    let args = parse(&["--http", &url, "--lengths", "20", "--runs", "1"]).unwrap();
    let e = tokio::task::spawn_blocking(move || instinct::bench::run(&args))
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        format!("{e:#}").contains("shortest request built has"),
        "{e:#}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `tools/reference/bench_table.py` reads this report beside the committed peer reports (skipped
/// where no `python3` is installed).
#[test]
fn bench_table_reads_the_report() {
    if std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("no python3: skipped");
        return;
    }
    let dir = scratch("table");
    let out = dir.join("instinct.json");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let peers = root.join("docs/benchmarks/peers-h200");
    let torch = peers.join("peer_torch.json");
    let args = parse(&[
        "--lengths",
        "139,712",
        "--batch-sizes",
        "8",
        "--batch-prompt-tokens",
        "16",
        "--runs",
        "1",
        "--batch-runs",
        "1",
        "--warmup",
        "0",
        "--ceilings",
        torch.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ])
    .unwrap();
    instinct::bench::run(&args).unwrap();
    let table = std::process::Command::new("python3")
        .arg(root.join("tools/reference/bench_table.py"))
        .args([
            "--instinct",
            out.to_str().unwrap(),
            "--torch",
            torch.to_str().unwrap(),
        ])
        .arg("--fla")
        .arg(peers.join("peer_fla.json"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.status.success(),
        "{}",
        String::from_utf8_lossy(&table.stderr)
    );
    let row = |label: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("| {label}")))
            .unwrap_or_else(|| panic!("no row {label:?} in\n{text}"))
            .split('|')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(String::from)
            .collect::<Vec<_>>()
    };
    let r = row("139 ids, forward");
    assert_eq!(r[2], "91.4", "{r:?}"); // transformers eager, committed
    assert!(
        r[4].ends_with('×') && r[6].ends_with(" ms") && r[7].ends_with('%'),
        "{r:?}"
    );
    let r = row("8 × ~300 ids");
    assert!(r[6].ends_with("tok/s"), "{r:?}");
    assert_eq!(row("15,446 ids, forward")[1], "not measured");
    std::fs::remove_dir_all(&dir).unwrap();
}
