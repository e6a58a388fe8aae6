//! The leader lease, as numbers: its term (the fencing token) and the
//! timings a holder and a standby follow.
//!
//! One `sandboxd run` per state database leads; it holds a lease row in
//! Postgres with an expiry on the database's clock and renews it every
//! [`LeasePolicy::renew_every`]. It trusts its own lease only until
//! [`LeasePolicy::trust_for`] after the start of its last successful
//! renewal (by its own clock): a safety margin before the database can
//! hand the lease to someone else, since the database's expiry counts from
//! a moment after that start. Standbys try to take the lease every
//! `renew_every`; once the holder is gone, one of them leads within
//! `duration + renew_every`.

use chrono::{DateTime, Utc};
use std::fmt;
use std::time::Duration;

/// The label on every container sandboxd creates that names the term of
/// the leader that created it (which process made it, after the fact).
pub const TERM_LABEL: &str = "io.sandboxd.leader-term";

/// A leadership term: grows by one at every acquisition of the lease.
/// Every status write carries it, and the database refuses a term that is
/// not the current lease's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Term(pub i64);

impl fmt::Display for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Who holds the lease, as the database says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseHolder {
    /// The holder's name (`host:pid:random`).
    pub holder: String,
    /// Its term.
    pub term: Term,
    /// When the lease runs out unless renewed (the database's clock).
    pub expires_at: DateTime<Utc>,
}

/// Invalid lease timings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    /// Too short to renew and fence safely.
    #[error("lease duration {0:?} is too short: use at least 1s (default 15s)")]
    TooShort(Duration),
}

/// How long a lease lasts and how its holder and standbys act on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeasePolicy {
    /// How long the database keeps a renewed lease for its holder.
    pub duration: Duration,
}

impl Default for LeasePolicy {
    fn default() -> Self {
        Self {
            duration: Duration::from_secs(15),
        }
    }
}

impl LeasePolicy {
    /// A policy for leases of `duration` (at least a second).
    pub fn new(duration: Duration) -> Result<Self, LeaseError> {
        if duration < Duration::from_secs(1) {
            return Err(LeaseError::TooShort(duration));
        }
        Ok(Self { duration })
    }

    /// How often the holder renews and a standby tries to take over: a
    /// fifth of the lease, so a holder has three tries before it stops
    /// trusting its lease.
    pub fn renew_every(&self) -> Duration {
        self.duration / 5
    }

    /// How long after the start of its last successful renewal the holder
    /// still acts as leader: two thirds of the lease. The last third is the
    /// safety margin for a slow renewal, a slow clock and a call already
    /// under way.
    pub(crate) fn trust_for(&self) -> Duration {
        self.duration * 2 / 3
    }

    /// Bound on one renewal or acquisition call: half the trusted time,
    /// so a stuck call leaves time for another try. (A slow renewal that
    /// succeeds is still safe: trust counts from when it began.)
    pub(crate) fn call_timeout(&self) -> Duration {
        self.trust_for() / 2
    }

    /// How long after a holder stops renewing a standby leads at the
    /// latest (the lease runs out, then the standby's next try).
    pub fn takeover_within(&self) -> Duration {
        self.duration + self.renew_every()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn the_holder_stops_trusting_its_lease_well_before_the_database_lets_it_go() {
        for d in [1, 3, 15, 60] {
            let p = LeasePolicy::new(secs(d)).unwrap();
            // Three renewals fit before trust runs out...
            assert!(p.renew_every() * 3 <= p.trust_for(), "{d}s");
            // ...and a third of the lease is left as the margin.
            assert!(p.duration - p.trust_for() >= p.duration / 3, "{d}s");
            assert!(p.call_timeout() * 2 <= p.trust_for());
            assert!(p.takeover_within() > p.duration);
        }
    }

    #[test]
    fn the_default_lease_is_fifteen_seconds_renewed_every_three() {
        let p = LeasePolicy::default();
        assert_eq!(p.duration, secs(15));
        assert_eq!(p.renew_every(), secs(3));
        assert_eq!(p.trust_for(), secs(10));
        assert_eq!(p.takeover_within(), secs(18));
    }

    #[test]
    fn a_lease_shorter_than_a_second_is_refused_with_the_default_named() {
        let e = LeasePolicy::new(Duration::from_millis(500)).unwrap_err();
        assert!(e.to_string().contains("default 15s"), "{e}");
    }
}
