//! Container states as the event stream reported them, so that a relist can
//! count what the events missed (drift).

use crate::domain::container::ContainerState;
use crate::domain::id::ContainerId;
use crate::ports::runtime::ContainerAction;
// Randomly seeded (a relist looks up every container of the fleet).
use crate::fleet_hash::HashMap;
use std::sync::Mutex;

/// What the events said about each container.
#[derive(Debug, Default)]
pub(crate) struct KnownContainers(Mutex<Known>);

#[derive(Debug, Default)]
struct Known {
    /// Each container's state, and the relist that last listed it.
    states: HashMap<ContainerId, (ContainerState, u64)>,
    /// How many relists have been reconciled with.
    relists: u64,
}

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
                let listed = known.relists;
                known.states.insert(id.clone(), (s, listed));
            }
            None => {
                known.states.remove(id);
            }
        }
    }

    /// Replaces what is known with a full listing and returns how many
    /// containers differ from what the events said (appeared, vanished or
    /// changed state without an event). Updated in place: a listing that
    /// matches allocates nothing, whatever the fleet's size.
    pub(crate) fn reconcile_with<'a>(
        &self,
        listed: impl IntoIterator<Item = (&'a ContainerId, ContainerState)>,
    ) -> usize {
        let mut guard = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let known = &mut *guard;
        known.relists += 1;
        let this = known.relists;
        let before = known.states.len();
        let mut drift = 0;
        let mut still_there = 0;
        for (id, state) in listed {
            if state == ContainerState::Removing {
                continue;
            }
            match known.states.get_mut(id) {
                // Listed twice: counted once.
                Some((_, listed)) if *listed == this => {}
                Some((known_state, listed)) => {
                    still_there += 1;
                    *listed = this;
                    if *known_state != state {
                        drift += 1;
                        *known_state = state;
                    }
                }
                None => {
                    drift += 1;
                    known.states.insert(id.clone(), (state, this));
                }
            }
        }
        if still_there < before {
            // What the events knew of and the list no longer shows.
            known.states.retain(|_, (_, listed)| *listed == this);
            drift += before - still_there;
        }
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
        let listed = [
            (id("a"), ContainerState::Running),
            (id("b"), ContainerState::Exited),
        ];
        assert_eq!(
            known.reconcile_with(listed.iter().map(|(id, s)| (id, *s))),
            0
        );
    }

    #[test]
    fn containers_that_changed_appeared_or_vanished_without_events_count_as_drift() {
        let known = KnownContainers::default();
        known.record(&id("running-then-silently-dead"), ContainerAction::Start);
        known.record(&id("vanished"), ContainerAction::Start);
        known.record(&id("destroyed"), ContainerAction::Start);
        known.record(&id("destroyed"), ContainerAction::Destroy);
        let listed = [
            (id("running-then-silently-dead"), ContainerState::Exited),
            (id("appeared"), ContainerState::Running),
        ];
        assert_eq!(
            known.reconcile_with(listed.iter().map(|(id, s)| (id, *s))),
            3
        );
        // The listing is now the baseline.
        assert_eq!(
            known.reconcile_with(listed.iter().map(|(id, s)| (id, *s))),
            0
        );
    }

    #[test]
    fn a_container_listed_twice_counts_once_and_one_being_removed_counts_as_gone() {
        let known = KnownContainers::default();
        known.record(&id("a"), ContainerAction::Start);
        known.record(&id("going"), ContainerAction::Start);
        let listed = [
            (id("a"), ContainerState::Running),
            (id("a"), ContainerState::Running),
            (id("going"), ContainerState::Removing),
        ];
        assert_eq!(
            known.reconcile_with(listed.iter().map(|(id, s)| (id, *s))),
            1
        );
        assert_eq!(
            known.reconcile_with([(&id("a"), ContainerState::Running)]),
            0,
            "what was being removed is no longer known"
        );
    }
}
