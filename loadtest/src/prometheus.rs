//! Server-side phase breakdown from `/metrics` (Prometheus text format), scraped before and
//! after a run: the delta of each phase histogram gives its count, sum, mean and bucket-estimated
//! quantiles over exactly the run's requests (plus any other traffic the server had meanwhile).

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

/// Phase name in the report → the server's histogram (seconds). The one place to edit when the
/// server renames a metric.
pub const PHASE_HISTOGRAMS: &[(&str, &str)] = &[
    ("total", "instinct_request_duration_seconds"),
    ("queue_wait", "instinct_queue_wait_seconds"),
    ("prepare", "instinct_prepare_seconds"),
    ("infer", "instinct_infer_seconds"),
];

/// One histogram, summed over all label sets except `le`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistogramSnapshot {
    pub sum: f64,
    pub count: f64,
    /// Cumulative bucket counts by upper bound (`le`, seconds; +Inf included).
    pub buckets: BTreeMap<OrderedBound, f64>,
}

/// A bucket upper bound that sorts numerically (+Inf last).
#[derive(Debug, Clone, Copy)]
pub struct OrderedBound(pub f64);
impl PartialEq for OrderedBound {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}
impl Eq for OrderedBound {}
impl PartialOrd for OrderedBound {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for OrderedBound {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// Per-phase statistics over the interval between two scrapes.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PhaseDelta {
    pub metric: String,
    pub count: f64,
    pub sum_s: f64,
    pub mean_ms: Option<f64>,
    /// Estimated from bucket deltas by linear interpolation (as Prometheus' histogram_quantile).
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

/// Parses the histograms named in [`PHASE_HISTOGRAMS`] out of an exposition text.
pub fn parse(text: &str) -> HashMap<String, HistogramSnapshot> {
    let wanted: Vec<&str> = PHASE_HISTOGRAMS.iter().map(|(_, m)| *m).collect();
    let mut out: HashMap<String, HistogramSnapshot> = HashMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some(sample) = Sample::parse(line) else {
            continue;
        };
        for base in &wanted {
            let Some(suffix) = sample.name.strip_prefix(base) else {
                continue;
            };
            let entry = out.entry(base.to_string()).or_default();
            match suffix {
                "_sum" => entry.sum += sample.value,
                "_count" => entry.count += sample.value,
                "_bucket" => {
                    if let Some(le) = sample.label("le").and_then(parse_bound) {
                        *entry.buckets.entry(OrderedBound(le)).or_default() += sample.value;
                    }
                }
                _ => {}
            }
        }
    }
    out
}

/// The per-phase deltas `after − before`; phases the server does not export are left out.
pub fn phase_deltas(
    before: &HashMap<String, HistogramSnapshot>,
    after: &HashMap<String, HistogramSnapshot>,
) -> BTreeMap<String, PhaseDelta> {
    let mut out = BTreeMap::new();
    for (phase, metric) in PHASE_HISTOGRAMS {
        let Some(a) = after.get(*metric) else {
            continue;
        };
        let empty = HistogramSnapshot::default();
        let b = before.get(*metric).unwrap_or(&empty);
        let count = a.count - b.count;
        let sum_s = a.sum - b.sum;
        let buckets: Vec<(f64, f64)> = a
            .buckets
            .iter()
            .map(|(le, n)| (le.0, n - b.buckets.get(le).copied().unwrap_or(0.0)))
            .collect();
        out.insert(
            phase.to_string(),
            PhaseDelta {
                metric: metric.to_string(),
                count,
                sum_s,
                mean_ms: (count > 0.0).then(|| sum_s / count * 1000.0),
                p50_ms: bucket_quantile(&buckets, 0.5).map(|s| s * 1000.0),
                p99_ms: bucket_quantile(&buckets, 0.99).map(|s| s * 1000.0),
            },
        );
    }
    out
}

/// Quantile `q` of cumulative buckets (upper bound, cumulative count), sorted by bound.
fn bucket_quantile(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut prev_bound = 0.0;
    let mut prev_count = 0.0;
    for &(bound, cumulative) in buckets {
        if cumulative >= rank {
            if bound.is_infinite() {
                return Some(prev_bound);
            }
            let in_bucket = cumulative - prev_count;
            let fraction = if in_bucket > 0.0 {
                (rank - prev_count) / in_bucket
            } else {
                1.0
            };
            return Some(prev_bound + (bound - prev_bound) * fraction);
        }
        prev_bound = bound;
        prev_count = cumulative;
    }
    Some(prev_bound)
}

fn parse_bound(le: &str) -> Option<f64> {
    match le {
        "+Inf" | "Inf" | "+inf" => Some(f64::INFINITY),
        other => other.parse().ok(),
    }
}

/// One exposition line: `name{labels} value [timestamp]`.
struct Sample<'a> {
    name: &'a str,
    labels: &'a str,
    value: f64,
}

