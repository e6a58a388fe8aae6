//! What reconciles do to a sandbox over its life: provisions (create,
//! heal, rotate) and how long they take, network repairs, pauses and
//! resumes, checkpoints and resets, and teardowns.

use super::{outcome, ready_buckets, register};
use crate::domain::id::EngineName;
use crate::domain::plan::{HealCause, ProvisionReason, ReapReason};
use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts, Registry,
};
use std::time::Duration;

/// The sandbox lifecycle's metrics.
pub(crate) struct LifecycleMetrics {
    provisions: IntCounterVec,
    provision_seconds: HistogramVec,
    request_to_ready: HistogramVec,
    heal_seconds: HistogramVec,
    generation_lag: Histogram,
    container_starts: IntCounterVec,
    heals: IntCounterVec,
    rotations: IntCounterVec,
    networks_recreated: IntCounter,
    network_reconnects: IntCounter,
    stale_bridges: IntCounterVec,
    idle_actions: IntCounterVec,
    checkpoint_seconds: HistogramVec,
    seed_seconds: HistogramVec,
    fork_seconds: HistogramVec,
    reaps: IntCounterVec,
    teardown_failures: IntCounter,
}

impl LifecycleMetrics {
    pub(crate) fn new(registry: &Registry) -> Self {
        let m = LifecycleMetrics {
            provisions: register(registry, IntCounterVec::new(
                Opts::new(
                    "sandboxd_provisions_total",
                    "Engine containers provisioned, by engine, reason and result"
                ),
                &["engine", "reason", "result"]
            )),
            provision_seconds: register(registry, HistogramVec::new(
                HistogramOpts::new("sandboxd_provision_seconds", "Seconds from container create to ready with features verified, by engine")
                    .buckets(ready_buckets()),
                &["engine"]
            )),
            request_to_ready: register(registry, HistogramVec::new(
                HistogramOpts::new("sandboxd_request_to_ready_seconds", "Seconds from a desired-row change to the engine it asked for being ready, by engine and what served it (pool: a warm-pool claim; template: a start from a template, a seed's included; cold: initialised at start; fork: a start from a fork's copy)")
                    .buckets(ready_buckets()),
                &["engine", "from"]
            )),
            heal_seconds: register(registry, HistogramVec::new(
                HistogramOpts::new("sandboxd_heal_seconds", "Seconds a heal took, from its start (the container's death seen, any crash-loop backoff over) to the engine ready again, by engine")
                    .buckets(ready_buckets()),
                &["engine"]
            )),
            generation_lag: register(registry, Histogram::with_opts(
                HistogramOpts::new("sandboxd_observed_generation_lag_seconds", "Seconds from a desired-row change to a status that observes its generation")
                    .buckets(ready_buckets())
            )),
            container_starts: register(registry, IntCounterVec::new(
                Opts::new(
                    "sandboxd_container_starts_total",
                    "Engine containers created for sandboxes, by engine and what they started from (template: a copy of a pre-initialised data directory; cold: initialised at start)"
                ),
                &["engine", "from"]
            )),
            heals: register(registry, IntCounterVec::new(
                Opts::new("sandboxd_heals_total", "Engine containers replaced with the same credentials, by engine and cause (stopped and removed: from outside, healed at once; exited and oom: the engine's own, counted towards the crash-loop back-off)"),
                &["engine", "cause"]
            )),
            rotations: register(registry, IntCounterVec::new(
                Opts::new("sandboxd_rotations_total", "Engine containers re-provisioned with fresh credentials because the row asked for more features, another seed or a stronger isolation level, by engine"),
                &["engine"]
            )),
            networks_recreated: register(registry, IntCounter::new(
                "sandboxd_networks_recreated_total",
                "Sandbox (or shared) networks created again after they were removed or pruned out of band"
            )),
            network_reconnects: register(registry, IntCounter::new(
                "sandboxd_network_reconnects_total",
                "Engine containers put back on their network, under their names, after they lost it"
            )),
            stale_bridges: register(registry, IntCounterVec::new(
                Opts::new(
                    "sandboxd_stale_bridges_total",
                    "Linux bridges named like sandboxd's (sbx…) that no Docker network owned, found by a relist, by outcome (removed; gone: it went with its network as it was removed; not_permitted: sandboxd lacks CAP_NET_ADMIN or `ip`, an operator must remove it; failed)"
                ),
                &["outcome"]
            )),
            idle_actions: register(registry, IntCounterVec::new(
                Opts::new(
                    "sandboxd_idle_actions_total",
                    "Pause on idle: sandboxes paused, resumed, and found in use by a client connection when their requests and touches said idle"
                ),
                &["action"]
            )),
            checkpoint_seconds: register(registry, HistogramVec::new(
                HistogramOpts::new("sandboxd_checkpoint_seconds", "Seconds a checkpoint or reset of a sandbox took in its containers, by op (checkpoint, reset) and result (ok, error)")
                    .buckets(vec![0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]),
                &["op", "result"]
            )),
            seed_seconds: register(registry, HistogramVec::new(
                HistogramOpts::new("sandboxd_seed_load_seconds", "Seconds loading a seed into a new engine container took (a sandbox's, or a seeded warm-pool container's; for a data file, writing it into its volume, once per process), by engine and result (success, error)")
                    .buckets(vec![0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]),
                &["engine", "result"]
            )),
            fork_seconds: register(registry, HistogramVec::new(
                HistogramOpts::new("sandboxd_fork_copy_seconds", "Seconds copying a source sandbox's data for a fork took (the helper's start, the copy with the source frozen, the thaw), by engine and result (success, error)")
                    .buckets(vec![0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]),
                &["engine", "result"]
            )),
            reaps: register(registry, IntCounterVec::new(
                Opts::new("sandboxd_reaps_total", "Containers torn down, by reason"),
                &["reason"]
            )),
            teardown_failures: register(registry, IntCounter::new(
                "sandboxd_teardown_failures_total",
                "Container teardowns that failed and will be retried"
            )),
        };
        // The reap-burst alert needs its series before the first reap.
        for reason in [ReapReason::Deleted, ReapReason::Orphan] {
            m.reaps.with_label_values(&[reason.as_str()]);
        }
        for action in ["paused", "resumed", "in_use"] {
            m.idle_actions.with_label_values(&[action]);
        }
        // The stale-bridge alert sees a bridge sandboxd may not remove.
        for outcome in ["removed", "gone", "not_permitted", "failed"] {
            m.stale_bridges.with_label_values(&[outcome]);
        }
        // The objectives' error ratios (docs/slo.md) have their series
        // before the first request or heal.
        for engine in crate::engine::REGISTRY.iter() {
            let engine = engine.name().as_str();
            m.heal_seconds.with_label_values(&[engine]);
            for from in ["pool", "template", "cold", "fork"] {
                m.request_to_ready.with_label_values(&[engine, from]);
            }
        }
        // The checkpoint panels and alert see every op and result at 0.
        for op in ["checkpoint", "reset"] {
            for result in ["ok", "error"] {
                m.checkpoint_seconds.with_label_values(&[op, result]);
            }
        }
        m
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
            if reason == ProvisionReason::Heal {
                self.heal_seconds
                    .with_label_values(&[engine.as_str()])
                    .observe(took.as_secs_f64());
            }
        }
    }

    /// Seconds from a desired-row change to the engine it asked for being
    /// ready, served `from` a pool, a template, cold or a fork's copy.
    pub(crate) fn request_to_ready(&self, engine: EngineName, from: &'static str, seconds: f64) {
        self.request_to_ready
            .with_label_values(&[engine.as_str(), from])
            .observe(seconds);
    }

    /// Seconds from a desired-row change to a status observing its generation.
    pub(crate) fn generation_lag(&self, seconds: f64) {
        self.generation_lag.observe(seconds);
    }

    /// One engine container created, from a template or cold.
    pub(crate) fn container_started(&self, engine: EngineName, from: &'static str) {
        self.container_starts
            .with_label_values(&[engine.as_str(), from])
            .inc();
    }

    /// One seed loaded into an `engine` container (or not), in `took`.
    pub(crate) fn seed_loaded(&self, engine: EngineName, ok: bool, took: Duration) {
        self.seed_seconds
            .with_label_values(&[engine.as_str(), outcome(ok)])
            .observe(took.as_secs_f64());
    }

    /// One copy of a source's `engine` data for a fork (or not), in `took`.
    pub(crate) fn fork_copied(&self, engine: EngineName, ok: bool, took: Duration) {
        self.fork_seconds
            .with_label_values(&[engine.as_str(), outcome(ok)])
            .observe(took.as_secs_f64());
    }

    /// One heal of `engine`.
    pub(crate) fn healed(&self, engine: EngineName, cause: HealCause) {
        self.heals
            .with_label_values(&[engine.as_str(), cause.as_str()])
            .inc();
    }

    /// One rotation of `engine`.
    pub(crate) fn rotated(&self, engine: EngineName) {
        self.rotations.with_label_values(&[engine.as_str()]).inc();
    }

    /// One network created again.
    pub(crate) fn network_recreated(&self) {
        self.networks_recreated.inc();
    }

    /// One engine container put back on its network.
    pub(crate) fn network_reconnected(&self) {
        self.network_reconnects.inc();
    }

    /// One stale bridge found, and what became of it (`removed`, `gone`,
    /// `not_permitted` or `failed`).
    pub(crate) fn stale_bridge(&self, outcome: &str) {
        self.stale_bridges.with_label_values(&[outcome]).inc();
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

    /// A checkpoint (`op` = `checkpoint`) or reset (`reset`) performed.
    pub(crate) fn checkpoint_done(&self, op: &str, ok: bool, seconds: f64) {
        self.checkpoint_seconds
            .with_label_values(&[op, if ok { "ok" } else { "error" }])
            .observe(seconds);
    }

    /// One container torn down.
    pub(crate) fn reaped(&self, reason: ReapReason) {
        self.reaps.with_label_values(&[reason.as_str()]).inc();
    }

    /// One teardown that failed and will be retried.
    pub(crate) fn teardown_failed(&self) {
        self.teardown_failures.inc();
    }
}
