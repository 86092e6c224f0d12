//! `instinct-loadtest`: see `loadtest/README.md`.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = instinct_loadtest::cli::Args::parse();
    match instinct_loadtest::app::run_and_render(&args).await {
        Ok(text) => {
            print!("{text}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("instinct-loadtest: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
