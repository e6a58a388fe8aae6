//! Events written to `sandbox_events`, and those that could not be.

use super::register;
use crate::domain::event::{Event, EventReason};
use prometheus::{IntCounter, IntCounterVec, Opts, Registry};

/// The event log's metrics.
pub(crate) struct EventMetrics {
    recorded: IntCounterVec,
    lost: IntCounter,
}

impl EventMetrics {
    pub(crate) fn new(registry: &Registry) -> Self {
        let m = EventMetrics {
            recorded: register(registry, IntCounterVec::new(
                Opts::new("sandboxd_events_total", "Events recorded in sandbox_events, by reason (provisioned, claimed, healed, rotated, reaped, failed, backoff)"),
                &["reason"]
            )),
            lost: register(registry, IntCounter::new(
                "sandboxd_events_lost_total",
                "Events that could not be written to sandbox_events (the state database failed; the reconcile went on)"
            )),
        };
        for reason in EventReason::ALL {
            m.recorded.with_label_values(&[reason.as_str()]);
        }
        m
    }

    /// Events written to `sandbox_events`.
    pub(crate) fn recorded(&self, events: &[Event]) {
        for e in events {
            self.recorded.with_label_values(&[e.reason.as_str()]).inc();
        }
    }

    /// Events that could not be written.
    pub(crate) fn lost(&self, n: usize) {
        self.lost.inc_by(n as u64);
    }
}
