//! Pause on idle, resume on use: which of a sandbox's containers to freeze
//! (`docker pause`) or thaw, from its plan and what the runtime listed.
//! Pure, so every case is a unit test.
//!
//! A paused container is alive: it is listed as running (so it is neither
//! healed nor reaped as dead) with [`ObservedContainer::paused`] set. A row
//! that is idle and asks to pause ([`Plan::pause`]) keeps its containers
//! and has them frozen once every engine is kept (a heal or a provision
//! first finishes, and the next look freezes); a row that is no longer
//! idle has them thawed; a container about to be torn down is thawed first,
//! since a frozen process cannot take the stop signal (Docker would wait
//! for the whole stop timeout before killing it).

use super::container::ObservedContainer;
use super::id::ContainerId;
use super::plan::{Plan, Wanted};

/// What to do about frozen containers in one reconcile.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Step {
    /// Containers to freeze now (kept engines' containers not frozen yet).
    pub(crate) freeze: Vec<ContainerId>,
    /// Containers to thaw now: every frozen container of a sandbox that is
    /// in use again, and the frozen ones about to be torn down.
    pub(crate) thaw: Vec<ContainerId>,
    /// Whether the sandbox is (or, once `freeze` is done, will be) paused:
    /// every engine the row wants is kept and its container frozen.
    pub(crate) paused: bool,
}

/// The containers of the engines `plan` keeps: the running container whose
/// instance token the published status names.
fn kept<'a>(
    plan: &'a Plan,
    observed: &'a [ObservedContainer],
) -> impl Iterator<Item = &'a ObservedContainer> + 'a {
    plan.kept().filter_map(move |(engine, status)| {
        observed.iter().find(|c| {
            c.labels.engine == engine.as_str()
                && !status.instance.is_empty()
                && c.labels.instance == status.instance
        })
    })
}

/// Decides which containers to freeze and thaw.
pub(crate) fn step(plan: &Plan, observed: &[ObservedContainer]) -> Step {
    let frozen = |c: &&ObservedContainer| c.paused;
    let torn_down: Vec<ContainerId> = plan
        .teardowns()
        .filter_map(|t| {
            observed
                .iter()
                .find(|c| c.id == t.container)
                .filter(frozen)
                .map(|c| c.id.clone())
        })
        .collect();
    if plan.wanted != Wanted::Yes {
        return Step {
            thaw: torn_down,
            ..Step::default()
        };
    }
    if !plan.pause {
        let mut thaw: Vec<ContainerId> = observed
            .iter()
            .filter(frozen)
            .map(|c| c.id.clone())
            .collect();
        thaw.sort();
        thaw.dedup();
        return Step {
            thaw,
            ..Step::default()
        };
    }
    // Idle and asked to pause: only a sandbox whose every engine is kept
    // (nothing to create, heal or switch) is frozen as a whole.
    let complete = plan.provisions().next().is_none() && plan.promotions().next().is_none();
    let kept: Vec<&ObservedContainer> = kept(plan, observed).collect();
    let all_found = kept.len() == plan.kept().count();
    if !complete || !all_found || kept.is_empty() {
        return Step {
            thaw: torn_down,
            ..Step::default()
        };
    }
    Step {
        freeze: kept
            .iter()
            .filter(|c| !c.paused)
            .map(|c| c.id.clone())
            .collect(),
        thaw: torn_down,
        paused: true,
    }
}

#[cfg(test)]
mod tests;
