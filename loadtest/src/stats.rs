//! Latency distributions: HdrHistogram at microsecond resolution, summarized in milliseconds.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Largest recordable value (1 hour); longer values are clamped to it.
const MAX_MICROS: u64 = 3_600_000_000;

/// The percentiles every latency in the report is summarized by (milliseconds).
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Percentiles {
    pub count: u64,
    pub mean: f64,
    pub min: f64,
    pub p50: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
    pub p99_9: f64,
    pub max: f64,
}

/// A histogram of durations.
#[derive(Debug, Clone)]
pub struct LatencyHistogram {
    hist: Histogram<u64>,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyHistogram {
    pub fn new() -> Self {
        Self {
            // 3 significant digits: every percentile is within 0.1 % of the recorded value.
            hist: Histogram::new_with_bounds(1, MAX_MICROS, 3)
                .expect("static histogram bounds are valid"),
        }
    }

    pub fn record(&mut self, d: Duration) {
        let micros = (d.as_micros() as u64).clamp(1, MAX_MICROS);
        self.hist
            .record(micros)
            .expect("the value is clamped to the histogram's range");
    }

    /// Records a duration given in milliseconds (negative and non-finite values are skipped).
    pub fn record_ms(&mut self, ms: f64) {
        if ms.is_finite() && ms >= 0.0 {
            self.record(Duration::from_secs_f64(ms / 1000.0));
        }
    }

    pub fn len(&self) -> u64 {
        self.hist.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hist.is_empty()
    }

    /// The percentile summary, or `None` when nothing was recorded.
    pub fn summary(&self) -> Option<Percentiles> {
        if self.hist.is_empty() {
            return None;
        }
        let ms = |micros: u64| micros as f64 / 1000.0;
        let q = |quantile: f64| ms(self.hist.value_at_quantile(quantile));
        Some(Percentiles {
            count: self.hist.len(),
            mean: self.hist.mean() / 1000.0,
            min: ms(self.hist.min()),
            p50: q(0.5),
            p90: q(0.9),
            p95: q(0.95),
            p99: q(0.99),
            p99_9: q(0.999),
            max: ms(self.hist.max()),
        })
    }

    /// Points `(latency ms, fraction of requests at or below it)` of the distribution function,
    /// denser in the tail.
    pub fn cdf(&self) -> Vec<[f64; 2]> {
        if self.hist.is_empty() {
            return Vec::new();
        }
        let mut quantiles: Vec<f64> = (0..=90).map(|i| i as f64 / 100.0).collect();
        quantiles.extend((91..=99).map(|i| i as f64 / 100.0));
        quantiles.extend([0.995, 0.999, 0.9999, 1.0]);
        let mut points: Vec<[f64; 2]> = Vec::with_capacity(quantiles.len());
        for q in quantiles {
            let value = self.hist.value_at_quantile(q);
            let fraction = self.hist.count_between(0, value) as f64 / self.hist.len() as f64;
            let point = [value as f64 / 1000.0, fraction];
            if points.last() != Some(&point) {
                points.push(point);
            }
        }
        points
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(actual: f64, expected: f64) -> bool {
        (actual - expected).abs() <= expected * 0.001 + 1e-9
    }

    #[test]
    fn percentiles_of_a_uniform_ramp() {
        // 1, 2, …, 10000 ms: the q-quantile is q × 10000 ms.
        let mut h = LatencyHistogram::new();
        for ms in 1..=10_000u64 {
            h.record(Duration::from_millis(ms));
        }
        let p = h.summary().unwrap();
        assert_eq!(p.count, 10_000);
        assert!(close(p.min, 1.0), "{}", p.min);
        assert!(close(p.p50, 5000.0), "{}", p.p50);
        assert!(close(p.p90, 9000.0), "{}", p.p90);
        assert!(close(p.p95, 9500.0), "{}", p.p95);
        assert!(close(p.p99, 9900.0), "{}", p.p99);
        assert!(close(p.p99_9, 9990.0), "{}", p.p99_9);
        assert!(close(p.max, 10_000.0), "{}", p.max);
        assert!(close(p.mean, 5000.5), "{}", p.mean);
    }

    #[test]
    fn percentiles_of_a_two_point_distribution() {
        // 98 % at 10 ms, 2 % at 500 ms: p95 is still 10 ms, p99 is 500 ms.
        let mut h = LatencyHistogram::new();
        for i in 0..1000 {
            h.record_ms(if i % 50 == 0 { 500.0 } else { 10.0 });
        }
        let p = h.summary().unwrap();
        assert!(close(p.p50, 10.0) && close(p.p95, 10.0), "{p:?}");
        assert!(close(p.p99, 500.0) && close(p.max, 500.0), "{p:?}");
        let cdf = h.cdf();
        assert!(cdf
            .windows(2)
            .all(|w| w[0][0] <= w[1][0] && w[0][1] <= w[1][1]));
        assert_eq!(cdf.last().unwrap()[1], 1.0);
        assert!(cdf
            .iter()
            .any(|p| close(p[0], 10.0) && (p[1] - 0.98).abs() < 1e-9));
    }

    #[test]
    fn empty_and_out_of_range() {
        let mut h = LatencyHistogram::new();
        assert!(h.summary().is_none() && h.cdf().is_empty());
        h.record_ms(f64::NAN);
        h.record_ms(-1.0);
        assert!(h.is_empty());
        h.record(Duration::from_secs(10_000));
        assert!(close(h.summary().unwrap().max, 3_600_000.0));
    }
}
