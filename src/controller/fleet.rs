//! The fleet gauges kept from what the controller already sees, so that a
//! Prometheus scrape costs no Docker and no Postgres call whatever the
//! fleet's size: `sandboxd_sandboxes{phase}` from every status row this
//! process writes or deletes (it moves at once) and from each relist's
//! status rows (the truth, replacing what was counted); the container
//! gauges from each relist's listing (they move at relists only).

use crate::domain::id::SandboxId;
use crate::domain::sandbox::{Phase, SandboxStatus};
use crate::metrics::Metrics;
use std::collections::HashMap;
use std::sync::Mutex;

/// Each sandbox's last known phase and the count per phase.
#[derive(Debug, Default)]
pub(crate) struct FleetPhases(Mutex<Phases>);

#[derive(Debug, Default)]
struct Phases {
    by_id: HashMap<SandboxId, Phase>,
    counts: [usize; Phase::ALL.len()],
}

fn slot(phase: Phase) -> usize {
    Phase::ALL
        .iter()
        .position(|p| *p == phase)
        .expect("Phase::ALL lists every phase")
}

impl FleetPhases {
    /// Replaces what is known with a relist's status rows and publishes
    /// every phase's count.
    pub(crate) fn relisted(&self, statuses: &[SandboxStatus], metrics: &Metrics) {
        let mut p = self.0.lock().unwrap_or_else(|e| e.into_inner());
        p.by_id.clear();
        p.by_id.reserve(statuses.len());
        p.counts = Default::default();
        for s in statuses {
            p.by_id.insert(s.id.clone(), s.phase);
            p.counts[slot(s.phase)] += 1;
        }
        for phase in Phase::ALL {
            metrics.fleet.phase_count(phase, p.counts[slot(phase)]);
        }
    }

    /// Records a status row written (`Some`) or deleted (`None`) by this
    /// process and publishes the counts that changed.
    pub(crate) fn published(&self, id: &SandboxId, phase: Option<Phase>, metrics: &Metrics) {
        let mut p = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let before = match phase {
            Some(phase) => p.by_id.insert(id.clone(), phase),
            None => p.by_id.remove(id),
        };
        if before == phase {
            return;
        }
        if let Some(old) = before {
            let count = &mut p.counts[slot(old)];
            *count = count.saturating_sub(1);
            metrics.fleet.phase_count(old, *count);
        }
        if let Some(new) = phase {
            let count = &mut p.counts[slot(new)];
            *count += 1;
            metrics.fleet.phase_count(new, *count);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(id: &str, phase: Phase) -> SandboxStatus {
        SandboxStatus {
            id: SandboxId::parse(id).unwrap(),
            phase,
            observed_generation: 0,
            message: String::new(),
            services: Default::default(),
            updated_at: None,
            network: None,
            incarnation: None,
        }
    }

    fn gauge(metrics: &Metrics, phase: Phase) -> String {
        let line = format!("sandboxd_sandboxes{{phase=\"{}\"}} ", phase.as_str());
        metrics
            .render()
            .lines()
            .find_map(|l| l.strip_prefix(&line).map(str::to_owned))
            .unwrap_or_default()
    }

    #[test]
    fn a_relist_sets_every_phase_and_a_status_write_moves_its_phase_at_once() {
        let metrics = Metrics::new();
        let fleet = FleetPhases::default();
        fleet.relisted(
            &[
                status("a", Phase::Ready),
                status("b", Phase::Ready),
                status("c", Phase::Failed),
            ],
            &metrics,
        );
        assert_eq!(gauge(&metrics, Phase::Ready), "2");
        assert_eq!(gauge(&metrics, Phase::Failed), "1");
        assert_eq!(gauge(&metrics, Phase::Pending), "0");

        let d = SandboxId::parse("d").unwrap();
        fleet.published(&d, Some(Phase::Provisioning), &metrics);
        assert_eq!(gauge(&metrics, Phase::Provisioning), "1");
        fleet.published(&d, Some(Phase::Ready), &metrics);
        assert_eq!(gauge(&metrics, Phase::Provisioning), "0");
        assert_eq!(gauge(&metrics, Phase::Ready), "3");
        fleet.published(&SandboxId::parse("c").unwrap(), None, &metrics);
        assert_eq!(gauge(&metrics, Phase::Failed), "0");
        // Writing the same phase again changes nothing.
        fleet.published(&d, Some(Phase::Ready), &metrics);
        assert_eq!(gauge(&metrics, Phase::Ready), "3");
    }
}
