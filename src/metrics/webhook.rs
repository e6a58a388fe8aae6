//! Events sent to `--webhook-url`: deliveries, failed attempts, retries,
//! and the queue in front of the sender.

use super::register;
use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};

/// The webhook's metrics.
pub(crate) struct WebhookMetrics {
    deliveries: IntCounterVec,
    attempt_errors: IntCounterVec,
    retries: IntCounter,
    dropped: IntCounter,
    queue_depth: IntGauge,
}

impl WebhookMetrics {
    pub(crate) fn new(registry: &Registry) -> Self {
        let m = WebhookMetrics {
            deliveries: register(registry, IntCounterVec::new(
                Opts::new("sandboxd_webhook_deliveries_total", "Events sent to --webhook-url, by result (delivered: a 2xx answer; failed: given up after its retries)"),
                &["result"]
            )),
            attempt_errors: register(registry, IntCounterVec::new(
                Opts::new("sandboxd_webhook_attempt_errors_total", "Failed webhook attempts, by error (unreachable, status, timeout)"),
                &["error"]
            )),
            retries: register(registry, IntCounter::new(
                "sandboxd_webhook_retries_total",
                "Webhook attempts after an event's first (with backoff)"
            )),
            dropped: register(registry, IntCounter::new(
                "sandboxd_webhook_dropped_total",
                "Events not sent to the webhook because its queue was full (--webhook-queue; the events stay in sandbox_events)"
            )),
            queue_depth: register(registry, IntGauge::new(
                "sandboxd_webhook_queue_depth",
                "Events waiting to be sent to the webhook"
            )),
        };
        for result in ["delivered", "failed"] {
            m.deliveries.with_label_values(&[result]);
        }
        for error in ["unreachable", "status", "timeout"] {
            m.attempt_errors.with_label_values(&[error]);
        }
        m
    }

    /// One event sent to the webhook (`delivered`) or given up.
    pub(crate) fn delivery(&self, delivered: bool) {
        let result = if delivered { "delivered" } else { "failed" };
        self.deliveries.with_label_values(&[result]).inc();
    }

    /// One failed webhook attempt (`error`: unreachable, status, timeout).
    pub(crate) fn attempt_failed(&self, error: &'static str) {
        self.attempt_errors.with_label_values(&[error]).inc();
    }

    /// One webhook attempt after an event's first.
    pub(crate) fn retry(&self) {
        self.retries.inc();
    }

    /// One event not queued for the webhook (its queue was full); returns
    /// how many so far.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.inc();
        self.dropped.get()
    }

    /// Events waiting for the webhook: one more (`true`) or one fewer.
    pub(crate) fn queued(&self, added: bool) {
        if added {
            self.queue_depth.inc();
        } else {
            self.queue_depth.dec();
        }
    }
}
