//! Measured drain rate (tokens served per second over a recent window), turned into the
//! `Retry-After` of a rejection.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Completed batches of the recent window: (start, end, tokens).
#[derive(Debug)]
pub(crate) struct DrainRate {
    window: Duration,
    batches: VecDeque<(Instant, Instant, usize)>,
}

impl DrainRate {
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            batches: VecDeque::new(),
        }
    }

    pub fn record(&mut self, start: Instant, end: Instant, tokens: usize) {
        self.batches.push_back((start, end, tokens));
        self.prune(end);
    }

    fn prune(&mut self, now: Instant) {
        while let Some(&(_, end, _)) = self.batches.front() {
            if now.saturating_duration_since(end) > self.window {
                self.batches.pop_front();
            } else {
                break;
            }
        }
    }

    /// Tokens per second over the batches that ended within the window, measured from the start
    /// of the earliest of them to `now` (so several engines running at once add up, and idle time
    /// since the last batch lowers the rate). `None` before any measurement.
    pub fn tokens_per_second(&mut self, now: Instant) -> Option<f64> {
        self.prune(now);
        let first_start = self.batches.iter().map(|b| b.0).min()?;
        let tokens: usize = self.batches.iter().map(|b| b.2).sum();
        let span = now.saturating_duration_since(first_start).as_secs_f64();
        (span > 0.0 && tokens > 0).then(|| tokens as f64 / span)
    }

    /// Time to serve `backlog_tokens` at the measured rate, clamped to `[min, max]`; `default`
    /// (clamped too) before any measurement.
    pub fn retry_after(
        &mut self,
        now: Instant,
        backlog_tokens: usize,
        default: Duration,
        min: Duration,
        max: Duration,
    ) -> Duration {
        let estimate = match self.tokens_per_second(now) {
            Some(rate) => Duration::try_from_secs_f64(backlog_tokens as f64 / rate).unwrap_or(max),
            None => default,
        };
        estimate.clamp(min, max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::from_secs(60);

    #[test]
    fn default_before_any_measurement() {
        let mut r = DrainRate::new(Duration::from_secs(10));
        let now = Instant::now();
        assert_eq!(r.tokens_per_second(now), None);
        let d = Duration::from_secs(2);
        assert_eq!(r.retry_after(now, 1_000_000, d, MIN, MAX), d);
    }

    #[test]
    fn estimate_is_backlog_over_rate_and_clamped() {
        let mut r = DrainRate::new(Duration::from_secs(10));
        let t0 = Instant::now();
        // 2 batches of 1000 tokens over 2 s: 1000 tokens/s.
        r.record(t0, t0 + Duration::from_secs(1), 1000);
        r.record(
            t0 + Duration::from_secs(1),
            t0 + Duration::from_secs(2),
            1000,
        );
        let now = t0 + Duration::from_secs(2);
        let rate = r.tokens_per_second(now).unwrap();
        assert!((rate - 1000.0).abs() < 1e-6, "{rate}");
        let d = Duration::from_secs(1);
        assert_eq!(
            r.retry_after(now, 5_000, d, MIN, MAX),
            Duration::from_secs(5)
        );
        assert_eq!(r.retry_after(now, 10, d, MIN, MAX), MIN);
        assert_eq!(r.retry_after(now, 10_000_000, d, MIN, MAX), MAX);
    }

    #[test]
    fn old_batches_leave_the_window() {
        let mut r = DrainRate::new(Duration::from_secs(10));
        let t0 = Instant::now();
        r.record(t0, t0 + Duration::from_secs(1), 1000);
        assert!(r.tokens_per_second(t0 + Duration::from_secs(5)).is_some());
        assert_eq!(r.tokens_per_second(t0 + Duration::from_secs(12)), None);
    }
}
