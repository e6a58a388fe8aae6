//! Prometheus metrics. Controller and work-queue metrics reuse the names
//! controller-runtime exports, so existing dashboards work unchanged.
//!
//! Everything is recorded through typed methods: label values come from
//! the domain's enums, and no label array is written outside this module.

use crate::domain::container::{ContainerState, ObservedContainer};
use crate::domain::id::EngineName;
use crate::domain::plan::{HealCause, ProvisionReason, ReapReason};
use crate::domain::sandbox::Phase;
use crate::engine::Registry as Engines;
use crate::ports::runtime::ContainerAction;
use crate::ports::StreamSource;
use crate::sched::{FinishedAs, QueueObserver};
use prometheus::{
    exponential_buckets, Encoder, GaugeVec, Histogram, HistogramOpts, HistogramTimer, HistogramVec,
    IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};
use std::sync::LazyLock;
use std::time::Duration;

mod quota;
pub(crate) use self::quota::QuotaMetrics;

/// The Docker API calls sandboxd times (`sandboxd_docker_api_seconds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DockerCall {
    /// Container list.
    List,
    /// Network list/create.
    Network,
    /// Image inspect.
    InspectImage,
    /// Image pull.
    Pull,
    /// Container create and start.
    Create,
    /// Container inspect.
    Inspect,
    /// Container stop and remove.
    Remove,
    /// Container rename.
    Rename,
    /// Container logs.
    Logs,
    /// Exec in a container.
    Exec,
    /// Volume list, create, inspect and remove.
    Volume,
    /// Container pause and unpause.
    Pause,
}

impl DockerCall {
    /// The `operation` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            DockerCall::List => "list",
            DockerCall::Network => "network",
            DockerCall::InspectImage => "inspect_image",
            DockerCall::Pull => "pull",
            DockerCall::Create => "create",
            DockerCall::Inspect => "inspect",
            DockerCall::Remove => "remove",
            DockerCall::Rename => "rename",
            DockerCall::Logs => "logs",
            DockerCall::Exec => "exec",
            DockerCall::Volume => "volume",
            DockerCall::Pause => "pause",
        }
    }
}

/// The `controller` label value.
const CONTROLLER: &str = "sandbox";

/// Duration of Docker operations, by operation; process-wide (the Docker
/// adapter has no registry of its own) and registered by [`Metrics::new`].
static DOCKER_API_SECONDS: LazyLock<HistogramVec> = LazyLock::new(|| {
    HistogramVec::new(
        HistogramOpts::new(
            "sandboxd_docker_api_seconds",
            "Duration of Docker API operations, by operation",
        )
        .buckets(exponential_buckets(0.001, 2.0, 16).expect("static buckets")),
        &["operation"],
    )
    .expect("metric definition is valid")
});

/// Times one Docker API call until the returned timer drops.
pub(crate) fn time_docker_call(call: DockerCall) -> HistogramTimer {
    DOCKER_API_SECONDS
        .with_label_values(&[call.as_str()])
        .start_timer()
}

/// Sandbox engines per node (the Swarm backend's placement; `local` for
/// the container backend), set at every full list; process-wide like
/// [`DOCKER_API_SECONDS`].
static ENGINES_BY_NODE: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    IntGaugeVec::new(
        Opts::new(
            "sandboxd_engines_by_node",
            "Sandbox engines by the node they run on (Swarm: the hostname of the node of the service's current task, unassigned while pending; the container backend: local) and state (running: alive in some form; exited)",
        ),
        &["node", "state"],
    )
    .expect("metric definition is valid")
});

/// Replaces the placement gauge with `counts` (node hostname and
/// state to engines): nodes that no longer hold any drop out.
pub(crate) fn set_placement(counts: &std::collections::BTreeMap<(String, &'static str), i64>) {
    ENGINES_BY_NODE.reset();
    for ((node, state), n) in counts {
        ENGINES_BY_NODE
            .with_label_values(&[node.as_str(), state])
            .set(*n);
    }
}

fn outcome(ok: bool) -> &'static str {
    if ok {
        "success"
    } else {
        "error"
    }
}

