//! The watches that wake the controller: NOTIFY messages from
//! `sandbox_desired`, Docker container events, and stream reconnects.

use super::register;
use crate::ports::runtime::ContainerAction;
use crate::ports::store::NotifyQueue;
use crate::ports::StreamSource;
use prometheus::{Gauge, IntCounter, IntCounterVec, Opts, Registry};
use std::sync::Mutex;

/// The watches' metrics.
pub(crate) struct WatchMetrics {
    notify_wakeups: IntCounter,
    docker_events: IntCounterVec,
    stream_restarts: IntCounterVec,
    notify_queue_usage: Gauge,
    notify_skipped: IntCounter,
    /// The database's skip count when last read (`None`: never read): the
    /// counter adds what it grew by since, so it counts the skips this
    /// process saw, from 0, as a counter should.
    skipped_seen: Mutex<Option<i64>>,
}

impl WatchMetrics {
    pub(crate) fn new(registry: &Registry) -> Self {
        let m = WatchMetrics {
            notify_wakeups: register(
                registry,
                IntCounter::new(
                    "sandboxd_notify_wakeups_total",
                    "NOTIFY messages received from sandbox_desired",
                ),
            ),
            docker_events: register(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "sandboxd_docker_events_total",
                        "Docker container events received, by action",
                    ),
                    &["action"],
                ),
            ),
            stream_restarts: register(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "sandboxd_watch_stream_restarts_total",
                        "Watch stream reconnects, by source",
                    ),
                    &["source"],
                ),
            ),
            notify_queue_usage: register(
                registry,
                Gauge::new(
                    "sandboxd_notify_queue_usage",
                    "Fraction of the state database cluster's NOTIFY queue in use \
                     (pg_notification_queue_usage), read at each relist; at 0.25 \
                     sandboxd's writes stop notifying",
                ),
            ),
            notify_skipped: register(
                registry,
                IntCounter::new(
                    "sandboxd_notify_skipped_total",
                    "Notifications the state database's writes skipped because the \
                     NOTIFY queue was a quarter full or more, or failed (read at each relist)",
                ),
            ),
            skipped_seen: Mutex::new(None),
        };
        for source in StreamSource::ALL {
            m.stream_restarts.with_label_values(&[source.as_str()]);
        }
        m
    }

    /// The notification queue as a relist read it.
    pub(crate) fn notify_queue(&self, queue: NotifyQueue) {
        self.notify_queue_usage.set(queue.usage);
        let mut seen = self.skipped_seen.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(before) = *seen {
            // A restored database's sequence may go back: add nothing then.
            let grown = queue.skipped.saturating_sub(before).max(0);
            self.notify_skipped.inc_by(grown.unsigned_abs());
        }
        *seen = Some(queue.skipped);
    }

    /// One NOTIFY received.
    pub(crate) fn notify_wakeup(&self) {
        self.notify_wakeups.inc();
    }

    /// One Docker event received.
    pub(crate) fn docker_event(&self, action: ContainerAction) {
        self.docker_events
            .with_label_values(&[action.as_str()])
            .inc();
    }

    /// One reconnect of a watch stream.
    pub(crate) fn stream_restarted(&self, source: StreamSource) {
        self.stream_restarts
            .with_label_values(&[source.as_str()])
            .inc();
    }
}
