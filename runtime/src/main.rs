use clap::Parser;
use instinct::cli::{Cli, Command};
use tracing_subscriber::EnvFilter;

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("INSTINCT_LOG").unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    // With no subcommand, `serve` is meant; parse it as such so its environment variables apply.
    let command = match Cli::parse().command {
        Some(command) => command,
        None => Cli::parse_from(["instinct", "serve"])
            .command
            .expect("`serve` parses as a subcommand"),
    };
    match command {
        Command::Serve(args) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
            .block_on(instinct::serve::run(*args)),
        Command::Check(args) => instinct::check::run(&args),
        Command::Bench(args) => instinct::bench::run(&args),
        Command::BuildTokenizer(args) => {
            let tokenizer = instinct_model::tokenizer::build_qwen35_tokenizer(&args.vocab)?;
            tokenizer
                .save(&args.out, false)
                .map_err(|e| anyhow::anyhow!("writing {}: {e}", args.out.display()))?;
            eprintln!("wrote {}", args.out.display());
            Ok(())
        }
    }
}
