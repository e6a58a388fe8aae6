//! The reaping circuit breaker's rule: when one look at the fleet finds
//! too many sandboxes whose desired row is missing, reaping stops until an
//! operator says the deletions are real.
//!
//! Rows vanish in bulk when the state database is emptied, restored from
//! an old backup or truncated; a controller that reaped on that signal
//! alone would destroy every sandbox. Rows deleted one by one leave a
//! tombstone and do not count, as lost or in the fleet: an orchestrator may
//! release everything. So: more than `share` of the sandboxes that have
//! containers and were not released, and at least `min` of them, missing at
//! once pauses reaping of deleted rows (expired, idle and released-owner
//! sandboxes are unaffected: their rows say so).

use chrono::{DateTime, Utc};

/// Whether reaping is paused, as the state database records it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReapingState {
    /// Reaping of deleted rows is paused.
    pub paused: bool,
    /// Why (empty unless paused).
    pub reason: String,
    pub(crate) paused_at: Option<DateTime<Utc>>,
}

/// Invalid breaker settings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BreakerError {
    /// The share is not a fraction.
    #[error(
        "reap breaker share {0} must be between 0 and 1 (default 0.5; 1 turns the breaker off)"
    )]
    Share(String),
}

/// When the breaker trips.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BreakerPolicy {
    /// Trips when more than this share of the sandboxes with containers
    /// have lost their row at once.
    pub share: f64,
    /// ...and at least this many.
    pub min: usize,
}

impl Default for BreakerPolicy {
    fn default() -> Self {
        Self { share: 0.5, min: 5 }
    }
}

impl BreakerPolicy {
    /// A policy; `share` must be within 0..=1.
    pub fn new(share: f64, min: usize) -> Result<Self, BreakerError> {
        if !(0.0..=1.0).contains(&share) {
            return Err(BreakerError::Share(share.to_string()));
        }
        Ok(Self { share, min })
    }

    /// Whether `missing` sandboxes without a row, out of `fleet` sandboxes
    /// with containers, trip the breaker.
    pub(crate) fn trips(&self, missing: usize, fleet: usize) -> bool {
        missing >= self.min.max(1) && (missing as f64) > self.share * fleet as f64
    }

    /// Why it tripped, for the status of the pause.
    pub fn reason(&self, missing: usize, fleet: usize) -> String {
        format!(
            "{missing} of {fleet} sandboxes lost their desired row at once (more than {:.0}% and at least {}): \
             an emptied, restored or truncated state database looks like this; check sandbox_desired, then run \
             `sandboxd resume-reaping` if the deletions are real",
            self.share * 100.0,
            self.min
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_breaker_trips_on_more_than_half_and_at_least_five() {
        let p = BreakerPolicy::default();
        // (missing, fleet, trips)
        for (missing, fleet, trips) in [
            (0, 0, false),
            (4, 4, false),  // all gone, but fewer than five
            (5, 5, true),   // all of five
            (5, 10, false), // exactly half is not more than half
            (6, 10, true),
            (50, 100, false),
            (51, 100, true),
            (1, 100, false), // one deletion among many
            (5, 0, true),    // rows missing, containers listed in another way
        ] {
            assert_eq!(p.trips(missing, fleet), trips, "{missing} of {fleet}");
        }
    }

    #[test]
    fn a_share_of_one_turns_the_breaker_off_and_a_bad_share_is_refused() {
        let off = BreakerPolicy::new(1.0, 5).unwrap();
        assert!(!off.trips(100, 100));
        assert!(BreakerPolicy::new(1.5, 5).is_err());
        assert!(BreakerPolicy::new(-0.1, 5)
            .unwrap_err()
            .to_string()
            .contains("default 0.5"));
    }

    #[test]
    fn the_reason_says_what_happened_and_what_to_do() {
        let r = BreakerPolicy::default().reason(7, 8);
        assert!(r.contains("7 of 8"), "{r}");
        assert!(r.contains("sandboxd resume-reaping"), "{r}");
    }
}
