//! `instinct serve`: bind, load the model (the built-in demo without `--model`), run a real
//! warm-up decision, then answer. The socket is bound first so `/livez` and `/readyz` answer
//! while loading. SIGTERM or SIGINT drains: readiness goes to 503, new requests get 503, queued
//! and running ones finish (up to `--drain-timeout-s`), then the process exits.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use instinct_model::prompt::{user_text, Candidate, Screen};
use instinct_model::source::{Device, ModelSource};
use instinct_scheduler::{Bucket, Config, Question, Scheduler};
use tokio::net::TcpListener;

use crate::cli::ServeArgs;
use crate::engine::{self, LoadOptions, Preparer, ScreenshotError};
use crate::screenshot::{ImageFormat, Screenshot};
use crate::server::{self, AppState, Ready, Settings};

/// The identity of Cua-S1's text adapter at its pinned revision, reported for a real snapshot.
pub const CUA_S1_TEXT_ID: &str =
    "cua-ai/cua-s1-4b-0.2@16818868b0cc7813808aae4e87b417657046ab79:text";
/// The identity reported for the built-in demo model.
pub const DEMO_ID: &str = "instinct/demo-tiny-qwen3.5:text";

/// The scheduler configuration the flags describe; refuses inconsistent limits at start-up.
pub fn scheduler_config(args: &ServeArgs) -> anyhow::Result<Config> {
    if args.max_batch_tokens < args.max_prompt_tokens {
        bail!(
            "--max-batch-tokens ({}) must be at least --max-prompt-tokens ({}): a question that \
             passes validation must fit in a batch",
            args.max_batch_tokens,
            args.max_prompt_tokens
        );
    }
    let config = Config {
        max_queue_requests: args.max_queue_requests,
        max_queue_tokens: args.max_queue_tokens,
        max_batch_tokens: args.max_batch_tokens,
        max_batch_seqs: args.max_batch_seqs,
        buckets: args
            .buckets
            .0
            .iter()
            .map(|&(t, n)| Bucket::new(t, n))
            .collect(),
        max_wait: Duration::from_micros(args.batch_wait_us),
        max_chunk_tokens: max_chunk_tokens(args),
        chunk_grid: engine::resume_grid(&args.device),
        ..Config::default()
    };
    Ok(Config {
        chunk_over_tokens: chunk_over_tokens(args, &config),
        ..config
    })
}

/// Server settings from the flags, for the given identity; refuses a memory budget that cannot
/// hold one request of the largest body allowed.
pub fn settings(args: &ServeArgs, model_id: String) -> anyhow::Result<Settings> {
    let largest_body = args.max_body_bytes.max(args.max_screenshot_body_bytes);
    let max_inflight_bytes = args.max_inflight_mib << 20;
    if max_inflight_bytes < largest_body {
        bail!(
            "--max-inflight-mib ({} MiB) must hold at least one request of the largest body \
             allowed ({largest_body} bytes, --max-body-bytes / --max-screenshot-body-bytes)",
            args.max_inflight_mib
        );
    }
    Ok(Settings {
        max_body_bytes: args.max_body_bytes,
        max_screenshot_body_bytes: args.max_screenshot_body_bytes,
        max_prompt_tokens: args.max_prompt_tokens,
        request_timeout: (args.request_timeout_ms > 0)
            .then(|| Duration::from_millis(args.request_timeout_ms)),
        api_key: args.api_key.clone().filter(|k| !k.is_empty()),
        engine_stall: Duration::from_secs(args.engine_stall_s),
        header_timeout: Duration::from_millis(args.header_timeout_ms),
        body_timeout: Duration::from_millis(args.body_timeout_ms),
        write_timeout: Duration::from_millis(args.write_timeout_ms),
        // clap bounds all three far below usize::MAX.
        max_header_bytes: args.max_header_bytes as usize,
        max_headers: args.max_headers as usize,
        max_connections: args.max_connections as usize,
        max_inflight_bytes,
        max_chunk_state_bytes: args.max_chunk_state_mib << 20,
        ..Settings::new(args.served_model_name.clone(), model_id)
    })
}

/// `--max-chunk-tokens`, 0 meaning no chunking.
fn max_chunk_tokens(args: &ServeArgs) -> Option<usize> {
    (args.max_chunk_tokens > 0).then_some(args.max_chunk_tokens)
}

