//! `instinct bench`: speed of the model on one device, reported beside what the hardware allows.
//!
//! Forward mode (the default) loads the model and its text adapter on `--device`, then times
//! [`Decider::decide`](instinct_model::decider::Decider::decide) (ids staged, one packed forward
//! pass, the last hidden states copied to the host, the letter softmax on the host: the copy makes
//! the device finish, so the times are real) for one question at each latency length and for
//! each packed batch. HTTP mode (`--http URL`) times one question at each latency length against
//! a running `instinct serve`, single client, one kept-alive connection. Vision mode
//! (`--image-sizes WxH,...`, see [`vision`]) times the screenshot path's vision tower alone: the
//! host's preprocessing of a seeded PNG of each size, the tower's forward pass on `--device` (its
//! features left there, as served) and their read-back, each on its own.
//!
//! The server binary runs this as `instinct bench`, but it is no part of serving, so it has its
//! own crate; not the load tester's, because forward mode needs the model and its kernels and
//! the load tester talks HTTP only.
//!
//! Prompts are the token ids of `tools/reference/bench_prompts.py` (`--prompts FILE`), the same
//! ids `peer_bench.py` gives transformers, or seeded synthetic ids (`--lengths`,
//! `--batch-sizes`). Every row records all raw run times, their median, p10 and p90, its tokens
//! and tokens/s, its analytic model FLOPs and the weight bytes one forward pass reads; with
//! `--ceilings` (a `peer_bench.py` report, whose copy bandwidth and bf16 GEMM rate were measured
//! on the same GPU) also the time those two bounds allow.
//!
//! Conventions (also written into the report):
//! - FLOPs: 2 per multiply-accumulate. `dense`: every projection matrix of the text model for
//!   every token (DeltaNet in_proj_qkv/z/b/a and out_proj, attention q (gated, 2·Hq·D rows)/k/v/o,
//!   MLP gate/up/down); `readout`: the 26 letter rows of the tied LM head, at each question's last
//!   position only; `attention`: the causal QKᵀ and PV of the full-attention layers,
//!   2·Hq·D·L(L+1) per layer and sequence; `delta_rule`: the recurrent gated delta rule,
//!   7·Dk·Dv per value head, token and DeltaNet layer (decay, kᵀS, rank-1 update, qᵀS). Norms,
//!   activations, the short convolution and softmaxes are not counted. The FLOP bound uses the
//!   total.
//! - Weight bytes: bf16 (2 bytes) of every text weight but the embedding table (layers and final
//!   norm), plus the embedding rows the prompt gathers (distinct ids) and the 26 letter rows.
//! - Bandwidth bound: weight bytes / the measured device copy rate (read + write bytes per
//!   second); FLOP bound: FLOPs / the measured bf16 GEMM rate; a row's ceiling is the larger
//!   time of the two, and `fraction_of_ceiling` is that time over the measured median.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use clap::Args;
use instinct_kernels::cuda::{CudaBackend, CudaOptions};
use instinct_kernels::{Backend, CpuBackend};
use instinct_model::config::ModelConfig;
use instinct_model::decider::{load_text, Decider, Prompt, QuestionSegment};
use instinct_model::forward::BatchLimits;
pub use instinct_model::source::{Device, ModelSource};
use serde_json::{json, Map, Value};

mod cost;
mod http;
mod prompts;
pub mod vision;

pub use cost::{Ceilings, Flops, ModelCost};
pub use prompts::{
    prompts_digest, OptionText, PromptSet, Row, RowKind, TextSource, PROMPTS_FORMAT,
};
pub use vision::{ImageSize, TowerFlops};

/// Letters every forward question is read over (all 26, as the peers read them).
pub const LETTERS: usize = 26;
/// What the load times cover.
const LOAD_WHAT: &str = "backend_start_s: CUDA context and kernel modules (compiled, or loaded \
    from the disk cache; 0 on the CPU); model_load_s: read the safetensors, merge the adapter in \
    f32, upload (bf16 on the GPU), allocate the activations for the batch limits";
/// Version of the report's layout.
pub const REPORT_SCHEMA: &str = "instinct-bench/1";

