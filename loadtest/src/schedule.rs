//! Open-loop arrival schedules: the intended send time of every request, fixed before the run.
//!
//! Intervals have mean `1 / rate`. Gamma intervals with shape `k` (the burstiness factor, as in
//! vLLM's `--burstiness` and AIPerf's `--arrival-smoothness`): k = 1 is Poisson, k < 1 is
//! burstier, k > 1 is smoother and tends to constant.

use std::time::Duration;

use anyhow::{bail, Result};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, Exp, Gamma};

/// How requests arrive in open-loop mode.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(tag = "process", rename_all = "lowercase")]
pub enum Arrival {
    /// Evenly spaced, exactly `1 / rate` apart.
    Constant,
    /// Exponential intervals.
    Poisson,
    /// Gamma intervals with shape `burstiness`.
    Gamma { burstiness: f64 },
}

/// Intended send offsets (from the start of the run) of at most `max_requests` requests, none
/// later than `horizon`. The first request is sent at offset 0.
pub fn intended_offsets(
    arrival: Arrival,
    rate: f64,
    max_requests: u64,
    horizon: Duration,
    seed: u64,
) -> Result<Vec<Duration>> {
    if !(rate.is_finite() && rate > 0.0) {
        bail!("the request rate must be a positive number, got {rate}");
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let mut next_interval: Box<dyn FnMut(&mut StdRng) -> f64> = match arrival {
        Arrival::Constant => Box::new(move |_| 1.0 / rate),
        Arrival::Poisson => {
            let exp = Exp::new(rate)?;
            Box::new(move |rng| exp.sample(rng))
        }
        Arrival::Gamma { burstiness } => {
            if !(burstiness.is_finite() && burstiness > 0.0) {
                bail!("the burstiness factor must be a positive number, got {burstiness}");
            }
            let gamma = Gamma::new(burstiness, 1.0 / (rate * burstiness))?;
            Box::new(move |rng| gamma.sample(rng))
        }
    };
    let horizon_s = horizon.as_secs_f64();
    let mut offsets = Vec::new();
    let mut t = 0.0;
    while (offsets.len() as u64) < max_requests && t <= horizon_s {
        offsets.push(Duration::from_secs_f64(t));
        t = match arrival {
            // Multiply rather than accumulate, so rounding never drifts the grid.
            Arrival::Constant => offsets.len() as f64 / rate,
            _ => t + next_interval(&mut rng),
        };
    }
    Ok(offsets)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intervals(offsets: &[Duration]) -> Vec<f64> {
        offsets
            .windows(2)
            .map(|w| (w[1] - w[0]).as_secs_f64())
            .collect()
    }

    fn mean_and_cv(xs: &[f64]) -> (f64, f64) {
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        (mean, var.sqrt() / mean)
    }

    #[test]
    fn processes_have_the_right_mean_and_spread() {
        let h = Duration::from_secs(1_000_000);
        let c = intended_offsets(Arrival::Constant, 100.0, 20_000, h, 1).unwrap();
        let (mean, cv) = mean_and_cv(&intervals(&c));
        assert!((mean - 0.01).abs() < 1e-9 && cv < 1e-6);
        let p = intended_offsets(Arrival::Poisson, 100.0, 20_000, h, 1).unwrap();
        let (mean, cv) = mean_and_cv(&intervals(&p));
        assert!((mean - 0.01).abs() < 0.0005, "{mean}");
        assert!((cv - 1.0).abs() < 0.05, "poisson cv {cv}");
        // Gamma shape k has coefficient of variation 1/sqrt(k).
        let g = intended_offsets(Arrival::Gamma { burstiness: 0.25 }, 100.0, 20_000, h, 1).unwrap();
        let (mean, cv) = mean_and_cv(&intervals(&g));
        assert!((mean - 0.01).abs() < 0.0008, "{mean}");
        assert!((cv - 2.0).abs() < 0.15, "gamma cv {cv}");
    }

    #[test]
    fn bounded_by_count_and_by_time() {
        let by_count =
            intended_offsets(Arrival::Constant, 10.0, 5, Duration::from_secs(100), 0).unwrap();
        assert_eq!(by_count.len(), 5);
        let by_time =
            intended_offsets(Arrival::Constant, 10.0, 1000, Duration::from_secs(2), 0).unwrap();
        assert_eq!(by_time.len(), 21);
        assert!(by_time.iter().all(|t| *t <= Duration::from_secs(2)));
        assert!(intended_offsets(Arrival::Poisson, 0.0, 5, Duration::from_secs(1), 0).is_err());
        assert!(intended_offsets(
            Arrival::Gamma { burstiness: -1.0 },
            1.0,
            5,
            Duration::from_secs(1),
            0
        )
        .is_err());
    }
}
