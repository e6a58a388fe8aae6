//! The fleet as the controller last saw it: sandboxes by phase (kept from
//! its own status writes), containers, heal loops and foreign containers
//! (as of the last relist), the relists themselves and what the reaping
//! breaker saw at them.

use super::register;
use crate::domain::container::{ContainerState, ObservedContainer};
use crate::domain::id::SandboxId;
use crate::domain::sandbox::Phase;
use crate::engine::Registry as Engines;
use prometheus::{IntCounter, IntGauge, IntGaugeVec, Opts, Registry};

/// The fleet's metrics.
pub(crate) struct FleetMetrics {
    sandboxes: IntGaugeVec,
    containers: IntGaugeVec,
    heal_loops: IntGauge,
    heal_loop_members: IntGaugeVec,
    foreign_containers: IntGauge,
    relists: IntCounter,
    relist_drift: IntCounter,
    relist_converged: IntGauge,
    reaping_paused: IntGauge,
    rows_missing: IntGauge,
    persistent_disks: IntGaugeVec,
}

impl FleetMetrics {
    pub(crate) fn new(registry: &Registry) -> Self {
        let m = FleetMetrics {
            sandboxes: register(registry, IntGaugeVec::new(
                Opts::new(
                    "sandboxd_sandboxes",
                    "Sandboxes by phase, as last published to sandbox_status (kept by the controller from its own status writes and relists)"
                ),
                &["phase"]
            )),
            containers: register(registry, IntGaugeVec::new(
                Opts::new("sandboxd_containers", "Managed containers of this deployment, by engine and state, as of the last relist"),
                &["engine", "state"]
            )),
            heal_loops: register(registry, IntGauge::new(
                "sandboxd_sandboxes_in_heal_loop",
                "Sandboxes healed at least 3 times within the last 10 minutes"
            )),
            // One series per sandbox in a heal loop (there are few; each
            // goes when its sandbox leaves the loop): what names them in
            // the SandboxdHealLoop alert's summary.
            heal_loop_members: register(registry, IntGaugeVec::new(
                Opts::new("sandboxd_sandbox_in_heal_loop", "1 for each sandbox healed at least 3 times within the last 10 minutes (absent otherwise)"),
                &["sandbox"]
            )),
            foreign_containers: register(registry, IntGauge::new(
                "sandboxd_foreign_containers",
                "Containers of this deployment that belong to another state database (or predate identities and no status of this one publishes them): never torn down, healed or rotated; as of the last relist"
            )),
            relists: register(registry, IntCounter::new(
                "sandboxd_relists_total",
                "Full relists of both sides"
            )),
            relist_drift: register(registry, IntCounter::new(
                "sandboxd_relist_drift_total",
                "Containers whose state a periodic relist found different from what the event stream said"
            )),
            relist_converged: register(registry, IntGauge::new(
                "sandboxd_relist_converged_sandboxes",
                "Sandboxes the last relist found converged in its lists and did not reconcile (0 after a full resync, which reconciles every one)"
            )),
            reaping_paused: register(registry, IntGauge::new(
                "sandboxd_reaping_paused",
                "1 while the reaping circuit breaker holds back the reaping of deleted rows (sandboxd resume-reaping resumes it)"
            )),
            rows_missing: register(registry, IntGauge::new(
                "sandboxd_sandboxes_row_missing",
                "Sandboxes with containers whose desired row vanished without a DELETE (no tombstone), at the last relist"
            )),
            persistent_disks: register(registry, IntGaugeVec::new(
                Opts::new(
                    "sandboxd_persistent_disk_bytes",
                    "This deployment's capped persistent volumes on the Docker host, as of the last relist: used (what their files occupy on the host's disk), size (their caps, --persistent-size) and orphaned (what files of this deployment no Docker volume names occupy: volumes removed behind sandboxd's back); 0 when sandboxd does not see --persistent-disks-dir"
                ),
                &["kind"]
            )),
        };
        for kind in ["used", "size", "orphaned"] {
            m.persistent_disks.with_label_values(&[kind]);
        }
        for phase in Phase::ALL {
            m.sandboxes.with_label_values(&[phase.as_str()]);
        }
        m
    }

    /// What the capped persistent volumes occupy on the host, their caps,
    /// and what files no volume names occupy.
    pub(crate) fn persistent_disks(&self, used: u64, size: u64, orphaned: u64) {
        let set = |kind: &str, bytes: u64| {
            self.persistent_disks
                .with_label_values(&[kind])
                .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        };
        set("used", used);
        set("size", size);
        set("orphaned", orphaned);
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

    /// The sandboxes in a heal loop: their count, and one series each.
    pub(crate) fn sandboxes_in_heal_loop(&self, looping: &[SandboxId]) {
        self.heal_loops.set(looping.len() as i64);
        self.heal_loop_members.reset();
        for id in looping {
            self.heal_loop_members
                .with_label_values(&[id.as_str()])
                .set(1);
        }
    }

    /// How many containers of this deployment are another state database's.
    pub(crate) fn foreign_containers(&self, n: usize) {
        self.foreign_containers.set(n as i64);
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

    /// What the reaping breaker saw at a relist.
    pub(crate) fn reaping(&self, paused: bool, rows_missing: usize) {
        self.reaping_paused.set(i64::from(paused));
        self.rows_missing
            .set(i64::try_from(rows_missing).unwrap_or(i64::MAX));
    }
}
