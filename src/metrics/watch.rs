//! The watches that wake the controller: NOTIFY messages from
//! `sandbox_desired`, Docker container events, and stream reconnects.

use super::register;
use crate::ports::runtime::ContainerAction;
use crate::ports::StreamSource;
use prometheus::{IntCounter, IntCounterVec, Opts, Registry};

/// The watches' metrics.
pub(crate) struct WatchMetrics {
    notify_wakeups: IntCounter,
    docker_events: IntCounterVec,
    stream_restarts: IntCounterVec,
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
        };
        for source in StreamSource::ALL {
            m.stream_restarts.with_label_values(&[source.as_str()]);
        }
        m
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
