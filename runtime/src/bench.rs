//! `instinct bench`: the benchmark is the `instinct-bench` crate; the server gives it the request
//! contract, with which HTTP mode sizes its requests the way this server reads them.

use anyhow::{anyhow, Context, Result};

pub use instinct_bench::BenchArgs;

use crate::contract;

/// Runs `instinct bench`.
pub fn run(args: &BenchArgs) -> Result<()> {
    instinct_bench::run(args, &user_message_of)
}

/// The user message this server makes of a one-question request body.
fn user_message_of(body: &[u8]) -> Result<String> {
    let request = contract::parse_request(body, "bench")
        .map_err(|problem| anyhow!("the request is refused: {problem}"))?;
    let question = request
        .questions
        .into_iter()
        .next()
        .context("no question")?;
    Ok(question.user)
}