/// Questions up to this many tokens run whole by default, with chunked prefill on: on an H100
/// the upstream mix (questions up to ~2,000 tokens) beside ~14,500-token questions had a p99 of
/// 97-112 ms with it and 196 ms without (docs/benchmarks/gpu-calls/2026-12-07-1cc0dff-h100).
const DEFAULT_CHUNK_OVER_TOKENS: usize = 4096;

/// `--chunk-over-tokens` as the scheduler takes it, for `config` (the other flags): 0 means
/// `--max-chunk-tokens`; unset, the default within `--max-chunk-tokens` and the largest bucket. A
/// value set without chunking is passed on for the scheduler to refuse.
fn chunk_over_tokens(args: &ServeArgs, config: &Config) -> Option<usize> {
    match (config.max_chunk_tokens, args.chunk_over_tokens) {
        (_, Some(0)) | (None, None) => None,
        (_, Some(over)) => Some(over),
        (Some(chunk), None) => Some(
            DEFAULT_CHUNK_OVER_TOKENS
                .min(config.largest_bucket_tokens())
                .max(chunk),
        ),
    }
}

/// What the loader takes from the flags.
pub fn load_options(args: &ServeArgs) -> LoadOptions {
    LoadOptions {
        cpu_engines: args.engines,
        image_cache_bytes: args.image_cache_mib << 20,
        prefix_cache_bytes: args.prefix_cache_mib.map(|mib| mib << 20),
        max_chunk_tokens: max_chunk_tokens(args),
        batch_invariant: args.batch_invariant,
        cuda_graphs: args.cuda_graphs,
        screenshot_cuda_graphs: args.screenshot_cuda_graphs,
        snapshots_within: args.snapshots_within,
        cuda_pool_keep_bytes: args.cuda_pool_keep_mib.map(|mib| mib << 20),
        carry_arena_prefix_tokens: args.carry_arena_prefix_tokens,
        screenshot_carry_arena_prefix_tokens: args.screenshot_carry_arena_prefix_tokens,
    }
}

/// Runs the server until SIGINT or SIGTERM, then drains.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let config = scheduler_config(&args)?;
    let limits = engine::batch_limits(config.batch_capacity()?);
    let source = ModelSource::resolve(
        args.model.as_deref(),
        args.text_adapter.as_deref(),
        args.multimodal_adapter.as_deref(),
    )?;
    if source.demo {
        tracing::warn!(
            "serving the built-in demo model: a tiny Qwen3.5 with random weights; its answers are \
             meaningless. Serve a real snapshot with --model DIR (and --text-adapter DIR for \
             Cua-S1's text adapter)."
        );
    }
    let model_id = args
        .model_id
        .clone()
        .unwrap_or_else(|| if source.demo { DEMO_ID } else { CUA_S1_TEXT_ID }.to_string());
    let state = Arc::new(AppState::new(settings(&args, model_id)?));
    let listener = TcpListener::bind(args.bind)
        .await
        .with_context(|| format!("binding {}", args.bind))?;
    tracing::info!("listening on http://{}", listener.local_addr()?);
    let mut serving = tokio::spawn(server::serve(listener, state.clone()));

    let devices = args
        .device
        .resolve(|| Ok(instinct_kernels::cuda::gpu_count()?))
        .context("--device")?;
    let options = load_options(&args);
    let max_prompt_tokens = args.max_prompt_tokens;
    let loader_state = state.clone();
    let loading = tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let t0 = Instant::now();
        let loaded = engine::load_on(&devices, &source, limits, options)?;
        metrics::gauge!(crate::metrics::WEIGHTS_BYTES).set(loaded.weights_bytes as f64);
        crate::metrics::register_devices(&loaded.devices);
        let scheduler = Scheduler::start(config, loaded.engines)?;
        let load = t0.elapsed();
        let t1 = Instant::now();
        warm_up(&loaded.preparer, &scheduler).context("warm-up decision")?;
        let warmup = t1.elapsed();
        let t2 = Instant::now();
        let mut screenshot_warmed = false;
        if loaded.preparer.serves_screenshots() {
            let side = warm_screenshot_side(&devices);
            screenshot_warmed =
                warm_up_screenshot(&loaded.preparer, &scheduler, side, max_prompt_tokens)
                    .context("warm-up screenshot decision")?;
        }
        tracing::info!(
            load_ms = load.as_secs_f64() * 1e3,
            warmup_ms = warmup.as_secs_f64() * 1e3,
            screenshot_warmed,
            screenshot_warmup_ms = t2.elapsed().as_secs_f64() * 1e3,
            "model loaded and warmed up; ready"
        );
        loader_state.set_ready(Ready {
            preparer: loaded.preparer,
            scheduler,
        });
        Ok(())
    });

    tokio::select! {
        r = &mut serving => return r.context("server task failed")?,
        r = loading => match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e.context("loading the model")),
            Err(e) => bail!("loading task failed: {e}"),
        },
        _ = shutdown_signal() => {
            tracing::info!("signal received while loading; exiting");
            return Ok(());
        }
    }
    let drain_timeout = Duration::from_secs(args.drain_timeout_s);
    tokio::select! {
        r = &mut serving => r.context("server task failed")?,
        r = until_stopped(&state, shutdown_signal(), drain_timeout) => r,
    }
}

