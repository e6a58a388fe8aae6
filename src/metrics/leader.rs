//! One leader: whether this process holds the lease, in which term, how
//! it got and lost it, its renewals, and the calls its fence refused.

use super::register;
use crate::domain::lease::Term;
use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};

/// The lease's and the fence's metrics.
pub(crate) struct LeaderMetrics {
    leader: IntGauge,
    term: IntGauge,
    acquisitions: IntCounter,
    takeovers: IntCounter,
    losses: IntCounter,
    renewals: IntCounterVec,
    fenced: IntCounterVec,
}

impl LeaderMetrics {
    pub(crate) fn new(registry: &Registry) -> Self {
        let m = LeaderMetrics {
            leader: register(registry, IntGauge::new(
                "sandboxd_leader",
                "1 while this process leads (holds the lease), 0 while it stands by"
            )),
            term: register(registry, IntGauge::new(
                "sandboxd_leader_term",
                "The lease term this process last led in (0: never)"
            )),
            acquisitions: register(registry, IntCounter::new(
                "sandboxd_leader_acquisitions_total",
                "Times this process took the lease"
            )),
            takeovers: register(registry, IntCounter::new(
                "sandboxd_leader_takeovers_total",
                "Times this process took a lease another holder had had (term above 1)"
            )),
            losses: register(registry, IntCounter::new(
                "sandboxd_leader_losses_total",
                "Times this process lost the lease while leading (taken over, or not renewed in time)"
            )),
            renewals: register(registry, IntCounterVec::new(
                Opts::new("sandboxd_lease_renewals_total", "Lease renewals by the leader, by result (ok, error, lost)"),
                &["result"]
            )),
            fenced: register(registry, IntCounterVec::new(
                Opts::new("sandboxd_fenced_total", "Docker changes and status writes refused because this process did not lead, by call (docker, status)"),
                &["call"]
            )),
        };
        for result in ["ok", "error", "lost"] {
            m.renewals.with_label_values(&[result]);
        }
        for call in ["docker", "status"] {
            m.fenced.with_label_values(&[call]);
        }
        m
    }

    /// Leading in `term`, or standing by (`None`).
    pub(crate) fn leading(&self, term: Option<Term>) {
        self.leader.set(i64::from(term.is_some()));
        if let Some(t) = term {
            self.term.set(t.0);
        }
    }

    /// This process took the lease in `term`.
    pub(crate) fn acquired(&self, term: Term) {
        self.acquisitions.inc();
        if term.0 > 1 {
            self.takeovers.inc();
        }
    }

    /// This process lost the lease while leading.
    pub(crate) fn lost(&self) {
        self.losses.inc();
    }

    /// One lease renewal: `ok`, `error` or `lost`.
    pub(crate) fn lease_renewal(&self, result: &'static str) {
        self.renewals.with_label_values(&[result]).inc();
    }

    /// One call refused by the fence: `docker` or `status`.
    pub(crate) fn fenced(&self, call: &'static str) {
        self.fenced.with_label_values(&[call]).inc();
    }
}