/// Every metric sandboxd exports.
pub struct Metrics {
    registry: Registry,
    reconcile_total: IntCounterVec,
    reconcile_errors: IntCounterVec,
    reconcile_panics: IntCounterVec,
    reconcile_time: HistogramVec,
    reconcile_timeouts: IntCounter,
    events: IntCounterVec,
    events_lost: IntCounter,
    webhook_deliveries: IntCounterVec,
    webhook_attempt_errors: IntCounterVec,
    webhook_retries: IntCounter,
    webhook_dropped: IntCounter,
    webhook_queue_depth: IntGauge,
    /// Checkpoints and resets performed (`sandbox_checkpoint`, `sandbox_reset`).
    checkpoint_seconds: HistogramVec,
    active_workers: IntGaugeVec,
    max_concurrent: IntGaugeVec,
    queue_depth: IntGaugeVec,
    queue_adds: IntCounterVec,
    queue_duration: HistogramVec,
    work_duration: HistogramVec,
    queue_retries: IntCounterVec,
    sandboxes: IntGaugeVec,
    provisions: IntCounterVec,
    provision_seconds: HistogramVec,
    request_to_ready: HistogramVec,
    generation_lag: Histogram,
    containers: IntGaugeVec,
    heal_loops: IntGauge,
    unfinished_work: GaugeVec,
    longest_running: GaugeVec,
    reaps: IntCounterVec,
    teardown_failures: IntCounter,
    image_pulls: IntCounterVec,
    image_builds: IntCounterVec,
    image_fetches: IntGauge,
    template_builds: IntCounterVec,
    templates_ready: IntGauge,
    container_starts: IntCounterVec,
    networks_recreated: IntCounter,
    network_reconnects: IntCounter,
    notify_wakeups: IntCounter,
    docker_events: IntCounterVec,
    relist_drift: IntCounter,
    heals: IntCounterVec,
    rotations: IntCounterVec,
    relists: IntCounter,
    relist_converged: IntGauge,
    stream_restarts: IntCounterVec,
    leader: IntGauge,
    leader_term: IntGauge,
    leader_acquisitions: IntCounter,
    leader_takeovers: IntCounter,
    leader_losses: IntCounter,
    lease_renewals: IntCounterVec,
    fenced: IntCounterVec,
    reaping_paused: IntGauge,
    rows_missing: IntGauge,
    foreign_containers: IntGauge,
    pool_size: IntGaugeVec,
    pool_claims: IntCounterVec,
    pool_claim_seconds: HistogramVec,
    /// Admission: use against quota, the memory budget, the waiting rows.
    pub(crate) quota: QuotaMetrics,
    idle_actions: IntCounterVec,
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
            reconcile_timeouts: reg!(IntCounter::new(
                "sandboxd_reconcile_timeouts_total",
                "Reconciles abandoned at --reconcile-timeout (retried with backoff)"
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
                    "Sandboxes by phase, as last published to sandbox_status (kept by the controller from its own status writes and relists)"
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
                Opts::new("sandboxd_containers", "Managed containers of this deployment, by engine and state, as of the last relist"),
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
            idle_actions: reg!(IntCounterVec::new(
                Opts::new(
                    "sandboxd_idle_actions_total",
                    "Pause on idle: sandboxes paused, resumed, and found in use by a client connection when their requests and touches said idle"
                ),
                &["action"]
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
            image_fetches: reg!(IntGauge::new(
                "sandboxd_image_fetches",
                "Absent images being pulled or built in the background now (one fetch per image, outside the worker slots)"
            )),
            template_builds: reg!(IntCounterVec::new(
                Opts::new(
                    "sandboxd_template_builds_total",
                    "Template jobs run, by engine and result (ok, failed); a job that finds its template built already counts as ok"
                ),
                &["engine", "result"]
            )),
            templates_ready: reg!(IntGauge::new(
                "sandboxd_templates_ready",
                "Pre-initialised templates this process has ready (one per engine image and feature set in use)"
            )),
            container_starts: reg!(IntCounterVec::new(
                Opts::new(
                    "sandboxd_container_starts_total",
                    "Engine containers created for sandboxes, by engine and what they started from (template: a copy of a pre-initialised data directory; cold: initialised at start)"
                ),
                &["engine", "from"]
            )),
            networks_recreated: reg!(IntCounter::new(
                "sandboxd_networks_recreated_total",
                "Sandbox (or shared) networks created again after they were removed or pruned out of band"
            )),
            network_reconnects: reg!(IntCounter::new(
                "sandboxd_network_reconnects_total",
                "Engine containers put back on their network, under their names, after they lost it"
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
            events: reg!(IntCounterVec::new(
                Opts::new("sandboxd_events_total", "Events recorded in sandbox_events, by reason (provisioned, claimed, healed, rotated, reaped, failed, backoff)"),
                &["reason"]
            )),
            checkpoint_seconds: reg!(HistogramVec::new(
                HistogramOpts::new("sandboxd_checkpoint_seconds", "Seconds a checkpoint or reset of a sandbox took in its containers, by op (checkpoint, reset) and result (ok, error)")
                    .buckets(vec![0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]),
                &["op", "result"]
            )),
            events_lost: reg!(IntCounter::new(
                "sandboxd_events_lost_total",
                "Events that could not be written to sandbox_events (the state database failed; the reconcile went on)"
            )),
            webhook_deliveries: reg!(IntCounterVec::new(
                Opts::new("sandboxd_webhook_deliveries_total", "Events sent to --webhook-url, by result (delivered: a 2xx answer; failed: given up after its retries)"),
                &["result"]
            )),
            webhook_attempt_errors: reg!(IntCounterVec::new(
                Opts::new("sandboxd_webhook_attempt_errors_total", "Failed webhook attempts, by error (unreachable, status, timeout)"),
                &["error"]
            )),
            webhook_retries: reg!(IntCounter::new(
                "sandboxd_webhook_retries_total",
                "Webhook attempts after an event's first (with backoff)"
            )),
            webhook_dropped: reg!(IntCounter::new(
                "sandboxd_webhook_dropped_total",
                "Events not sent to the webhook because its queue was full (--webhook-queue; the events stay in sandbox_events)"
            )),
            webhook_queue_depth: reg!(IntGauge::new(
                "sandboxd_webhook_queue_depth",
                "Events waiting to be sent to the webhook"
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
            relist_converged: reg!(IntGauge::new(
                "sandboxd_relist_converged_sandboxes",
                "Sandboxes the last relist found converged in its lists and did not reconcile (0 after a full resync, which reconciles every one)"
            )),
            stream_restarts: reg!(IntCounterVec::new(
                Opts::new(
                    "sandboxd_watch_stream_restarts_total",
                    "Watch stream reconnects, by source"
                ),
                &["source"]
            )),
            leader: reg!(IntGauge::new(
                "sandboxd_leader",
                "1 while this process leads (holds the lease), 0 while it stands by"
            )),
            leader_term: reg!(IntGauge::new(
                "sandboxd_leader_term",
                "The lease term this process last led in (0: never)"
            )),
            leader_acquisitions: reg!(IntCounter::new(
                "sandboxd_leader_acquisitions_total",
                "Times this process took the lease"
            )),
            leader_takeovers: reg!(IntCounter::new(
                "sandboxd_leader_takeovers_total",
                "Times this process took a lease another holder had had (term above 1)"
            )),
            leader_losses: reg!(IntCounter::new(
                "sandboxd_leader_losses_total",
                "Times this process lost the lease while leading (taken over, or not renewed in time)"
            )),
            lease_renewals: reg!(IntCounterVec::new(
                Opts::new("sandboxd_lease_renewals_total", "Lease renewals by the leader, by result (ok, error, lost)"),
                &["result"]
            )),
            fenced: reg!(IntCounterVec::new(
                Opts::new("sandboxd_fenced_total", "Docker changes and status writes refused because this process did not lead, by call (docker, status)"),
                &["call"]
            )),
            reaping_paused: reg!(IntGauge::new(
                "sandboxd_reaping_paused",
                "1 while the reaping circuit breaker holds back the reaping of deleted rows (sandboxd resume-reaping resumes it)"
            )),
            rows_missing: reg!(IntGauge::new(
                "sandboxd_sandboxes_row_missing",
                "Sandboxes with containers whose desired row vanished without a DELETE (no tombstone), at the last relist"
            )),
            foreign_containers: reg!(IntGauge::new(
                "sandboxd_foreign_containers",
                "Containers of this deployment that belong to another state database (or predate identities and no status of this one publishes them): never torn down, healed or rotated; as of the last relist"
            )),
            pool_size: reg!(IntGaugeVec::new(
                Opts::new("sandboxd_pool_size", "Warm-pool containers by engine and state (ready: unclaimed and ready; creating: being started)"),
                &["engine", "state"]
            )),
            pool_claims: reg!(IntCounterVec::new(
                Opts::new("sandboxd_pool_claims_total", "Provisions that tried the warm pool, by engine, result (hit: served by a pool container; miss: none ready, or the claim failed and the cold path ran) and kind (create, heal)"),
                &["engine", "result", "kind"]
            )),
            pool_claim_seconds: reg!(HistogramVec::new(
                HistogramOpts::new("sandboxd_pool_claim_seconds", "Seconds a successful warm-pool claim took (credentials set, renamed, on the sandbox's network, ready), by engine")
                    .buckets(latency_buckets()),
                &["engine"]
            )),
            quota: QuotaMetrics::new(&registry),
            registry: registry.clone(),
        };
        for result in ["ok", "error", "lost"] {
            m.lease_renewals.with_label_values(&[result]);
        }
        for call in ["docker", "status"] {
            m.fenced.with_label_values(&[call]);
        }
        // The reap-burst alert needs its series before the first reap.
        for reason in [ReapReason::Deleted, ReapReason::Orphan] {
            m.reaps.with_label_values(&[reason.as_str()]);
        }
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
            .register(Box::new(DOCKER_API_SECONDS.clone()))
            .expect("docker api metric registers once per registry");
        registry
            .register(Box::new(ENGINES_BY_NODE.clone()))
            .expect("swarm placement metric registers once per registry");
        for phase in Phase::ALL {
            m.sandboxes.with_label_values(&[phase.as_str()]);
        }
        for action in ["paused", "resumed", "in_use"] {
            m.idle_actions.with_label_values(&[action]);
        }
        for reason in crate::domain::event::EventReason::ALL {
            m.events.with_label_values(&[reason.as_str()]);
        }
        // The checkpoint panels and alert see every op and result at 0.
        for op in ["checkpoint", "reset"] {
            for result in ["ok", "error"] {
                m.checkpoint_seconds.with_label_values(&[op, result]);
            }
        }
        for result in ["delivered", "failed"] {
            m.webhook_deliveries.with_label_values(&[result]);
        }
        for error in ["unreachable", "status", "timeout"] {
            m.webhook_attempt_errors.with_label_values(&[error]);
        }
        for ok in [true, false] {
            m.image_pulls.with_label_values(&[outcome(ok)]);
            m.image_builds.with_label_values(&[outcome(ok)]);
        }
        for source in StreamSource::ALL {
            m.stream_restarts.with_label_values(&[source.as_str()]);
        }
        // The warm-pool panels show zeros, not nothing, while no pool runs.
        for engine in crate::engine::REGISTRY.iter() {
            let name = engine.name().as_str();
            for state in ["ready", "creating"] {
                m.pool_size.with_label_values(&[name, state]);
            }
            for result in ["hit", "miss"] {
                for kind in crate::domain::pool::ClaimKind::ALL {
                    m.pool_claims
                        .with_label_values(&[name, result, kind.as_str()]);
                }
            }
            m.pool_claim_seconds.with_label_values(&[name]);
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

    /// Sets the configured limit of concurrent reconciles.
    pub(crate) fn set_max_concurrent(&self, n: usize) {
        self.max_concurrent
            .with_label_values(&[CONTROLLER])
            .set(n as i64);
    }

    /// Records one finished provision of `engine`; `took` is observed only
    /// when it succeeded.
    pub(crate) fn provision_finished(
        &self,
        engine: EngineName,
        reason: ProvisionReason,
        ok: bool,
        took: Duration,
    ) {
        self.provisions
            .with_label_values(&[engine.as_str(), reason.as_str(), outcome(ok)])
            .inc();
        if ok {
            self.provision_seconds
                .with_label_values(&[engine.as_str()])
                .observe(took.as_secs_f64());
        }
    }

    /// Seconds from a desired-row change to the engine it asked for being ready.
    pub(crate) fn request_to_ready(&self, engine: EngineName, seconds: f64) {
        self.request_to_ready
            .with_label_values(&[engine.as_str()])
            .observe(seconds);
    }

    /// Seconds from a desired-row change to a status observing its generation.
    pub(crate) fn generation_lag(&self, seconds: f64) {
        self.generation_lag.observe(seconds);
    }

    /// Events written to `sandbox_events`.
    pub(crate) fn events_recorded(&self, events: &[crate::domain::event::Event]) {
        for e in events {
            self.events.with_label_values(&[e.reason.as_str()]).inc();
        }
    }

    /// A checkpoint (`op` = `checkpoint`) or reset (`reset`) performed.
    pub(crate) fn checkpoint_done(&self, op: &str, ok: bool, seconds: f64) {
        self.checkpoint_seconds
            .with_label_values(&[op, if ok { "ok" } else { "error" }])
            .observe(seconds);
    }

    /// Events that could not be written.
    pub(crate) fn events_lost(&self, n: usize) {
        self.events_lost.inc_by(n as u64);
    }

    /// One event sent to the webhook (`delivered`) or given up.
    pub(crate) fn webhook_delivery(&self, delivered: bool) {
        let result = if delivered { "delivered" } else { "failed" };
        self.webhook_deliveries.with_label_values(&[result]).inc();
    }

    /// One failed webhook attempt (`error`: unreachable, status, timeout).
    pub(crate) fn webhook_attempt_failed(&self, error: &'static str) {
        self.webhook_attempt_errors
            .with_label_values(&[error])
            .inc();
    }

    /// One webhook attempt after an event's first.
    pub(crate) fn webhook_retry(&self) {
        self.webhook_retries.inc();
    }

    /// One event not queued for the webhook (its queue was full); returns
    /// how many so far.
    pub(crate) fn webhook_dropped(&self) -> u64 {
        self.webhook_dropped.inc();
        self.webhook_dropped.get()
    }

    /// Events waiting for the webhook: one more (`true`) or one fewer.
    pub(crate) fn webhook_queued(&self, added: bool) {
        if added {
            self.webhook_queue_depth.inc();
        } else {
            self.webhook_queue_depth.dec();
        }
    }

    /// One reconcile abandoned at its deadline.
    pub(crate) fn reconcile_timed_out(&self) {
        self.reconcile_timeouts.inc();
    }

    /// One heal of `engine`.
    pub(crate) fn healed(&self, engine: EngineName, cause: HealCause) {
        self.heals
            .with_label_values(&[engine.as_str(), cause.as_str()])
            .inc();
    }

    /// Leading in `term`, or standing by (`None`).
    pub(crate) fn leading(&self, term: Option<crate::domain::lease::Term>) {
        self.leader.set(i64::from(term.is_some()));
        if let Some(t) = term {
            self.leader_term.set(t.0);
        }
    }

    /// This process took the lease in `term`.
    pub(crate) fn leader_acquired(&self, term: crate::domain::lease::Term) {
        self.leader_acquisitions.inc();
        if term.0 > 1 {
            self.leader_takeovers.inc();
        }
    }

    /// This process lost the lease while leading.
    pub(crate) fn leader_lost(&self) {
        self.leader_losses.inc();
    }

    /// One lease renewal: `ok`, `error` or `lost`.
    pub(crate) fn lease_renewal(&self, result: &'static str) {
        self.lease_renewals.with_label_values(&[result]).inc();
    }

    /// What the reaping breaker saw at a relist.
    pub(crate) fn reaping(&self, paused: bool, rows_missing: usize) {
        self.reaping_paused.set(i64::from(paused));
        self.rows_missing
            .set(i64::try_from(rows_missing).unwrap_or(i64::MAX));
    }

    /// One call refused by the fence: `docker` or `status`.
    pub(crate) fn fenced(&self, call: &'static str) {
        self.fenced.with_label_values(&[call]).inc();
    }

    /// One rotation of `engine`.
    pub(crate) fn rotated(&self, engine: EngineName) {
        self.rotations.with_label_values(&[engine.as_str()]).inc();
    }

    /// One container torn down.
    pub(crate) fn reaped(&self, reason: ReapReason) {
        self.reaps.with_label_values(&[reason.as_str()]).inc();
    }

    /// One idle sandbox paused.
    pub(crate) fn paused(&self) {
        self.idle_actions.with_label_values(&["paused"]).inc();
    }

    /// One paused sandbox resumed.
    pub(crate) fn resumed(&self) {
        self.idle_actions.with_label_values(&["resumed"]).inc();
    }

    /// One sandbox idle by its requests and touches found in use by a
    /// client connection.
    pub(crate) fn idle_in_use(&self) {
        self.idle_actions.with_label_values(&["in_use"]).inc();
    }

    /// One teardown that failed and will be retried.
    pub(crate) fn teardown_failed(&self) {
        self.teardown_failures.inc();
    }

    /// One image pull attempted.
    pub(crate) fn image_pulled(&self, ok: bool) {
        self.image_pulls.with_label_values(&[outcome(ok)]).inc();
    }

    /// One image build run by the build command.
    pub(crate) fn image_built(&self, ok: bool) {
        self.image_builds.with_label_values(&[outcome(ok)]).inc();
    }

    /// How many image fetches run in the background.
    pub(crate) fn image_fetches(&self, running: usize) {
        self.image_fetches.set(running as i64);
    }

    /// One template job ended.
    pub(crate) fn template_built(&self, engine: EngineName, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.template_builds
            .with_label_values(&[engine.as_str(), result])
            .inc();
    }

    /// How many templates are ready.
    pub(crate) fn templates_ready(&self, n: usize) {
        self.templates_ready.set(n as i64);
    }

    /// One engine container created, from a template or cold.
    pub(crate) fn container_started(&self, engine: EngineName, from: &'static str) {
        self.container_starts
            .with_label_values(&[engine.as_str(), from])
            .inc();
    }

    /// The warm pool of `engine` holds `ready` ready containers and is
    /// starting `creating` more.
    pub(crate) fn pool_size(&self, engine: EngineName, ready: usize, creating: usize) {
        self.pool_size
            .with_label_values(&[engine.as_str(), "ready"])
            .set(ready as i64);
        self.pool_size
            .with_label_values(&[engine.as_str(), "creating"])
            .set(creating as i64);
    }

    /// One provision that tried the warm pool of `engine`.
    pub(crate) fn pool_claim(
        &self,
        engine: EngineName,
        kind: crate::domain::pool::ClaimKind,
        took: Option<Duration>,
    ) {
        let result = if took.is_some() { "hit" } else { "miss" };
        self.pool_claims
            .with_label_values(&[engine.as_str(), result, kind.as_str()])
            .inc();
        if let Some(took) = took {
            self.pool_claim_seconds
                .with_label_values(&[engine.as_str()])
                .observe(took.as_secs_f64());
        }
    }

    /// One network created again.
    pub(crate) fn network_recreated(&self) {
        self.networks_recreated.inc();
    }

    /// One engine container put back on its network.
    pub(crate) fn network_reconnected(&self) {
        self.network_reconnects.inc();
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

    /// One NOTIFY received.
    pub(crate) fn notify_wakeup(&self) {
        self.notify_wakeups.inc();
    }

    /// One full relist; `drift` containers differed from what the events said.
    pub(crate) fn relisted(&self, drift: usize) {
        self.relists.inc();
        self.relist_drift.inc_by(drift as u64);
    }

    /// How many sandboxes the last relist left alone as converged.
    pub(crate) fn relist_converged(&self, sandboxes: usize) {
        self.relist_converged
            .set(i64::try_from(sandboxes).unwrap_or(i64::MAX));
    }

    /// How many containers of this deployment are another state database's.
    pub(crate) fn foreign_containers(&self, n: usize) {
        self.foreign_containers.set(n as i64);
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

    /// How many sandboxes are in a heal loop.
    pub(crate) fn sandboxes_in_heal_loop(&self, n: usize) {
        self.heal_loops.set(n as i64);
    }

    /// Sets the gauge of sandboxes in `phase` (kept by
    /// `controller::fleet`, which counts them without listing anything).
    pub(crate) fn phase_count(&self, phase: Phase, n: usize) {
        self.sandboxes
            .with_label_values(&[phase.as_str()])
            .set(n as i64);
    }

    /// Sets the per-engine/state container gauges from a relist's full
    /// listing (they move at relists only).
    pub(crate) fn containers(&self, engines: Engines, containers: &[ObservedContainer]) {
        for engine in engines.iter() {
            let name = engine.name().as_str();
            for state in ContainerState::ALL {
                let n = containers
                    .iter()
                    .filter(|c| c.labels.engine == name && c.state == state)
                    .count();
                self.containers
                    .with_label_values(&[name, state.as_str()])
                    .set(n as i64);
            }
        }
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
