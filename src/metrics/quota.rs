//! Admission metrics: use against quota per owner, the host's memory
//! budget and what is admitted against it, and the rows waiting.
//!
//! The `owner` label is bounded by the owners that hold or wait for a
//! sandbox right now: an owner's series are removed once it holds and
//! waits for nothing.

use super::register;
use crate::domain::admission::{Quota, Use, WaitReason};
use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use std::collections::BTreeMap;

const RESOURCES: [&str; 2] = ["sandboxes", "memory_bytes"];

/// The admission metrics, registered in the controller's registry.
pub(crate) struct QuotaMetrics {
    used: IntGaugeVec,
    limit: IntGaugeVec,
    waiting_by_owner: IntGaugeVec,
    budget: IntGauge,
    admitted: IntGauge,
    waiting: IntGauge,
    decisions: IntCounterVec,
}

impl QuotaMetrics {
    pub(crate) fn new(registry: &Registry) -> Self {
        let m = QuotaMetrics {
            used: register(registry, IntGaugeVec::new(
                Opts::new("sandboxd_quota_used", "Use against quota by owner (owners that hold or wait for a sandbox): resource sandboxes (admitted sandboxes whose row is wanted) or memory_bytes (the sum of their engines' memory caps)"),
                &["owner", "resource"],
            )),
            limit: register(registry, IntGaugeVec::new(
                Opts::new("sandboxd_quota_limit", "An owner's limit as last read from sandbox_quotas, by resource (sandboxes, memory_bytes); absent when unlimited"),
                &["owner", "resource"],
            )),
            waiting_by_owner: register(registry, IntGaugeVec::new(
                Opts::new("sandboxd_quota_waiting", "Rows of an owner waiting for admission (pending with a message naming the limit)"),
                &["owner"],
            )),
            budget: register(registry, IntGauge::new(
                "sandboxd_memory_budget_bytes",
                "The host's memory budget for sandboxes (host memory minus --memory-reserve, or --memory-budget); 0 until known or when the host does not say",
            )),
            admitted: register(registry, IntGauge::new(
                "sandboxd_memory_admitted_bytes",
                "Memory counted against the budget: one engine memory cap per engine every sandbox holds (released ones until their containers are removed) plus the warm pools' target size",
            )),
            waiting: register(registry, IntGauge::new(
                "sandboxd_admission_waiting",
                "Rows waiting for admission (their owner's quota or the host's memory budget)",
            )),
            decisions: register(registry, IntCounterVec::new(
                Opts::new("sandboxd_admission_decisions_total", "Admission decisions by result: admitted, or waiting and why (owner, budget, never: it can never fit)"),
                &["result"],
            )),
        };
        m.decisions.with_label_values(&["admitted"]);
        for reason in [WaitReason::Owner, WaitReason::Budget, WaitReason::Never] {
            m.decisions.with_label_values(&[reason.as_str()]);
        }
        m
    }

    /// One admission decision: admitted (`None`) or waiting and why.
    pub(crate) fn decided(&self, waiting: Option<WaitReason>) {
        let result = waiting.map_or("admitted", WaitReason::as_str);
        self.decisions.with_label_values(&[result]).inc();
    }

    /// The fleet's admissions now: the totals, and the owners whose use
    /// changed (`None`: they hold and wait for nothing, their series go),
    /// with `limits` as last read.
    pub(crate) fn set(
        &self,
        budget: Option<u64>,
        admitted: u64,
        waiting: usize,
        changed: &[(String, Option<Use>)],
        limits: &BTreeMap<String, Quota>,
    ) {
        let gauge = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.budget.set(budget.map_or(0, gauge));
        self.admitted.set(gauge(admitted));
        self.waiting.set(gauge(waiting as u64));
        for (owner, u) in changed {
            let Some(u) = u else {
                for resource in RESOURCES {
                    let _ = self.used.remove_label_values(&[owner, resource]);
                    let _ = self.limit.remove_label_values(&[owner, resource]);
                }
                let _ = self.waiting_by_owner.remove_label_values(&[owner]);
                continue;
            };
            self.used
                .with_label_values(&[owner, "sandboxes"])
                .set(gauge(u.sandboxes));
            self.used
                .with_label_values(&[owner, "memory_bytes"])
                .set(gauge(u.memory_bytes));
            self.waiting_by_owner
                .with_label_values(&[owner])
                .set(gauge(u.waiting));
            let quota = limits.get(owner).copied().unwrap_or_default();
            for (resource, limit) in [
                ("sandboxes", quota.sandboxes),
                ("memory_bytes", quota.memory_bytes),
            ] {
                match limit {
                    Some(l) => self
                        .limit
                        .with_label_values(&[owner, resource])
                        .set(gauge(l)),
                    None => {
                        let _ = self.limit.remove_label_values(&[owner, resource]);
                    }
                }
            }
        }
    }
}