/// Options of `instinct bench`.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Snapshot directory (config.json, safetensors, tokenizer.json). Without it, the built-in
    /// demo model (with its text adapter).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Text adapter merged at load.
    #[arg(long)]
    pub text_adapter: Option<PathBuf>,
    /// `cpu` or `cuda:N` (with --http: the server's device, for the report only).
    #[arg(long, default_value = "cpu")]
    pub device: Device,
    /// Prompt ids from `tools/reference/bench_prompts.py` (the ids peer_bench.py runs).
    #[arg(long, conflicts_with_all = ["lengths", "batch_sizes"])]
    pub prompts: Option<PathBuf>,
    /// Without --prompts: latency prompt lengths, seeded random ids [default: 139,712,15446].
    #[arg(long, value_delimiter = ',')]
    pub lengths: Option<Vec<usize>>,
    /// Without --prompts: questions per packed batch [default: 8,32,128].
    #[arg(long, value_delimiter = ',')]
    pub batch_sizes: Option<Vec<usize>>,
    /// Without --prompts: tokens of each batch question.
    #[arg(long, default_value_t = 300)]
    pub batch_prompt_tokens: usize,
    /// Without --prompts: seed of the synthetic ids (with --image-sizes: of the PNGs).
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Timed runs of each latency row (with --image-sizes: of each size).
    #[arg(long, default_value_t = 20)]
    pub runs: usize,
    /// Timed runs of each batch row.
    #[arg(long, default_value_t = 5)]
    pub batch_runs: usize,
    /// Untimed warm-up runs before each row's timed runs.
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// A row stops early once its timed runs took more than --max-row-s, but not before this
    /// many runs.
    #[arg(long, default_value_t = 3)]
    pub min_runs: usize,
    /// Seconds of timed runs after which a row stops early (0: never).
    #[arg(long, default_value_t = 60.0)]
    pub max_row_s: f64,
    /// Seconds after the start past which the rows not begun yet are skipped (0: no limit).
    /// Rows run cheapest first.
    #[arg(long, default_value_t = 0.0)]
    pub budget_s: f64,
    /// Longest single question, in tokens (the serving limit).
    #[arg(long, default_value_t = 16_384)]
    pub max_prompt_tokens: usize,
    /// Token budget of one forward pass [default: the longest latency prompt or the largest
    /// batch, whichever is more]; every batch must fit in one pass.
    #[arg(long)]
    pub max_batch_tokens: Option<usize>,
    /// A `peer_bench.py` report whose `ceilings` (copy bandwidth, bf16 GEMM rate) bound each row.
    #[arg(long)]
    pub ceilings: Option<PathBuf>,
    /// Hardware description for the report [default: `nvidia-smi` for cuda:N, the CPU model for
    /// cpu].
    #[arg(long, env = "INSTINCT_BENCH_HARDWARE")]
    pub hardware: Option<String>,
    /// Source revision for the report (e.g. `git rev-parse HEAD`).
    #[arg(long, env = "INSTINCT_REVISION")]
    pub revision: Option<String>,
    /// Time requests to a running `instinct serve` at this base URL (`http://host:port`) instead
    /// of forward passes. --model gives the tokenizer and chat template the request sizes are
    /// fitted with (the server's own).
    #[arg(long)]
    pub http: Option<String>,
    /// With --http: wait up to this many seconds for `/readyz` before the first request.
    #[arg(long, default_value_t = 0.0)]
    pub wait_ready_s: f64,
    /// Where to write the report (JSON; rewritten after every row). Printed to stdout without it.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Captured passes on a GPU (`on` or `off`), as `instinct serve --cuda-graphs`: each row's
    /// first warm-up run captures its shape, the timed runs replay it.
    #[arg(long, default_value = "on", value_parser = parse_on_off, action = clap::ArgAction::Set)]
    pub cuda_graphs: bool,
    /// Forward passes only: each question's first N ids run once as a prefix (its snapshot
    /// kept), and the timed runs resume the rest from it, as a server resumes a question from
    /// the cached system turn (0: whole questions). A question of at most N ids runs whole.
    #[arg(long, default_value_t = 0, conflicts_with = "http")]
    pub resume_tokens: usize,
    /// Forward passes on a GPU: MiB of freed device memory the driver's pool keeps for the next
    /// allocations (`instinct serve --cuda-pool-keep-mib`; none by default).
    #[arg(long, conflicts_with = "http")]
    pub cuda_pool_keep_mib: Option<u64>,
    /// Time the screenshot path's vision tower alone instead of text forward passes: for each
    /// size, a PNG of W x H pixels (RGB, seeded by --seed: noisy gradients; within the serving
    /// limits of 2048 px a side and 1,048,576 px), its preprocessing on the host, its encoding
    /// by the tower on --device (the features left there, as served) and their read-back, timed
    /// apart. --runs, --warmup, --min-runs, --max-row-s and
    /// --budget-s apply; the text rows' options are refused.
    #[arg(
        long,
        value_name = "WxH[,WxH...]",
        value_delimiter = ',',
        conflicts_with_all = [
            "http", "resume_tokens", "prompts", "lengths", "batch_sizes", "batch_prompt_tokens",
            "batch_runs", "max_prompt_tokens", "max_batch_tokens", "text_adapter", "ceilings",
        ]
    )]
    pub image_sizes: Option<Vec<ImageSize>>,
    /// With --image-sizes and --model: the multimodal adapter whose vision modules are merged
    /// into the tower at load (its language modules are not read into anything) [default: none,
    /// the base tower; the demo model brings its own].
    #[arg(long, value_name = "DIR", requires = "image_sizes")]
    pub multimodal_adapter: Option<PathBuf>,
}

