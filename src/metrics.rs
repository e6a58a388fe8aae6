//! Prometheus metrics. Controller and work-queue metrics reuse the names
//! controller-runtime exports, so existing dashboards work unchanged.

use crate::model::Phase;
use crate::queue::{FinishedAs, QueueObserver};
use prometheus::{
    exponential_buckets, Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter,
    IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};
use std::time::Duration;

/// The `controller` label value.
pub const CONTROLLER: &str = "sandbox";

/// Every metric sandboxd exports.
#[allow(missing_docs)]
pub struct Metrics {
    pub registry: Registry,
    pub reconcile_total: IntCounterVec,
    pub reconcile_errors: IntCounterVec,
    pub reconcile_panics: IntCounterVec,
    pub reconcile_time: HistogramVec,
    pub active_workers: IntGaugeVec,
    pub max_concurrent: IntGaugeVec,
    pub queue_depth: IntGaugeVec,
    pub queue_adds: IntCounterVec,
    pub queue_duration: HistogramVec,
    pub work_duration: HistogramVec,
    pub queue_retries: IntCounterVec,
    pub sandboxes: IntGaugeVec,
    pub provisions: IntCounterVec,
    pub provision_seconds: HistogramVec,
    pub request_to_ready: HistogramVec,
    pub generation_lag: Histogram,
    pub containers: IntGaugeVec,
    pub heal_loops: IntGauge,
    pub unfinished_work: GaugeVec,
    pub longest_running: GaugeVec,
    pub reaps: IntCounterVec,
    pub teardown_failures: IntCounter,
    pub image_pulls: IntCounterVec,
    pub image_builds: IntCounterVec,
    pub notify_wakeups: IntCounter,
    pub docker_events: IntCounterVec,
    pub relist_drift: IntCounter,
    pub heals: IntCounterVec,
    pub rotations: IntCounterVec,
    pub relists: IntCounter,
    pub stream_restarts: IntCounterVec,
}

fn ready_buckets() -> Vec<f64> {
    exponential_buckets(0.1, 1.5, 16).expect("static buckets")
}

fn latency_buckets() -> Vec<f64> {
    exponential_buckets(0.005, 2.0, 16).expect("static buckets")
}

