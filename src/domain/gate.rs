//! The gates between a plan and what a reconcile does: admission (the
//! owner's quota and the host's memory budget), images, crash loops,
//! container names another state database holds, and the reaping breaker.
//! Each takes actions out of the plan, or holds the whole reap, for a
//! reason the status and the events report.
//!
//! Pure: what the gates need is looked up first ([`Facts`]: the admission
//! ledger's answer, the images' availability, the heals each engine had,
//! the breaker's answer), so each gate is a rule tested with tables. They
//! run in a fixed order, each on what the ones before it left: a create
//! that waits for admission does not ask for its image, and a heal whose
//! image is absent does not count against its crash-loop back-off.

use super::container::ObservedContainer;
use super::crash_loop::{self, CrashLoopPolicy, HealGate};
use super::id::EngineName;
use super::identity::{self, StateId};
use super::plan::{Action, HealCause, Plan, Provision, ProvisionReason, Wanted};
use chrono::{DateTime, Utc};
use std::collections::BTreeMap;

/// What the gates need, looked up before them.
#[derive(Debug, Clone)]
pub struct Facts<'a> {
    /// The admission ledger's answer for the plan's creates.
    pub admission: Admission,
    /// Each engine whose image is not present yet (every other engine's
    /// is, or provisioning says why not).
    pub images: BTreeMap<EngineName, Image>,
    /// The heals recorded for each engine the plan heals, at this
    /// generation of the row.
    pub heals: BTreeMap<EngineName, Vec<DateTime<Utc>>>,
    /// Why each engine the plan heals died (`domain::death`): only the
    /// engine's own deaths back off.
    pub causes: BTreeMap<EngineName, HealCause>,
    /// The crash-loop back-off.
    pub crash_loop: &'a CrashLoopPolicy,
    /// Now.
    pub now: DateTime<Utc>,
    /// Another state database's containers of this sandbox.
    pub foreign: &'a [ObservedContainer],
    /// This state database.
    pub state: &'a StateId,
    /// The reaping breaker's answer (asked only when the plan reaps a
    /// deleted row: [`reaps_deleted_row`]).
    pub reaping: Reaping,
}

/// The admission ledger's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Admitted, or nothing to admit.
    Go,
    /// The creates wait: what the status says.
    Wait(String),
}

/// An image that is not present.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Image {
    /// Being pulled or built in the background: what to tell.
    Fetching(String),
    /// The fetch this sandbox waited for failed: why.
    Failed(String),
}

/// The reaping breaker's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reaping {
    /// The reap may go (or was not asked about).
    Go,
    /// Reaping of deleted rows is paused.
    Paused,
    /// No relist has looked at the fleet since the row was seen missing.
    Unconfirmed,
}

/// The plan the gates let through, and what they held back.
#[derive(Debug, Clone, PartialEq)]
pub struct Gated {
    /// What may be done now.
    pub plan: Plan,
    /// What was held back, and why.
    pub held: Held,
}

/// What the gates held back, and what they let through that the
/// reconcile must remember.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Held {
    /// Why the plan's creates wait for admission (the status says so).
    pub admission: Option<String>,
    /// The engines admitted to be created: they stay held in the ledger
    /// while the row wants them, created or not yet (their image being
    /// fetched, or their provision failed and retried).
    pub admitted: Vec<String>,
    /// A line per engine waiting for its image.
    pub awaiting: Vec<String>,
    /// Each engine whose image could not be had, and why.
    pub images_failed: Vec<(EngineName, String)>,
    /// Heals held back by the crash-loop back-off, until a time.
    pub crash_loops: Vec<(EngineName, HealGate)>,
    /// Heals of the engine's own deaths that go now (each is recorded
    /// against the back-off; heals of orders from outside are not).
    pub heals_due: Vec<EngineName>,
    /// Why each heal let through is needed.
    pub causes: BTreeMap<EngineName, HealCause>,
    /// Provisions whose container name another state database's
    /// container holds, and what to tell.
    pub names: Vec<(EngineName, String)>,
    /// The reap of a deleted row, held back by the breaker.
    pub reaping: Option<Reaping>,
}

/// Runs the gates on `plan`, in order: admission, images, crash loops,
/// names held, the reaping breaker.
pub fn gate(mut plan: Plan, facts: &Facts<'_>) -> Gated {
    let mut held = Held::default();
    if let Admission::Wait(message) = &facts.admission {
        // All or nothing: heals, rotations and what is kept go on.
        plan.actions.retain(|a| !is_create(a));
        held.admission = Some(message.clone());
    }
    held.admitted = plan
        .provisions()
        .filter(|p| p.reason == ProvisionReason::Create)
        .map(|p| p.engine.as_str().to_owned())
        .collect();
    plan.actions.retain(|a| match a {
        Action::Provision(p) => !facts.images.contains_key(&p.engine),
        _ => true,
    });
    for (engine, image) in &facts.images {
        match image {
            Image::Fetching(why) => held.awaiting.push(format!("{engine}: {why}")),
            Image::Failed(why) => held.images_failed.push((*engine, why.clone())),
        }
    }
    plan.actions.retain(|action| {
        let Action::Provision(p) = action else {
            return true;
        };
        if p.reason != ProvisionReason::Heal {
            return true;
        }
        // Killed, stopped or removed from outside: healed at once, every
        // time, and not counted (a back-off cannot stop what an operator
        // or a chaos test keeps doing).
        if facts
            .causes
            .get(&p.engine)
            .is_some_and(|c| c.is_outside_order())
        {
            return true;
        }
        let heals = facts.heals.get(&p.engine).map_or(&[][..], Vec::as_slice);
        match crash_loop::gate(heals, facts.now, facts.crash_loop) {
            HealGate::Now => {
                held.heals_due.push(p.engine);
                true
            }
            gate => {
                held.crash_loops.push((p.engine, gate));
                false
            }
        }
    });
    held.causes = plan
        .provisions()
        .filter(|p| p.reason == ProvisionReason::Heal)
        .filter_map(|p| Some((p.engine, *facts.causes.get(&p.engine)?)))
        .collect();
    held.names = identity::hold_names_held_by_foreign(&mut plan, facts.foreign, facts.state);
    if facts.reaping != Reaping::Go && reaps_deleted_row(&plan) {
        held.reaping = Some(facts.reaping);
    }
    Gated { plan, held }
}

/// Whether `plan` reaps the containers of a deleted row (what the reaping
/// breaker is asked about).
pub fn reaps_deleted_row(plan: &Plan) -> bool {
    plan.wanted == Wanted::Deleted && plan.teardowns().next().is_some()
}

/// The provisions of `plan` that pass admission's answer `admission`
/// (whose images are looked up).
pub fn admitted<'p>(plan: &'p Plan, admission: &Admission) -> impl Iterator<Item = &'p Provision> {
    let waits = matches!(admission, Admission::Wait(_));
    plan.provisions()
        .filter(move |p| !(waits && p.reason == ProvisionReason::Create))
}

fn is_create(action: &Action) -> bool {
    matches!(action, Action::Provision(p) if p.reason == ProvisionReason::Create)
}

#[cfg(test)]
mod tests;
