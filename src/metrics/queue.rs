//! The work queue and the reconciles it runs, under the names
//! controller-runtime exports (`controller_runtime_*`, `workqueue_*`), so
//! existing dashboards work unchanged.

use super::{latency_buckets, register, Metrics};
use crate::sched::{FinishedAs, QueueObserver};
use prometheus::{
    GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
};
use std::time::Duration;

/// The `controller` (and workqueue `name`) label value.
const CONTROLLER: &str = "sandbox";

/// The work queue's and the reconciles' metrics.
pub(crate) struct QueueMetrics {
    reconcile_total: IntCounterVec,
    reconcile_errors: IntCounterVec,
    reconcile_panics: IntCounterVec,
    reconcile_time: HistogramVec,
    timeouts: IntCounter,
    active_workers: IntGaugeVec,
    max_concurrent: IntGaugeVec,
    depth: IntGaugeVec,
    adds: IntCounterVec,
    queue_duration: HistogramVec,
    work_duration: HistogramVec,
    retries: IntCounterVec,
    unfinished_work: GaugeVec,
    longest_running: GaugeVec,
}

impl QueueMetrics {
    pub(crate) fn new(registry: &Registry) -> Self {
        let c = &["controller"];
        let m = QueueMetrics {
            reconcile_total: register(registry, IntCounterVec::new(
                Opts::new(
                    "controller_runtime_reconcile_total",
                    "Total number of reconciliations per controller"
                ),
                &["controller", "result"]
            )),
            reconcile_errors: register(registry, IntCounterVec::new(
                Opts::new(
                    "controller_runtime_reconcile_errors_total",
                    "Total number of reconciliation errors per controller"
                ),
                c
            )),
            reconcile_panics: register(registry, IntCounterVec::new(
                Opts::new(
                    "controller_runtime_reconcile_panics_total",
                    "Total number of reconciliation panics per controller"
                ),
                c
            )),
            reconcile_time: register(registry, HistogramVec::new(
                HistogramOpts::new(
                    "controller_runtime_reconcile_time_seconds",
                    "Length of time per reconciliation per controller"
                )
                .buckets(latency_buckets()),
                c
            )),
            timeouts: register(registry, IntCounter::new(
                "sandboxd_reconcile_timeouts_total",
                "Reconciles abandoned at --reconcile-timeout (retried with backoff)"
            )),
            active_workers: register(registry, IntGaugeVec::new(
                Opts::new(
                    "controller_runtime_active_workers",
                    "Number of currently used workers per controller"
                ),
                c
            )),
            max_concurrent: register(registry, IntGaugeVec::new(
                Opts::new(
                    "controller_runtime_max_concurrent_reconciles",
                    "Maximum number of concurrent reconciles per controller"
                ),
                c
            )),
            depth: register(registry, IntGaugeVec::new(
                Opts::new("workqueue_depth", "Current depth of workqueue"),
                &["name"]
            )),
            adds: register(registry, IntCounterVec::new(
                Opts::new(
                    "workqueue_adds_total",
                    "Total number of adds handled by workqueue"
                ),
                &["name"]
            )),
            queue_duration: register(registry, HistogramVec::new(
                HistogramOpts::new(
                    "workqueue_queue_duration_seconds",
                    "How long in seconds an item stays in workqueue before being requested"
                )
                .buckets(latency_buckets()),
                &["name"]
            )),
            work_duration: register(registry, HistogramVec::new(
                HistogramOpts::new(
                    "workqueue_work_duration_seconds",
                    "How long in seconds processing an item from workqueue takes"
                )
                .buckets(latency_buckets()),
                &["name"]
            )),
            retries: register(registry, IntCounterVec::new(
                Opts::new(
                    "workqueue_retries_total",
                    "Total number of retries handled by workqueue"
                ),
                &["name"]
            )),
            unfinished_work: register(registry, GaugeVec::new(
                Opts::new("workqueue_unfinished_work_seconds", "How many seconds of work has been done that is in progress and hasn't been observed by work_duration"),
                &["name"]
            )),
            longest_running: register(registry, GaugeVec::new(
                Opts::new("workqueue_longest_running_processor_seconds", "How many seconds has the longest running processor for workqueue been running"),
                &["name"]
            )),
        };
        for result in ["success", "error", "requeue", "requeue_after"] {
            m.reconcile_total.with_label_values(&[CONTROLLER, result]);
        }
        m.reconcile_errors.with_label_values(&[CONTROLLER]);
        m.reconcile_panics.with_label_values(&[CONTROLLER]);
        m.active_workers.with_label_values(&[CONTROLLER]);
        m.depth.with_label_values(&[CONTROLLER]);
        m.adds.with_label_values(&[CONTROLLER]);
        m.retries.with_label_values(&[CONTROLLER]);
        m.unfinished_work.with_label_values(&[CONTROLLER]);
        m.longest_running.with_label_values(&[CONTROLLER]);
        m
    }

    /// Sets the configured limit of concurrent reconciles.
    pub(crate) fn set_max_concurrent(&self, n: usize) {
        self.max_concurrent
            .with_label_values(&[CONTROLLER])
            .set(n as i64);
    }

    /// One reconcile abandoned at its deadline.
    pub(crate) fn timed_out(&self) {
        self.timeouts.inc();
    }

    /// How long the longest reconcile has been running, and the sum over all.
    pub(crate) fn running_times(&self, longest: Duration, total: Duration) {
        self.longest_running
            .with_label_values(&[CONTROLLER])
            .set(longest.as_secs_f64());
        self.unfinished_work
            .with_label_values(&[CONTROLLER])
            .set(total.as_secs_f64());
    }
}

/// The queue reports to the whole [`Metrics`] (what the controller hands
/// it); the series it moves are all [`QueueMetrics`]'.
impl QueueObserver for Metrics {
    fn added(&self) {
        self.queue.adds.with_label_values(&[CONTROLLER]).inc();
    }
    fn depth(&self, depth: usize) {
        self.queue
            .depth
            .with_label_values(&[CONTROLLER])
            .set(depth as i64);
    }
    fn started(&self, waited: Duration) {
        self.queue
            .queue_duration
            .with_label_values(&[CONTROLLER])
            .observe(waited.as_secs_f64());
    }
    fn finished(&self, took: Duration, outcome: &FinishedAs) {
        let q = &self.queue;
        let secs = took.as_secs_f64();
        q.work_duration
            .with_label_values(&[CONTROLLER])
            .observe(secs);
        q.reconcile_time
            .with_label_values(&[CONTROLLER])
            .observe(secs);
        let result = match outcome {
            FinishedAs::Success => "success",
            FinishedAs::Requeue => "requeue_after",
            FinishedAs::Error | FinishedAs::Panic => "error",
        };
        q.reconcile_total
            .with_label_values(&[CONTROLLER, result])
            .inc();
        if matches!(outcome, FinishedAs::Error | FinishedAs::Panic) {
            q.reconcile_errors.with_label_values(&[CONTROLLER]).inc();
        }
    }
    fn retried(&self) {
        self.queue.retries.with_label_values(&[CONTROLLER]).inc();
    }
    fn active(&self, running: usize) {
        self.queue
            .active_workers
            .with_label_values(&[CONTROLLER])
            .set(running as i64);
    }
    fn panicked(&self) {
        self.queue
            .reconcile_panics
            .with_label_values(&[CONTROLLER])
            .inc();
    }
}