/// A flag's `on` or `off`.
pub fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("expected `on` or `off`, got `{other}`")),
    }
}

/// How the server reads a request body: the user message of its one question, or why it refuses
/// the body. The request contract is the server's (`instinct::contract`), so the server crate
/// passes it in; HTTP mode counts each request's prompt tokens with it.
pub type UserMessageOf<'a> = &'a dyn Fn(&[u8]) -> Result<String>;

/// Runs the benchmark and writes its report.
pub fn run(args: &BenchArgs, user_message_of: UserMessageOf<'_>) -> Result<()> {
    let started = Instant::now();
    let device = args.device;
    let source = ModelSource::resolve(
        args.model.as_deref(),
        args.text_adapter.as_deref(),
        args.multimodal_adapter.as_deref(),
    )?;
    let config = read_config(&source.model_dir)?;
    let cost = ModelCost::new(&config.text);
    let ceilings = args
        .ceilings
        .as_deref()
        .map(Ceilings::from_file)
        .transpose()?;
    let mut bench = Bench {
        args,
        started,
        cost,
        ceilings,
        report: Map::new(),
    };
    if let Some(sizes) = &args.image_sizes {
        bench.header(&device, &source, None)?;
        return vision::run(&mut bench, sizes, &source);
    }
    let prompts = match &args.prompts {
        Some(path) => PromptSet::from_file(path)?,
        None => PromptSet::synthetic(args, config.text.vocab_size)?,
    };
    bench.header(&device, &source, Some(&prompts))?;
    if let Some(url) = &args.http {
        return http::run(&mut bench, url, &source, &prompts, user_message_of);
    }
    let limits = prompts.check(args, config.text.vocab_size)?;
    bench.report.insert(
        "limits".into(),
        json!({"max_tokens": limits.max_tokens, "max_seqs": limits.max_seqs}),
    );
    match device {
        Device::Cpu => bench.forward(CpuBackend::new(), 0.0, &source, &prompts, limits),
        Device::Cuda(ordinal) => {
            let (backend, start_s) = start_cuda(args, ordinal)?;
            bench.forward(backend, start_s, &source, &prompts, limits)
        }
    }
}

/// The CUDA backend of GPU `ordinal` with the run's options, and the seconds it took to start.
fn start_cuda(args: &BenchArgs, ordinal: usize) -> Result<(CudaBackend, f64)> {
    let t0 = Instant::now();
    let backend = CudaBackend::new(CudaOptions {
        ordinal,
        cuda_graphs: args.cuda_graphs,
        pool_keep_bytes: args.cuda_pool_keep_mib.map(|mib| mib << 20),
        ..CudaOptions::default()
    })
    .with_context(|| format!("starting {}", args.device))?;
    let start_s = t0.elapsed().as_secs_f64();
    eprintln!("[bench] cuda backend started (kernels compiled or loaded) in {start_s:.2} s");
    Ok((backend, start_s))
}