/// Once ready: serves until `stop` resolves, then drains (`Ok`); or until every engine is lost
/// to a device failure, then gives the failed requests' answers time to be written and returns
/// an error, so the process exits non-zero and its supervisor restarts it.
pub async fn until_stopped(
    state: &AppState,
    stop: impl std::future::Future<Output = ()>,
    drain_timeout: Duration,
) -> anyhow::Result<()> {
    let ready = state
        .ready()
        .context("until_stopped is called once the model is ready")?;
    tokio::select! {
        _ = stop => {
            drain(state, drain_timeout).await;
            Ok(())
        }
        _ = ready.scheduler.all_engines_lost() => {
            metrics::gauge!(crate::metrics::READY).set(0.0);
            // The scheduler already failed what was left; let those 500s reach their clients.
            tokio::time::sleep(Duration::from_millis(200)).await;
            bail!("every engine is lost to a device failure; exiting so the process is restarted")
        }
    }
}

/// Stops admitting, waits for queued and running requests (up to `timeout`), and gives their
/// answers time to be written.
pub async fn drain(state: &AppState, timeout: Duration) {
    tracing::info!("draining: no new requests; finishing queued and running ones");
    state.start_draining();
    if let Some(ready) = state.ready() {
        let drained = ready.scheduler.drained();
        if tokio::time::timeout(timeout, drained).await.is_err() {
            tracing::warn!("drain timeout reached; failing what is left");
        }
        let scheduler_done = ready.scheduler.shutdown(Duration::ZERO);
        tracing::info!(clean = scheduler_done, "scheduler stopped");
        // Answers computed just now still have to reach their connections.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One real decision through every stage (template, tokenizer, scheduler, forward, readout), so
/// the first client does not pay for lazy start-up work and readiness means the model answers.
fn warm_up(preparer: &Preparer, scheduler: &Scheduler) -> anyhow::Result<()> {
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
    let chat = preparer.render(&user_text("Confirm the dialog.", &screen, &candidates))?;
    let ids = preparer.tokenize(&chat)?;
    answer_warm_up(scheduler, vec![Question::text(ids, 2)])
}

/// Runs `questions` (two options each) through the scheduler and checks that each answer is a
/// probability distribution.
fn answer_warm_up(scheduler: &Scheduler, questions: Vec<Question>) -> anyhow::Result<()> {
    let ticket = scheduler
        .submit(questions, None)
        .map_err(|r| anyhow::anyhow!("{r}"))?;
    let answer = ticket.wait_blocking()?;
    for p in &answer.probabilities {
        let sum: f32 = p.iter().sum();
        anyhow::ensure!(
            p.len() == 2 && p.iter().all(|x| x.is_finite()) && (sum - 1.0).abs() < 1e-3,
            "warm-up answer is not a probability distribution: {p:?}"
        );
    }
    Ok(())
}

/// The side of the square screenshot the warm-up asks about: on a GPU the size of the latency
/// targets (1024×1024, 1,024 image tokens), so that the tower's GEMMs at its rows are timed, its
/// kernels compiled and the language pass after it captured before the first client sends one;
/// on the CPU a small one (the path runs; a larger image would only cost start-up time).
fn warm_screenshot_side(devices: &[Device]) -> u32 {
    if devices.iter().any(|d| matches!(d, Device::Cuda(_))) {
        1024
    } else {
        64
    }
}

/// The warm-up's screenshot: `instinct bench`'s synthetic `side`×`side` PNG (noisy gradients, so
/// it decodes at about a real screenshot's cost).
fn warm_up_png(side: u32) -> anyhow::Result<Vec<u8>> {
    let size = instinct_bench::ImageSize {
        width: side,
        height: side,
    };
    instinct_bench::vision::synthetic_png(size, WARM_UP_IMAGE_SEED)
}

/// The warm-up image's seed (any fixed one: the same start always asks about the same image).
const WARM_UP_IMAGE_SEED: u64 = 1;

/// One screenshot decision through every stage (PNG decoding, preprocessing, the vision tower,
/// the language model with the image's features), as `warm_up` does for text: the first client
/// with a screenshot does not pay for lazy start-up work either. The generated image stays in the
/// image cache (and its prefix in the prefix cache) until evicted, like any other.
/// Skipped, with a warning, where the question is longer than `max_prompt_tokens` (no client could
/// send it); returns whether the question ran.
fn warm_up_screenshot(
    preparer: &Preparer,
    scheduler: &Scheduler,
    side: u32,
    max_prompt_tokens: usize,
) -> anyhow::Result<bool> {
    let shot = Screenshot {
        format: ImageFormat::Png,
        bytes: warm_up_png(side)?,
    };
    let user = "Which button confirms the dialog?\nA. OK\nB. Cancel";
    let prepared = preparer
        .screenshot_questions(&shot, &[(user, 2)])
        .map_err(|e| match e {
            ScreenshotError::Image(detail) => anyhow::anyhow!("the generated image: {detail}"),
            ScreenshotError::Internal(e) => e,
        })?;
    let tokens = prepared.questions.iter().map(|q| q.ids.len()).max();
    if tokens.is_some_and(|t| t > max_prompt_tokens) {
        tracing::warn!(
            side,
            tokens,
            max_prompt_tokens,
            "no screenshot warm-up: its question is longer than --max-prompt-tokens"
        );
        return Ok(false);
    }
    answer_warm_up(scheduler, prepared.questions).map(|()| true)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The demo model on the CPU (with an image cache) and its scheduler.
    fn demo() -> (Preparer, Scheduler) {
        let config = Config {
            max_batch_seqs: 16,
            ..Config::default()
        };
        let source = ModelSource::resolve(None, None, None).unwrap();
        let limits = engine::batch_limits(config.batch_capacity().unwrap());
        let options = LoadOptions {
            image_cache_bytes: 64 << 20,
            ..LoadOptions::default()
        };
        let loaded = engine::load(Device::Cpu, &source, limits, options).unwrap();
        let scheduler = Scheduler::start(config, loaded.engines).unwrap();
        (loaded.preparer, scheduler)
    }

    #[test]
    fn the_warm_up_answers_a_screenshot_question_and_leaves_its_image_cached() {
        let (preparer, scheduler) = demo();
        let preparer = &preparer;
        assert!(preparer.serves_screenshots(), "the demo model has a tower");
        warm_up(preparer, &scheduler).unwrap();
        assert!(warm_up_screenshot(preparer, &scheduler, 64, 16_384).unwrap());
        let again = Screenshot {
            format: ImageFormat::Png,
            bytes: warm_up_png(64).unwrap(),
        };
        let prepared = preparer
            .screenshot_questions(&again, &[("Which one?", 2)])
            .map_err(|e| anyhow::anyhow!("{e:?}"))
            .unwrap();
        assert!(prepared.cache_hit, "the warm-up encoded the same image");
    }

    #[test]
    fn a_prompt_limit_below_the_warm_up_question_skips_it_without_failing() {
        let (preparer, scheduler) = demo();
        // The 64x64 image alone is 64 image tokens.
        let ran = warm_up_screenshot(&preparer, &scheduler, 64, 32).unwrap();
        assert!(!ran, "a question no client could send is not asked");
    }

    #[test]
    fn a_gpu_warms_up_on_the_size_of_the_latency_targets() {
        assert_eq!(warm_screenshot_side(&[Device::Cpu]), 64);
        assert_eq!(warm_screenshot_side(&[Device::Cuda(0)]), 1024);
        assert_eq!(
            warm_screenshot_side(&[Device::Cuda(0), Device::Cuda(1)]),
            1024
        );
    }
}
