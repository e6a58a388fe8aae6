//! Prometheus metrics, one module per concern; [`Metrics`] registers
//! them all in one registry and renders it. Controller and work-queue
//! metrics reuse the names controller-runtime exports, so existing
//! dashboards work unchanged.
//!
//! Everything is recorded through typed methods on the concern's struct
//! (`metrics.pool.claim(..)`): label values come from the domain's enums,
//! and no label array is written outside this module. Label combinations
//! known up front start at zero, so dashboards and alerts see them before
//! the first event.

use prometheus::core::Collector;
use prometheus::{exponential_buckets, Encoder, Registry, TextEncoder};

mod docker;
mod events;
mod fleet;
mod images;
mod leader;
mod lifecycle;
mod pool;
mod queue;
mod quota;
#[cfg(test)]
pub(crate) mod slo;
mod watch;
mod webhook;

pub use self::docker::DockerCall;
pub(crate) use self::docker::{set_placement, time_docker_call};
pub(crate) use self::events::EventMetrics;
pub(crate) use self::fleet::FleetMetrics;
pub(crate) use self::images::ImageMetrics;
pub(crate) use self::leader::LeaderMetrics;
pub(crate) use self::lifecycle::LifecycleMetrics;
pub(crate) use self::pool::PoolMetrics;
pub(crate) use self::queue::QueueMetrics;
pub(crate) use self::quota::QuotaMetrics;
pub(crate) use self::watch::WatchMetrics;
pub(crate) use self::webhook::WebhookMetrics;

/// Every metric sandboxd exports, by concern.
pub struct Metrics {
    registry: Registry,
    /// The work queue and the reconciles it runs.
    pub(crate) queue: QueueMetrics,
    /// Sandboxes by phase, containers, relists, the reaping breaker.
    pub(crate) fleet: FleetMetrics,
    /// Provisions, heals, rotations, pauses, checkpoints, teardowns.
    pub(crate) lifecycle: LifecycleMetrics,
    /// Events written to `sandbox_events`.
    pub(crate) events: EventMetrics,
    /// Events sent to the webhook.
    pub(crate) webhook: WebhookMetrics,
    /// NOTIFY wakeups, Docker events, stream reconnects.
    pub(crate) watch: WatchMetrics,
    /// Image pulls and builds, templates.
    pub(crate) images: ImageMetrics,
    /// The lease and the fence.
    pub(crate) leader: LeaderMetrics,
    /// The warm pools.
    pub(crate) pool: PoolMetrics,
    /// Admission: use against quota, the memory budget, the waiting rows.
    pub(crate) quota: QuotaMetrics,
}

/// Registers `metric` in `registry` and hands it back (for the concerns'
/// `new`, which declare their metrics through it).
fn register<M: Collector + Clone + 'static>(
    registry: &Registry,
    metric: prometheus::Result<M>,
) -> M {
    let m = metric.expect("metric definition is valid");
    registry
        .register(Box::new(m.clone()))
        .expect("metric names are unique");
    m
}

/// The `result` label value of a call that succeeded or not.
fn outcome(ok: bool) -> &'static str {
    if ok {
        "success"
    } else {
        "error"
    }
}

/// Buckets for the seconds until something is ready (25 ms to 2 min),
/// with bounds the objectives' thresholds name exactly (docs/slo.md:
/// 0.25 s, 2.5 s, 10 s).
fn ready_buckets() -> Vec<f64> {
    vec![
        0.025, 0.05, 0.1, 0.15, 0.25, 0.35, 0.5, 0.75, 1.0, 1.5, 2.5, 4.0, 6.0, 10.0, 15.0, 30.0,
        60.0, 120.0,
    ]
}

/// Buckets for short waits and runs (5 ms to ~164 s).
fn latency_buckets() -> Vec<f64> {
    exponential_buckets(0.005, 2.0, 16).expect("static buckets")
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let registry = Registry::new();
        let m = Metrics {
            queue: QueueMetrics::new(&registry),
            fleet: FleetMetrics::new(&registry),
            lifecycle: LifecycleMetrics::new(&registry),
            events: EventMetrics::new(&registry),
            webhook: WebhookMetrics::new(&registry),
            watch: WatchMetrics::new(&registry),
            images: ImageMetrics::new(&registry),
            leader: LeaderMetrics::new(&registry),
            pool: PoolMetrics::new(&registry),
            quota: QuotaMetrics::new(&registry),
            registry,
        };
        docker::register(&m.registry);
        #[cfg(target_os = "linux")]
        {
            let pc = prometheus::process_collector::ProcessCollector::for_self();
            m.registry
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

#[cfg(test)]
mod tests {
    use super::Metrics;

    /// The dashboard's pause, checkpoint and webhook panels (and alerts)
    /// need their series before the first pause, checkpoint or event.
    #[test]
    fn the_pause_checkpoint_and_webhook_series_exist_at_zero_before_first_use() {
        let text = Metrics::new().render();
        let mut expected = vec![
            r#"sandboxd_sandboxes{phase="paused"} 0"#.to_owned(),
            "sandboxd_webhook_retries_total 0".to_owned(),
            "sandboxd_webhook_dropped_total 0".to_owned(),
            "sandboxd_webhook_queue_depth 0".to_owned(),
        ];
        for action in ["paused", "resumed", "in_use"] {
            expected.push(format!(
                r#"sandboxd_idle_actions_total{{action="{action}"}} 0"#
            ));
        }
        for op in ["checkpoint", "reset"] {
            for result in ["ok", "error"] {
                expected.push(format!(
                    r#"sandboxd_checkpoint_seconds_count{{op="{op}",result="{result}"}} 0"#
                ));
                expected.push(format!(
                    r#"sandboxd_checkpoint_seconds_bucket{{op="{op}",result="{result}",le="+Inf"}} 0"#
                ));
            }
        }
        for result in ["delivered", "failed"] {
            expected.push(format!(
                r#"sandboxd_webhook_deliveries_total{{result="{result}"}} 0"#
            ));
        }
        for error in ["unreachable", "status", "timeout"] {
            expected.push(format!(
                r#"sandboxd_webhook_attempt_errors_total{{error="{error}"}} 0"#
            ));
        }
        for line in expected {
            assert!(
                text.lines().any(|l| l == line),
                "missing `{line}` in\n{text}"
            );
        }
    }
}