impl Metrics {
    /// Creates and registers every metric; label combinations that are
    /// known up front start at zero so dashboards and alerts see them.
    pub fn new() -> Self {
        let registry = Registry::new();
        macro_rules! reg {
            ($m:expr) => {{
                let m = $m.expect("metric definition is valid");
                registry
                    .register(Box::new(m.clone()))
                    .expect("metric names are unique");
                m
            }};
        }
        let c = &["controller"];
        let m = Metrics {
            reconcile_total: reg!(IntCounterVec::new(
                Opts::new(
                    "controller_runtime_reconcile_total",
                    "Total number of reconciliations per controller"
                ),
                &["controller", "result"]
            )),
            reconcile_errors: reg!(IntCounterVec::new(
                Opts::new(
                    "controller_runtime_reconcile_errors_total",
                    "Total number of reconciliation errors per controller"
                ),
                c
            )),
            reconcile_panics: reg!(IntCounterVec::new(
                Opts::new(
                    "controller_runtime_reconcile_panics_total",
                    "Total number of reconciliation panics per controller"
                ),
                c
            )),
            reconcile_time: reg!(HistogramVec::new(
                HistogramOpts::new(
                    "controller_runtime_reconcile_time_seconds",
                    "Length of time per reconciliation per controller"
                )
                .buckets(latency_buckets()),
                c
            )),
            active_workers: reg!(IntGaugeVec::new(
                Opts::new(
                    "controller_runtime_active_workers",
                    "Number of currently used workers per controller"
                ),
                c
            )),
            max_concurrent: reg!(IntGaugeVec::new(
                Opts::new(
                    "controller_runtime_max_concurrent_reconciles",
                    "Maximum number of concurrent reconciles per controller"
                ),
                c
            )),
            queue_depth: reg!(IntGaugeVec::new(
                Opts::new("workqueue_depth", "Current depth of workqueue"),
                &["name"]
            )),
            queue_adds: reg!(IntCounterVec::new(
                Opts::new(
                    "workqueue_adds_total",
                    "Total number of adds handled by workqueue"
                ),
                &["name"]
            )),
            queue_duration: reg!(HistogramVec::new(
                HistogramOpts::new(
                    "workqueue_queue_duration_seconds",
                    "How long in seconds an item stays in workqueue before being requested"
                )
                .buckets(latency_buckets()),
                &["name"]
            )),
            work_duration: reg!(HistogramVec::new(
                HistogramOpts::new(
                    "workqueue_work_duration_seconds",
                    "How long in seconds processing an item from workqueue takes"
                )
                .buckets(latency_buckets()),
                &["name"]
            )),
            queue_retries: reg!(IntCounterVec::new(
                Opts::new(
                    "workqueue_retries_total",
                    "Total number of retries handled by workqueue"
                ),
                &["name"]
            )),
            sandboxes: reg!(IntGaugeVec::new(
                Opts::new(
                    "sandboxd_sandboxes",
                    "Sandboxes by phase, as last published to sandbox_status"
                ),
                &["phase"]
            )),
            provisions: reg!(IntCounterVec::new(
                Opts::new(
                    "sandboxd_provisions_total",
                    "Engine containers provisioned, by engine, reason and result"
                ),
                &["engine", "reason", "result"]
            )),
            provision_seconds: reg!(HistogramVec::new(
                HistogramOpts::new("sandboxd_provision_seconds", "Seconds from container create to ready with features verified, by engine")
                    .buckets(ready_buckets()),
                &["engine"]
            )),
            request_to_ready: reg!(HistogramVec::new(
                HistogramOpts::new("sandboxd_request_to_ready_seconds", "Seconds from a desired-row change to the engine it asked for being ready, by engine")
                    .buckets(ready_buckets()),
                &["engine"]
            )),
            generation_lag: reg!(Histogram::with_opts(
                HistogramOpts::new("sandboxd_observed_generation_lag_seconds", "Seconds from a desired-row change to a status that observes its generation")
                    .buckets(ready_buckets())
            )),
            containers: reg!(IntGaugeVec::new(
                Opts::new("sandboxd_containers", "Managed containers of this deployment, by engine and state"),
                &["engine", "state"]
            )),
            heal_loops: reg!(IntGauge::new(
                "sandboxd_sandboxes_in_heal_loop",
                "Sandboxes healed at least 3 times within the last 10 minutes"
            )),
            unfinished_work: reg!(GaugeVec::new(
                Opts::new("workqueue_unfinished_work_seconds", "How many seconds of work has been done that is in progress and hasn't been observed by work_duration"),
                &["name"]
            )),
            longest_running: reg!(GaugeVec::new(
                Opts::new("workqueue_longest_running_processor_seconds", "How many seconds has the longest running processor for workqueue been running"),
                &["name"]
            )),
            reaps: reg!(IntCounterVec::new(
                Opts::new("sandboxd_reaps_total", "Containers torn down, by reason"),
                &["reason"]
            )),
            teardown_failures: reg!(IntCounter::new(
                "sandboxd_teardown_failures_total",
                "Container teardowns that failed and will be retried"
            )),
            image_builds: reg!(IntCounterVec::new(
                Opts::new("sandboxd_image_builds_total", "Image builds run by --image-build-command, by result"),
                &["result"]
            )),
            image_pulls: reg!(IntCounterVec::new(
                Opts::new(
                    "sandboxd_image_pulls_total",
                    "Image pulls attempted, by result"
                ),
                &["result"]
            )),
            notify_wakeups: reg!(IntCounter::new(
                "sandboxd_notify_wakeups_total",
                "NOTIFY messages received from sandbox_desired"
            )),
            docker_events: reg!(IntCounterVec::new(
                Opts::new("sandboxd_docker_events_total", "Docker container events received, by action"),
                &["action"]
            )),
            relist_drift: reg!(IntCounter::new(
                "sandboxd_relist_drift_total",
                "Containers whose state a periodic relist found different from what the event stream said"
            )),
            heals: reg!(IntCounterVec::new(
                Opts::new("sandboxd_heals_total", "Engine containers replaced with the same credentials, by engine and cause (exited, oom, removed)"),
                &["engine", "cause"]
            )),
            rotations: reg!(IntCounterVec::new(
                Opts::new("sandboxd_rotations_total", "Engine containers re-provisioned with fresh credentials because the requested features grew, by engine"),
                &["engine"]
            )),
            relists: reg!(IntCounter::new(
                "sandboxd_relists_total",
                "Full relists of both sides"
            )),
            stream_restarts: reg!(IntCounterVec::new(
                Opts::new(
                    "sandboxd_watch_stream_restarts_total",
                    "Watch stream reconnects, by source"
                ),
                &["source"]
            )),
            registry: registry.clone(),
        };
        for result in ["success", "error", "requeue", "requeue_after"] {
            m.reconcile_total.with_label_values(&[CONTROLLER, result]);
        }
        m.reconcile_errors.with_label_values(&[CONTROLLER]);
        m.reconcile_panics.with_label_values(&[CONTROLLER]);
        m.active_workers.with_label_values(&[CONTROLLER]);
        m.queue_depth.with_label_values(&[CONTROLLER]);
        m.queue_adds.with_label_values(&[CONTROLLER]);
        m.queue_retries.with_label_values(&[CONTROLLER]);
        m.unfinished_work.with_label_values(&[CONTROLLER]);
        m.longest_running.with_label_values(&[CONTROLLER]);
        registry
            .register(Box::new(crate::runtime::DOCKER_API_SECONDS.clone()))
            .expect("docker api metric registers once per registry");
        for phase in Phase::ALL {
            m.sandboxes.with_label_values(&[phase.as_str()]);
        }
        for result in ["success", "error"] {
            m.image_pulls.with_label_values(&[result]);
            m.image_builds.with_label_values(&[result]);
        }
        for source in ["docker", "postgres"] {
            m.stream_restarts.with_label_values(&[source]);
        }
        #[cfg(target_os = "linux")]
        {
            let pc = prometheus::process_collector::ProcessCollector::for_self();
            registry
                .register(Box::new(pc))
                .expect("process collector registers once");
        }
        m
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding into a Vec cannot fail");
        String::from_utf8(buf).expect("prometheus text format is UTF-8")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl QueueObserver for Metrics {
    fn added(&self) {
        self.queue_adds.with_label_values(&[CONTROLLER]).inc();
    }
    fn depth(&self, depth: usize) {
        self.queue_depth
            .with_label_values(&[CONTROLLER])
            .set(depth as i64);
    }
    fn started(&self, waited: Duration) {
        self.queue_duration
            .with_label_values(&[CONTROLLER])
            .observe(waited.as_secs_f64());
    }
    fn finished(&self, took: Duration, outcome: &FinishedAs) {
        let secs = took.as_secs_f64();
        self.work_duration
            .with_label_values(&[CONTROLLER])
            .observe(secs);
        self.reconcile_time
            .with_label_values(&[CONTROLLER])
            .observe(secs);
        let result = match outcome {
            FinishedAs::Success => "success",
            FinishedAs::Requeue => "requeue_after",
            FinishedAs::Error | FinishedAs::Panic => "error",
        };
        self.reconcile_total
            .with_label_values(&[CONTROLLER, result])
            .inc();
        if matches!(outcome, FinishedAs::Error | FinishedAs::Panic) {
            self.reconcile_errors.with_label_values(&[CONTROLLER]).inc();
        }
    }
    fn retried(&self) {
        self.queue_retries.with_label_values(&[CONTROLLER]).inc();
    }
    fn active(&self, running: usize) {
        self.active_workers
            .with_label_values(&[CONTROLLER])
            .set(running as i64);
    }
    fn panicked(&self) {
        self.reconcile_panics.with_label_values(&[CONTROLLER]).inc();
    }
}