impl<'a> Sample<'a> {
    fn parse(line: &'a str) -> Option<Self> {
        let (name, labels, rest) = match line.find('{') {
            Some(open) => {
                let close = line.rfind('}')?;
                (&line[..open], &line[open + 1..close], &line[close + 1..])
            }
            None => {
                let split = line.find(char::is_whitespace)?;
                (&line[..split], "", &line[split..])
            }
        };
        let value = match rest.split_whitespace().next()? {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().ok()?,
        };
        Some(Self {
            name: name.trim(),
            labels,
            value,
        })
    }

    /// The value of label `key` (label values in our metrics never contain `",`).
    fn label(&self, key: &str) -> Option<&'a str> {
        self.labels.split(',').find_map(|pair| {
            let (k, v) = pair.split_once('=')?;
            (k.trim() == key).then(|| v.trim().trim_matches('"'))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "\
# HELP instinct_infer_seconds Time in the forward pass.
# TYPE instinct_infer_seconds histogram
instinct_infer_seconds_bucket{gpu=\"0\",le=\"0.001\"} 0
instinct_infer_seconds_bucket{gpu=\"0\",le=\"0.01\"} 10
instinct_infer_seconds_bucket{gpu=\"0\",le=\"+Inf\"} 10
instinct_infer_seconds_sum{gpu=\"0\"} 0.05
instinct_infer_seconds_count{gpu=\"0\"} 10
instinct_requests_total{status=\"200\"} 10
";
    const AFTER: &str = "\
instinct_infer_seconds_bucket{gpu=\"0\",le=\"0.001\"} 0
instinct_infer_seconds_bucket{gpu=\"0\",le=\"0.01\"} 40
instinct_infer_seconds_bucket{gpu=\"0\",le=\"+Inf\"} 60
instinct_infer_seconds_bucket{gpu=\"1\",le=\"0.001\"} 0
instinct_infer_seconds_bucket{gpu=\"1\",le=\"0.01\"} 50
instinct_infer_seconds_bucket{gpu=\"1\",le=\"+Inf\"} 50
instinct_infer_seconds_sum{gpu=\"0\"} 1.05
instinct_infer_seconds_count{gpu=\"0\"} 60
instinct_infer_seconds_sum{gpu=\"1\"} 0.25
instinct_infer_seconds_count{gpu=\"1\"} 50
instinct_prepare_seconds_sum 0.2
instinct_prepare_seconds_count 100 1700000000000
";

    #[test]
    fn deltas_sum_over_label_sets() {
        let d = phase_deltas(&parse(BEFORE), &parse(AFTER));
        let infer = &d["infer"];
        assert_eq!(infer.count, 100.0);
        assert!((infer.sum_s - 1.25).abs() < 1e-9);
        assert!((infer.mean_ms.unwrap() - 12.5).abs() < 1e-9);
        // Bucket deltas: ≤1 ms: 0, ≤10 ms: 80, +Inf: 100 → p50 inside (1, 10] ms.
        let p50 = infer.p50_ms.unwrap();
        assert!((p50 - (1.0 + 9.0 * 50.0 / 80.0)).abs() < 1e-9, "{p50}");
        assert_eq!(infer.p99_ms.unwrap(), 10.0);
        // A phase without a "before" (first scrape) is a delta from zero.
        let prepare = &d["prepare"];
        assert_eq!(prepare.count, 100.0);
        assert!((prepare.mean_ms.unwrap() - 2.0).abs() < 1e-9);
        assert!(prepare.p50_ms.is_none());
        assert!(!d.contains_key("queue_wait"));
    }

    #[test]
    fn garbage_lines_are_ignored() {
        let h =
            parse("instinct_infer_seconds_sum\nnot a metric\ninstinct_infer_seconds_count{} x\n");
        assert_eq!(h.get("instinct_infer_seconds").map(|s| s.count), None);
    }
}
