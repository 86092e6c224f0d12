//! The byte budget of request memory: what the server holds for requests in flight (bodies while
//! they are read and parsed, parsed requests, token ids, screenshot features and positions) never
//! exceeds `--max-inflight-mib`. A request reserves its declared body size before its body is
//! read, resizes the reservation to what it holds once prepared, and gives it back when answered.
//! A reservation that does not fit is refused at once (503), never waited for, so a burst of large
//! bodies cannot exhaust memory or pile up.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use metrics::gauge;

use crate::metrics as m;

/// Bytes held by requests in flight, against a limit.
#[derive(Debug)]
pub struct ByteBudget {
    limit: usize,
    used: AtomicUsize,
    peak: AtomicUsize,
    /// The gauges of what is used and of the limit.
    gauges: (&'static str, &'static str),
}

impl ByteBudget {
    pub fn new(limit: usize) -> Arc<Self> {
        Self::with_gauges(limit, (m::INFLIGHT_BYTES, m::INFLIGHT_BYTES_LIMIT))
    }

    /// A budget published as `gauges` (used, limit) instead of the in-flight ones.
    pub fn with_gauges(limit: usize, gauges: (&'static str, &'static str)) -> Arc<Self> {
        gauge!(gauges.1).set(limit as f64);
        Arc::new(Self {
            limit,
            used: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            gauges,
        })
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes reserved now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::SeqCst)
    }

    /// The most bytes ever reserved at once.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }

    /// Reserves `bytes`, or `None` when they would take the budget over its limit.
    pub fn try_reserve(self: &Arc<Self>, bytes: usize) -> Option<Reservation> {
        self.grow(bytes).then(|| Reservation {
            budget: self.clone(),
            bytes,
        })
    }

    fn grow(&self, bytes: usize) -> bool {
        let grown = self
            .used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                used.checked_add(bytes).filter(|&n| n <= self.limit)
            });
        match grown {
            Ok(before) => {
                self.peak.fetch_max(before + bytes, Ordering::SeqCst);
                self.publish();
                true
            }
            Err(_) => false,
        }
    }

    fn shrink(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::SeqCst);
        self.publish();
    }

    fn publish(&self) {
        gauge!(self.gauges.0).set(self.used() as f64);
    }
}

/// Bytes held for one request; given back when dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<ByteBudget>,
    bytes: usize,
}

impl Reservation {
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Makes the reservation `bytes`: shrinking always succeeds; growing fails (leaving it as it
    /// was) when the budget cannot take the difference.
    pub fn resize(&mut self, bytes: usize) -> bool {
        if bytes <= self.bytes {
            self.budget.shrink(self.bytes - bytes);
        } else if !self.budget.grow(bytes - self.bytes) {
            return false;
        }
        self.bytes = bytes;
        true
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.shrink(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_never_take_the_budget_over_its_limit_and_give_back_on_drop() {
        let budget = ByteBudget::new(100);
        let mut a = budget.try_reserve(60).unwrap();
        assert!(budget.try_reserve(41).is_none());
        let b = budget.try_reserve(40).unwrap();
        assert_eq!(budget.used(), 100);
        assert!(!a.resize(61), "growing past the limit fails");
        assert_eq!(a.bytes(), 60);
        assert!(a.resize(10));
        assert_eq!(budget.used(), 50);
        assert!(a.resize(60));
        drop(b);
        assert_eq!(budget.used(), 60);
        drop(a);
        assert_eq!(budget.used(), 0);
        assert_eq!(budget.peak(), 100);
        assert!(budget.try_reserve(usize::MAX).is_none(), "no overflow");
    }

    #[test]
    fn racing_reservations_hold_the_bound() {
        let budget = ByteBudget::new(1000);
        let held: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    let budget = budget.clone();
                    s.spawn(move || {
                        (0..1000)
                            .filter_map(|_| budget.try_reserve(7))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect()
        });
        assert_eq!(held.len(), 1000 / 7);
        assert!(budget.peak() <= 1000);
        drop(held);
        assert_eq!(budget.used(), 0);
    }
}
