//! `instinct serve`: bind, load the model (the built-in demo without `--model`), run a real
//! warm-up decision, then answer. The socket is bound first so `/livez` and `/readyz` answer
//! while loading.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use instinct_model::forward::BatchLimits;
use instinct_model::prompt::{user_text, Candidate, Screen};
use tokio::net::TcpListener;

use crate::cli::ServeArgs;
use crate::engine::{CpuEngine, Engine, PromptInput};
use crate::server::{self, AppState};

/// The identity of Cua-S1's text adapter at its pinned revision, reported for a real snapshot.
pub const CUA_S1_TEXT_ID: &str =
    "cua-ai/cua-s1-4b-0.2@16818868b0cc7813808aae4e87b417657046ab79:text";
/// The identity reported for the built-in demo model.
pub const DEMO_ID: &str = "instinct/demo-tiny-qwen3.5:text";

/// Where the weights come from.
struct ModelSource {
    model_dir: PathBuf,
    text_adapter: Option<PathBuf>,
    demo: bool,
}

fn resolve_source(args: &ServeArgs) -> anyhow::Result<ModelSource> {
    match &args.model {
        Some(dir) => Ok(ModelSource {
            model_dir: dir.clone(),
            text_adapter: args.text_adapter.clone(),
            demo: false,
        }),
        None => {
            if args.text_adapter.is_some() {
                bail!("--text-adapter needs --model (the demo model carries its own adapter)");
            }
            let demo = instinct_model::demo::materialize(&std::env::temp_dir())
                .context("writing the built-in demo model to the temporary directory")?;
            Ok(ModelSource {
                model_dir: demo.model_dir,
                text_adapter: Some(demo.text_adapter_dir),
                demo: true,
            })
        }
    }
}

/// Runs the server until SIGINT or SIGTERM.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    if args.device != "cpu" {
        bail!(
            "--device {}: only `cpu` is built so far (the CUDA backend is not part of this build)",
            args.device
        );
    }
    let source = resolve_source(&args)?;
    if source.demo {
        tracing::warn!(
            "serving the built-in demo model: a tiny Qwen3.5 with random weights; its answers are \
             meaningless. Serve a real snapshot with --model DIR (and --text-adapter DIR for Cua-S1's \
             text adapter)."
        );
    }
    let model_id = args
        .model_id
        .clone()
        .unwrap_or_else(|| if source.demo { DEMO_ID } else { CUA_S1_TEXT_ID }.to_string());
    let state = Arc::new(AppState::new(
        args.served_model_name.clone(),
        model_id,
        args.max_body_bytes,
        args.max_prompt_tokens,
    ));
    let listener = TcpListener::bind(args.bind)
        .await
        .with_context(|| format!("binding {}", args.bind))?;
    tracing::info!("listening on http://{}", listener.local_addr()?);

    let loader_state = state.clone();
    let limits = BatchLimits {
        max_tokens: args.max_prompt_tokens.max(1),
        max_seqs: 64,
    };
    let loading = tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let t0 = Instant::now();
        let engine = CpuEngine::load(&source.model_dir, source.text_adapter.as_deref(), limits)?;
        let loaded = t0.elapsed();
        let t1 = Instant::now();
        warm_up(&engine).context("warm-up decision")?;
        tracing::info!(
            load_ms = loaded.as_secs_f64() * 1e3,
            warmup_ms = t1.elapsed().as_secs_f64() * 1e3,
            "model loaded and warmed up; ready"
        );
        loader_state.set_ready(Arc::new(engine));
        Ok(())
    });

    let mut serving = tokio::spawn(server::serve(listener, state));
    tokio::select! {
        r = &mut serving => return r.context("server task failed")?,
        r = loading => match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e.context("loading the model")),
            Err(e) => bail!("loading task failed: {e}"),
        },
        _ = shutdown_signal() => {
            tracing::info!("shutting down");
            return Ok(());
        }
    }
    tokio::select! {
        r = &mut serving => r.context("server task failed")?,
        _ = shutdown_signal() => {
            tracing::info!("shutting down");
            Ok(())
        }
    }
}

/// One real decision through every stage (template, tokenizer, forward, readout), so the first
/// client does not pay for lazy start-up work and readiness means the model answers.
fn warm_up(engine: &dyn Engine) -> anyhow::Result<()> {
    let screen = Screen {
        app: "Cua Driver",
        task_family: "closed-candidate decision",
        accessibility_tree: "- Button \"OK\"\n- Button \"Cancel\"",
    };
    let candidates = [
        Candidate {
            role: "Button",
            label: "OK",
            action: "click",
            entity_id: None,
        },
        Candidate {
            role: "Button",
            label: "Cancel",
            action: "click",
            entity_id: None,
        },
    ];
    let chat = engine.render(&user_text("Confirm the dialog.", &screen, &candidates))?;
    let ids = engine.tokenize(&chat)?;
    let answers = engine.decide(&[PromptInput { ids, n_options: 2 }])?;
    let p = &answers[0];
    let sum: f32 = p.iter().sum();
    anyhow::ensure!(
        p.len() == 2 && p.iter().all(|x| x.is_finite()) && (sum - 1.0).abs() < 1e-3,
        "warm-up answer is not a probability distribution: {p:?}"
    );
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing the SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
