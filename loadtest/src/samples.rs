//! `--samples`: every measured request as one JSON line, with its send time on the wall clock, so
//! the slow requests of one run can be lined up with what another load generator sent meanwhile
//! (the short questions beside the long ones).

use std::io::Write;
use std::path::Path;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};

use crate::client::OutcomeKind;
use crate::runner::Record;

/// JSON lines written as the levels end.
pub struct SampleWriter {
    out: std::io::BufWriter<std::fs::File>,
    /// One instant and the Unix time it was, to place instants on the wall clock.
    anchor: (Instant, f64),
}

impl SampleWriter {
    /// Creates (or truncates) `path`, before anything is sent: a path that cannot be written is
    /// an error at once, not after the run.
    pub fn create(path: &Path) -> Result<Self> {
        let file = std::fs::File::create(path)
            .with_context(|| format!("creating the samples file {}", path.display()))?;
        let unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64() * 1e3);
        Ok(Self {
            out: std::io::BufWriter::new(file),
            anchor: (Instant::now(), unix_ms),
        })
    }

    /// Unix time of `at`, in milliseconds.
    fn unix_ms(&self, at: Instant) -> f64 {
        let (instant, unix_ms) = self.anchor;
        match at.checked_duration_since(instant) {
            Some(after) => unix_ms + after.as_secs_f64() * 1e3,
            None => unix_ms - instant.duration_since(at).as_secs_f64() * 1e3,
        }
    }

    /// One line per record of level `level` (its index among the levels): `level`, `at_unix_ms`
    /// (the latency's origin: the scheduled send in open loop), `latency_ms`, `send_lag_ms`,
    /// `outcome` (`ok`, `503`, or the error's key), `kind`, `decisions`, `input_tokens`,
    /// `server_ms` (the `Server-Timing` phases) and `request_id`.
    pub fn write_level(&mut self, level: usize, records: &[Record]) -> Result<()> {
        for r in records {
            let outcome = match &r.outcome.kind {
                OutcomeKind::Ok => "ok",
                OutcomeKind::Overloaded { .. } => "503",
                OutcomeKind::Error { key } => key.as_str(),
            };
            let server_ms: serde_json::Map<String, serde_json::Value> = r
                .outcome
                .server_timing
                .iter()
                .map(|(name, ms)| (name.clone(), (*ms).into()))
                .collect();
            let line = serde_json::json!({
                "level": level,
                "at_unix_ms": self.unix_ms(r.latency_origin),
                "latency_ms": r.latency().as_secs_f64() * 1e3,
                "send_lag_ms": r.send_lag().as_secs_f64() * 1e3,
                "outcome": outcome,
                "kind": r.kind.name(),
                "decisions": r.outcome.decisions,
                "input_tokens": r.outcome.input_tokens,
                "server_ms": server_ms,
                "request_id": r.outcome.request_id,
            });
            writeln!(self.out, "{line}").context("writing a sample")?;
        }
        self.out.flush().context("writing the samples")
    }
}