fn read_config(model_dir: &Path) -> Result<ModelConfig> {
    let path = model_dir.join("config.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    ModelConfig::from_json(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Median, p10, p90 (linear interpolation between order statistics), min, max, mean.
pub fn summarize(times_ms: &[f64]) -> Value {
    let mut v = times_ms.to_vec();
    v.sort_by(f64::total_cmp);
    let q = |p: f64| {
        if v.is_empty() {
            return f64::NAN;
        }
        let x = p * (v.len() - 1) as f64;
        let (i, frac) = (x.floor() as usize, x - x.floor());
        v[i] + (v[(i + 1).min(v.len() - 1)] - v[i]) * frac
    };
    let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
    json!({
        "runs": v.len(),
        "runs_ms": times_ms,
        "median_ms": q(0.5),
        "p10_ms": q(0.1),
        "p90_ms": q(0.9),
        "min_ms": v.first(),
        "max_ms": v.last(),
        "mean_ms": mean,
    })
}

/// The run's state: its options, its cost model and its report so far.
struct Bench<'a> {
    args: &'a BenchArgs,
    started: Instant,
    cost: ModelCost,
    ceilings: Option<Ceilings>,
    report: Map<String, Value>,
}

impl Bench<'_> {
    /// The report's mode: `vision`, `http` or `forward`.
    fn mode(&self) -> &'static str {
        match (&self.args.image_sizes, &self.args.http) {
            (Some(_), _) => "vision",
            (None, Some(_)) => "http",
            (None, None) => "forward",
        }
    }

    /// What every report starts with; `prompts` in the text modes. Vision mode writes its own
    /// model facts once the tower is loaded.
    fn header(
        &mut self,
        device: &Device,
        source: &ModelSource,
        prompts: Option<&PromptSet>,
    ) -> Result<()> {
        let a = self.args;
        let mode = self.mode();
        let r = &mut self.report;
        r.insert("schema".into(), json!(REPORT_SCHEMA));
        r.insert("mode".into(), json!(mode));
        r.insert(
            "command".into(),
            json!(std::env::args().collect::<Vec<_>>()),
        );
        r.insert("instinct_version".into(), json!(env!("CARGO_PKG_VERSION")));
        r.insert(
            "revision".into(),
            json!(a.revision.clone().unwrap_or_else(|| "unknown".into())),
        );
        r.insert(
            "hardware".into(),
            json!(a
                .hardware
                .clone()
                .unwrap_or_else(|| detect_hardware(device))),
        );
        r.insert("device".into(), json!(a.device.to_string()));
        r.insert("model".into(), json!(source.model_dir));
        r.insert("demo_model".into(), json!(source.demo));
        if let Some(sizes) = &a.image_sizes {
            r.insert(
                "multimodal_adapter".into(),
                json!(source.multimodal_adapter),
            );
            let sizes: Vec<String> = sizes.iter().map(ImageSize::to_string).collect();
            r.insert(
                "settings".into(),
                json!({
                    "image_sizes": sizes, "seed": a.seed,
                    "runs": a.runs, "warmup": a.warmup,
                    "min_runs": a.min_runs, "max_row_s": a.max_row_s, "budget_s": a.budget_s,
                    "cuda_graphs": a.cuda_graphs,
                    "cuda_pool_keep_mib": a.cuda_pool_keep_mib,
                    "image": "RGB PNG per size, seeded by seed and the size: a random gradient \
                              per channel plus uniform noise of +-32 levels per sample",
                    "timing": vision::TIMING,
                    "percentiles": "linear interpolation between order statistics",
                }),
            );
            r.insert(
                "conventions".into(),
                json!({"flops": vision::FLOPS_CONVENTION}),
            );
            return Ok(());
        }
        r.insert("text_adapter".into(), json!(source.text_adapter));
        if let Some(prompts) = prompts {
            r.insert("prompts".into(), prompts.provenance.clone());
        }
        r.insert(
            "settings".into(),
            json!({
                "runs": a.runs, "batch_runs": a.batch_runs, "warmup": a.warmup,
                "min_runs": a.min_runs, "max_row_s": a.max_row_s, "budget_s": a.budget_s,
                "letters": LETTERS,
                "cuda_graphs": a.cuda_graphs,
                "cuda_pool_keep_mib": a.cuda_pool_keep_mib,
                "resume_tokens": a.resume_tokens,
                "timing": if a.http.is_some() {
                    "wall clock from writing the request to reading the whole answer, one \
                     kept-alive connection, single client"
                } else {
                    "wall clock around Decider::decide: ids staged, one packed forward pass, \
                     hidden states copied to the host (which waits for the device), letter \
                     softmax on the host"
                },
                "percentiles": "linear interpolation between order statistics",
            }),
        );
        r.insert("model_facts".into(), self.cost.json());
        r.insert(
            "conventions".into(),
            json!({
                "flops": "2 per multiply-accumulate; dense = every projection matrix for every \
                          token; readout = the 26 letter rows at each question's last position; \
                          attention = causal QK^T and PV, 2*Hq*D*L*(L+1) per full-attention layer \
                          and sequence; delta_rule = 7*Dk*Dv per value head, token and DeltaNet \
                          layer; norms, activations, the conv and softmaxes not counted",
                "weight_bytes": "bf16 bytes of every text weight except the embedding table, plus \
                                 the embedding rows gathered (distinct ids) and the 26 letter rows",
                "ceiling": "bound_ms = max(weight_bytes / copy rate (read+write), total flops / \
                            bf16 GEMM rate); fraction_of_ceiling = bound_ms / median_ms",
            }),
        );
        r.insert(
            "ceilings".into(),
            self.ceilings
                .as_ref()
                .map_or(Value::Null, |c| c.source.clone()),
        );
        Ok(())
    }

    /// The analytic columns of a row of sequences `seqs`, measured at `median_ms`.
    fn cost_columns(&self, seqs: &[&[u32]], median_ms: f64, letters: usize) -> Map<String, Value> {
        let lengths: Vec<usize> = seqs.iter().map(|s| s.len()).collect();
        let tokens: usize = lengths.iter().sum();
        let distinct: BTreeSet<u32> = seqs.iter().flat_map(|s| s.iter().copied()).collect();
        let flops = self.cost.flops(&lengths, letters);
        let bytes = self.cost.weight_bytes(distinct.len());
        let seconds = median_ms / 1e3;
        let mut m = Map::new();
        m.insert("tokens_per_s".into(), json!(tokens as f64 / seconds));
        m.insert("questions_per_s".into(), json!(seqs.len() as f64 / seconds));
        m.insert("flops".into(), flops.json());
        m.insert(
            "achieved_TFLOPs".into(),
            json!(flops.total() / seconds / 1e12),
        );
        m.insert("weight_bytes".into(), json!(bytes));
        m.insert(
            "ceiling".into(),
            self.ceilings
                .as_ref()
                .map_or(Value::Null, |c| c.bound(flops.total(), bytes, median_ms)),
        );
        m
    }

    fn over_budget(&self) -> bool {
        self.args.budget_s > 0.0 && self.started.elapsed().as_secs_f64() > self.args.budget_s
    }

    /// Times `work` until `wanted` runs or the row's time limit (after --min-runs).
    fn timed_runs<T>(
        &self,
        wanted: usize,
        mut work: impl FnMut() -> Result<T>,
    ) -> Result<(Vec<f64>, bool, Option<T>)> {
        let (mut times, mut last) = (Vec::with_capacity(wanted), None);
        let mut spent = 0.0;
        while times.len() < wanted {
            let t = Instant::now();
            let out = work()?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            times.push(ms);
            last = Some(out);
            spent += ms / 1e3;
            if self.args.max_row_s > 0.0
                && spent > self.args.max_row_s
                && times.len() >= self.args.min_runs.max(1)
                && times.len() < wanted
            {
                return Ok((times, true, last));
            }
        }
        Ok((times, false, last))
    }

    fn save(&mut self) -> Result<()> {
        self.report.insert(
            "seconds_total".into(),
            json!(self.started.elapsed().as_secs_f64()),
        );
        if let Some(out) = &self.args.out {
            let text = serde_json::to_vec_pretty(&self.report)?;
            std::fs::write(out, text).with_context(|| format!("writing {}", out.display()))?;
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        self.save()?;
        if self.args.out.is_none() {
            println!("{}", serde_json::to_string_pretty(&self.report)?);
        }
        Ok(())
    }

    fn forward<B: Backend>(
        &mut self,
        backend: B,
        backend_start_s: f64,
        source: &ModelSource,
        prompts: &PromptSet,
        limits: BatchLimits,
    ) -> Result<()> {
        let backend_name = backend.name();
        let t0 = Instant::now();
        let mut loaded = load_text(
            backend,
            &source.model_dir,
            source.text_adapter.as_deref(),
            limits,
        )
        .with_context(|| format!("loading {}", source.model_dir.display()))?;
        if self.args.resume_tokens > 0 {
            // Room for the states a resumed pass carries, as a server with prefix reuse has.
            loaded.decider.reserve_carry_arena()?;
        }
        let load_s = t0.elapsed().as_secs_f64();
        eprintln!("[bench] {backend_name}: model loaded (read, merge, upload) in {load_s:.2} s");
        self.report.insert("backend".into(), json!(backend_name));
        self.report.insert(
            "load".into(),
            json!({
                "backend_start_s": backend_start_s,
                "model_load_s": load_s,
                "total_s": backend_start_s + load_s,
                "what": LOAD_WHAT,
            }),
        );
        self.report.insert("warmup".into(), Value::Null);
        self.report.insert("latency".into(), json!([]));
        self.report.insert("batch".into(), json!([]));
        self.report.insert("skipped".into(), json!([]));
        self.save()?;

        let mut order: Vec<&Row> = prompts.rows.iter().collect();
        order.sort_by_key(|r| r.tokens());
        let mut first_call_ms = None;
        let mut failed = Vec::new();
        for row in order {
            if self.over_budget() {
                eprintln!("[bench] {} skipped: past --budget-s", row.name);
                push(&mut self.report, "skipped", json!(row.name));
                self.save()?;
                continue;
            }
            match self.forward_row(&mut loaded.decider, row, &mut first_call_ms) {
                Ok(out) => push(&mut self.report, row.kind.name(), Value::Object(out)),
                Err(e) => {
                    eprintln!("[bench] {} {} FAILED: {e:#}", row.kind.name(), row.name);
                    failed.push(format!("{} ({e:#})", row.name));
                    let out = json!({"name": row.name, "kind": row.kind.name(),
                                     "tokens": row.tokens(), "error": format!("{e:#}")});
                    push(&mut self.report, row.kind.name(), out);
                }
            }
            self.save()?;
        }
        self.finish()?;
        ensure!(failed.is_empty(), "rows failed: {}", failed.join("; "));
        Ok(())
    }

    /// Warm-up and timed runs of one row; its report entry.
    fn forward_row<B: Backend>(
        &mut self,
        decider: &mut Decider<B>,
        row: &Row,
        first_call_ms: &mut Option<f64>,
    ) -> Result<Map<String, Value>> {
        // The prefixes resumed from (--resume-tokens), computed once, untimed.
        let resume_tokens = self.args.resume_tokens;
        let cut_at = |ids: &[u32]| match resume_tokens {
            n if n > 0 && n < ids.len() => n,
            _ => 0,
        };
        let prefixes: Vec<QuestionSegment> = row
            .seqs
            .iter()
            .filter(|ids| cut_at(ids) > 0)
            .map(|ids| QuestionSegment::prefix(&ids[..cut_at(ids)], None))
            .collect();
        let mut snapshots = if prefixes.is_empty() {
            Vec::new()
        } else {
            decider.decide_segments(&prefixes)?
        }
        .into_iter()
        .map(|a| a.snapshot.context("a prefix without its snapshot"));
        let mut segments = Vec::with_capacity(row.seqs.len());
        let mut states = Vec::with_capacity(row.seqs.len());
        for ids in &row.seqs {
            states.push(if cut_at(ids) > 0 {
                Some(snapshots.next().context("a snapshot per prefix")??)
            } else {
                None
            });
        }
        for (ids, state) in row.seqs.iter().zip(&states) {
            let prompt = Prompt::text(&ids[cut_at(ids)..], LETTERS);
            segments.push(QuestionSegment::answer(prompt, state.as_ref()));
        }
        let mut run = || -> Result<Vec<Vec<f32>>> {
            let answers = decider.decide_segments(&segments)?;
            answers
                .into_iter()
                .map(|a| a.probabilities.context("a question without its answer"))
                .collect()
        };
        let mut warmups = Vec::with_capacity(self.args.warmup);
        for _ in 0..self.args.warmup {
            let t = Instant::now();
            run()?;
            warmups.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let wanted = match row.kind {
            RowKind::Latency => self.args.runs,
            RowKind::Batch => self.args.batch_runs,
        }
        .max(1);
        let (times, cut, answers) = self.timed_runs(wanted, run)?;
        if first_call_ms.is_none() {
            *first_call_ms = Some(warmups.first().copied().unwrap_or(times[0]));
            self.report.insert(
                "warmup".into(),
                json!({
                    "first_call_ms": first_call_ms,
                    "first_call_row": row.name,
                    "what": "the first forward pass after load (the first warm-up run of \
                             the cheapest row): lazy start-up work included",
                }),
            );
        }
        let stats = summarize(&times);
        let median = stats["median_ms"].as_f64().unwrap_or(f64::NAN);
        let mut out = Map::new();
        out.insert("name".into(), json!(row.name));
        out.insert("kind".into(), json!(row.kind.name()));
        out.insert("questions".into(), json!(row.seqs.len()));
        out.insert("tokens".into(), json!(row.tokens()));
        if row.kind == RowKind::Batch {
            let lengths: Vec<usize> = row.seqs.iter().map(Vec::len).collect();
            out.insert("lengths".into(), json!(lengths));
        }
        out.insert("source".into(), json!(row.source));
        out.insert("forward_passes".into(), json!(1));
        let resumed: Vec<usize> = row.seqs.iter().map(|ids| cut_at(ids)).collect();
        if resumed.iter().any(|&n| n > 0) {
            out.insert("resumed_from_tokens".into(), json!(resumed));
        }
        out.insert("warmup_ms".into(), json!(warmups));
        out.insert("runs_requested".into(), json!(wanted));
        out.insert("cut_by_max_row_s".into(), json!(cut));
        if let Value::Object(s) = stats {
            out.extend(s);
        }
        let seqs: Vec<&[u32]> = row.seqs.iter().map(Vec::as_slice).collect();
        out.extend(self.cost_columns(&seqs, median, LETTERS));
        if row.kind == RowKind::Latency {
            let p = answers.and_then(|mut a| a.pop()).unwrap_or_default();
            out.insert("probs_26".into(), json!(p));
        }
        eprintln!(
            "[bench] {} {}: {} tokens, median {median:.3} ms over {} runs ({:.0} tokens/s)",
            row.kind.name(),
            row.name,
            row.tokens(),
            times.len(),
            out["tokens_per_s"].as_f64().unwrap_or(0.0)
        );
        Ok(out)
    }
}

fn push(report: &mut Map<String, Value>, key: &str, value: Value) {
    match report.get_mut(key) {
        Some(Value::Array(a)) => a.push(value),
        _ => {
            report.insert(key.into(), json!([value]));
        }
    }
}

/// `nvidia-smi`'s name, driver and memory of the GPU, or the CPU model; "unknown" otherwise.
fn detect_hardware(device: &Device) -> String {
    match device {
        Device::Cuda(ordinal) => std::process::Command::new("nvidia-smi")
            .args([
                "--query-gpu=name,driver_version,memory.total",
                "--format=csv,noheader",
                "-i",
                &ordinal.to_string(),
            ])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "unknown GPU (nvidia-smi not available)".into()),
        Device::Cpu => {
            let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
            let model = info
                .lines()
                .find_map(|l| l.strip_prefix("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string());
            let threads = std::thread::available_parallelism().map_or(0, |n| n.get());
            match model {
                Some(m) => format!("{m} ({threads} threads available)"),
                None => format!("unknown CPU ({threads} threads available)"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate() {
        let s = summarize(&[4.0, 1.0, 3.0, 2.0]);
        assert_eq!(s["median_ms"], 2.5);
        assert_eq!(s["min_ms"], 1.0);
        assert_eq!(s["max_ms"], 4.0);
        assert!((s["p90_ms"].as_f64().unwrap() - 3.7).abs() < 1e-9);
        assert!((s["p10_ms"].as_f64().unwrap() - 1.3).abs() < 1e-9);
        assert_eq!(s["runs_ms"], json!([4.0, 1.0, 3.0, 2.0]));
    }
}
