//! Container states as the event stream reported them, so that a relist can
//! count what the events missed (drift).

use crate::domain::container::ContainerState;
use crate::domain::id::ContainerId;
use crate::ports::runtime::ContainerAction;
use std::collections::HashMap;
use std::sync::Mutex;

/// What the events said about each container.
#[derive(Debug, Default)]
pub(crate) struct KnownContainers(Mutex<HashMap<ContainerId, ContainerState>>);

impl KnownContainers {
    /// Records one event.
    pub(crate) fn record(&self, id: &ContainerId, action: ContainerAction) {
        let state = match action {
            ContainerAction::Create => Some(ContainerState::Created),
            ContainerAction::Start => Some(ContainerState::Running),
            ContainerAction::Die | ContainerAction::Stop | ContainerAction::Oom => {
                Some(ContainerState::Exited)
            }
            ContainerAction::Destroy => None,
            ContainerAction::Kill | ContainerAction::HealthStatus => return,
        };
        let mut known = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match state {
            Some(s) => {
                known.insert(id.clone(), s);
            }
            None => {
                known.remove(id);
            }
        }
    }

    /// Replaces what is known with a full listing and returns how many
    /// containers differ from what the events said (appeared, vanished or
    /// changed state without an event).
    pub(crate) fn reconcile_with(&self, listed: &[(ContainerId, ContainerState)]) -> usize {
        let mut known = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut drift = 0;
        let mut fresh = HashMap::with_capacity(listed.len());
        for (id, state) in listed {
            if *state == ContainerState::Removing {
                continue;
            }
            if known.remove(id) != Some(*state) {
                drift += 1;
            }
            fresh.insert(id.clone(), *state);
        }
        drift += known.len();
        *known = fresh;
        drift
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> ContainerId {
        ContainerId::new(s)
    }

    #[test]
    fn a_relist_that_matches_the_events_finds_no_drift() {
        let known = KnownContainers::default();
        known.record(&id("a"), ContainerAction::Create);
        known.record(&id("a"), ContainerAction::Start);
        known.record(&id("b"), ContainerAction::Start);
        known.record(&id("b"), ContainerAction::Die);
        let listed = vec![
            (id("a"), ContainerState::Running),
            (id("b"), ContainerState::Exited),
        ];
        assert_eq!(known.reconcile_with(&listed), 0);
    }

    #[test]
    fn containers_that_changed_appeared_or_vanished_without_events_count_as_drift() {
        let known = KnownContainers::default();
        known.record(&id("running-then-silently-dead"), ContainerAction::Start);
        known.record(&id("vanished"), ContainerAction::Start);
        known.record(&id("destroyed"), ContainerAction::Start);
        known.record(&id("destroyed"), ContainerAction::Destroy);
        let listed = vec![
            (id("running-then-silently-dead"), ContainerState::Exited),
            (id("appeared"), ContainerState::Running),
        ];
        assert_eq!(known.reconcile_with(&listed), 3);
        // The listing is now the baseline.
        assert_eq!(known.reconcile_with(&listed), 0);
    }
}
