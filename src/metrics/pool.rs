//! The warm pools: their size per engine, the starts of their containers
//! (ready or failed), and the provisions that tried them (hit or miss) and
//! how long a hit took.

use super::{latency_buckets, register};
use crate::domain::id::EngineName;
use crate::domain::pool::ClaimKind;
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};
use std::time::Duration;

/// The warm pools' metrics.
pub(crate) struct PoolMetrics {
    size: IntGaugeVec,
    claims: IntCounterVec,
    claim_seconds: HistogramVec,
    starts: IntCounterVec,
}

impl PoolMetrics {
    pub(crate) fn new(registry: &Registry) -> Self {
        let m = PoolMetrics {
            size: register(registry, IntGaugeVec::new(
                Opts::new("sandboxd_pool_size", "Warm-pool containers by engine and state (ready: unclaimed and ready; creating: being started)"),
                &["engine", "state"]
            )),
            claims: register(registry, IntCounterVec::new(
                Opts::new("sandboxd_pool_claims_total", "Provisions that tried the warm pool, by engine, result (hit: served by a pool container; miss: none ready, or the claim failed and the cold path ran) and kind (create, heal)"),
                &["engine", "result", "kind"]
            )),
            claim_seconds: register(registry, HistogramVec::new(
                HistogramOpts::new("sandboxd_pool_claim_seconds", "Seconds a successful warm-pool claim took (credentials set, renamed, on the sandbox's network, ready), by engine")
                    .buckets(latency_buckets()),
                &["engine"]
            )),
            starts: register(registry, IntCounterVec::new(
                Opts::new("sandboxd_pool_starts_total", "Warm-pool containers started, by engine and result (ready: started and ready to claim; failed: it did not come up or its seed failed, and the pool backs off as a crash loop does)"),
                &["engine", "result"]
            )),
        };
        // The warm-pool panels show zeros, not nothing, while no pool runs.
        for engine in crate::engine::REGISTRY.iter() {
            let name = engine.name().as_str();
            for state in ["ready", "creating"] {
                m.size.with_label_values(&[name, state]);
            }
            for result in ["hit", "miss"] {
                for kind in ClaimKind::ALL {
                    m.claims.with_label_values(&[name, result, kind.as_str()]);
                }
            }
            m.claim_seconds.with_label_values(&[name]);
            for result in ["ready", "failed"] {
                m.starts.with_label_values(&[name, result]);
            }
        }
        m
    }

    /// The warm pool of `engine` holds `ready` ready containers and is
    /// starting `creating` more.
    pub(crate) fn size(&self, engine: EngineName, ready: usize, creating: usize) {
        self.size
            .with_label_values(&[engine.as_str(), "ready"])
            .set(ready as i64);
        self.size
            .with_label_values(&[engine.as_str(), "creating"])
            .set(creating as i64);
    }

    /// One start of a warm-pool container of `engine`: `ready` or failed.
    pub(crate) fn start(&self, engine: EngineName, ready: bool) {
        let result = if ready { "ready" } else { "failed" };
        self.starts
            .with_label_values(&[engine.as_str(), result])
            .inc();
    }

    /// One provision that tried the warm pool of `engine`.
    pub(crate) fn claim(&self, engine: EngineName, kind: ClaimKind, took: Option<Duration>) {
        let result = if took.is_some() { "hit" } else { "miss" };
        self.claims
            .with_label_values(&[engine.as_str(), result, kind.as_str()])
            .inc();
        if let Some(took) = took {
            self.claim_seconds
                .with_label_values(&[engine.as_str()])
                .observe(took.as_secs_f64());
        }
    }
}
