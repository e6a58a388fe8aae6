//! The status decision: from what was planned and what came of it, the row
//! to publish to `sandbox_status` and whether the reconcile must be retried.
//! Pure, so every case is a row of a table test.

use super::crash_loop::HealGate;
use super::id::EngineName;
use super::id::Incarnation;
use super::plan::{HealCause, Plan, ProvisionReason, Wanted};
use super::sandbox::{DesiredSandbox, Phase, SandboxStatus, ServiceStatus, Services};
use std::collections::BTreeMap;

/// The content of one `sandbox_status` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusUpdate {
    /// Lifecycle phase.
    pub phase: Phase,
    /// The desired generation this status reflects.
    pub observed_generation: i64,
    /// Why the phase is what it is (empty when ready).
    pub message: String,
    /// Per-engine endpoints and credentials.
    pub services: Services,
    /// The Docker network the engines are reachable on; the core leaves it
    /// `None` and the controller names the network it manages.
    pub network: Option<String>,
    /// The incarnation of the row the status is about.
    pub incarnation: Option<Incarnation>,
}

/// What to do with the status row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Publish {
    /// Write (insert or replace) the row.
    Write(StatusUpdate),
    /// Delete the row: the sandbox is gone.
    Delete,
    /// Leave it as it is.
    Nothing,
}

/// Why a reconcile must be retried with backoff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Failure {
    /// Removing a container failed.
    Teardown(String),
    /// One or more engines could not be provisioned (one line each).
    Provision(String),
}

/// The decision: what to publish, and whether to retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// The status row to publish.
    pub(crate) publish: Publish,
    /// `Some` when the reconcile failed and must be retried.
    pub(crate) failure: Option<Failure>,
}

/// What came of acting on a plan.
#[derive(Debug, Clone, Default)]
pub(crate) struct Outcomes {
    /// Each provisioned engine: its new status, or why it failed.
    pub(crate) provisioned: Vec<(EngineName, Result<ServiceStatus, String>)>,
    /// The first teardown that failed, if any.
    pub(crate) teardown: Option<String>,
    /// Containers the row names in `attach` that could not be attached.
    pub(crate) attach: Vec<String>,
    /// Engines that died on their own again and were not healed yet:
    /// backing off until a time (a crash loop; heals go on); or whose heal
    /// was interrupted from outside (`Now`: healed again at once).
    pub(crate) held: Vec<(EngineName, HealGate)>,
    /// Why the last heal of a held engine did not come up, if it did not.
    pub(crate) heal_failures: BTreeMap<EngineName, String>,
    /// Engines not provisioned yet because their image is being pulled or
    /// built in the background, one line each saying so.
    pub(crate) awaiting: Vec<String>,
    /// The row is idle and asks to pause ([`Plan::pause`]): `Ok` once every
    /// engine's container is frozen, or why freezing failed. `None`: not
    /// paused.
    pub(crate) paused: Option<Result<(), String>>,
}

pub(crate) const PAUSED: &str = "paused: idle for longer than its idle timeout (no request, touch or client connection); its containers are frozen with their data and credentials; a request, a touch or `sandboxd resume` resumes it";

/// The services a wanted sandbox publishes before anything new is
/// provisioned: what was published for engines the row still wants (so
/// credentials being healed stay published even if the controller stops
/// mid-provision), overridden by the engines the plan keeps. An invalid row
/// keeps every container, so it keeps publishing all of them: were their
/// credentials dropped, fixing the row would replace the containers.
fn standing_services(
    plan: &Plan,
    desired: &DesiredSandbox,
    previous: Option<&SandboxStatus>,
) -> Services {
    let mut services: Services = plan
        .kept()
        .map(|(engine, status)| (engine.as_str().to_owned(), Box::new(status.clone())))
        .collect();
    let still_wanted =
        |engine: &str| desired.invalid.is_some() || desired.services.iter().any(|e| e == engine);
    for (engine, status) in previous.iter().flat_map(|s| &s.services) {
        if still_wanted(engine) && !services.contains_key(engine) {
            services.insert(engine.clone(), status.clone());
        }
    }
    services
}

fn wanted_row<'a>(plan: &Plan, desired: Option<&'a DesiredSandbox>) -> Option<&'a DesiredSandbox> {
    desired.filter(|_| plan.wanted == Wanted::Yes)
}

/// The previous status as far as `desired` is concerned: the one of the
/// row's incarnation, or none. A status of another incarnation (the id was
/// deleted and inserted again) or written before incarnations vouches for
/// nothing the row has (no credentials, no generation) and is replaced by
/// the row's own. For a deleted row, whatever status is left; for a row
/// whose incarnation cannot be read (it is invalid and keeps everything),
/// the status as it is.
pub(crate) fn of_incarnation<'a>(
    previous: Option<&'a SandboxStatus>,
    desired: Option<&DesiredSandbox>,
) -> Option<&'a SandboxStatus> {
    match desired.and_then(|d| d.incarnation.as_ref()) {
        None => previous,
        Some(row) => previous.filter(|p| p.incarnation.as_ref() == Some(row)),
    }
}

/// Whether writing `update` would leave the status row `previous` as it
/// is (the store skips such writes too).
pub fn unchanged(update: &StatusUpdate, previous: &SandboxStatus) -> bool {
    update.phase == previous.phase
        && update.observed_generation == previous.observed_generation
        && update.message == previous.message
        && update.services == previous.services
        && update.network == previous.network
        && update.incarnation == previous.incarnation
}

/// The generation a status row already reports (0 if there is none).
pub fn observed_generation(previous: Option<&SandboxStatus>) -> i64 {
    previous.map_or(0, |s| s.observed_generation)
}

/// Whether the row changed since the status last observed it.
pub(crate) fn is_new_request(desired: &DesiredSandbox, previous: Option<&SandboxStatus>) -> bool {
    observed_generation(previous) < desired.generation
}

/// The status written before containers are created, or `None` when the
/// plan creates nothing: `healing` when an engine that was published dies
/// (the message names it and `causes` says why), else `provisioning`. It
/// keeps the previous observed generation: the new one is observed only
/// once provisioning is done.
pub(crate) fn while_provisioning(
    plan: &Plan,
    desired: Option<&DesiredSandbox>,
    previous: Option<&SandboxStatus>,
    causes: &BTreeMap<EngineName, HealCause>,
) -> Option<StatusUpdate> {
    let desired = wanted_row(plan, desired)?;
    let mut healing = Vec::new();
    let mut others = Vec::new();
    let mut rotating = Vec::new();
    for p in plan.provisions() {
        if p.reason == ProvisionReason::Heal {
            let cause = causes.get(&p.engine).copied().unwrap_or(HealCause::Exited);
            healing.push(format!("{} ({})", p.engine, cause.phrase()));
        } else if p.retire.is_some() {
            rotating.push(p.engine.as_str().to_owned());
        } else {
            others.push(p.engine.as_str().to_owned());
        }
    }
    let (phase, message) = match (healing.is_empty(), others.is_empty() && rotating.is_empty()) {
        (true, true) => return None,
        (true, false) => (Phase::Provisioning, String::new()),
        (false, _) => (
            Phase::Healing,
            format!(
                "healing {}: re-creating with the same credentials; {}",
                healing.join(", "),
                if desired.persistent {
                    "its data is kept on the sandbox's volume"
                } else {
                    "its data is lost"
                }
            ),
        ),
    };
    let others = (!others.is_empty()).then(|| format!("provisioning {}", others.join(", ")));
    let rotating = (!rotating.is_empty()).then(|| {
        format!(
            "rotating {}: a new container is built next to the running one, which serves the published credentials until the new one is ready",
            rotating.join(", ")
        )
    });
    let message = [Some(message), others, rotating]
        .into_iter()
        .flatten()
        .filter(|m| !m.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    Some(StatusUpdate {
        phase,
        observed_generation: observed_generation(previous),
        message,
        services: standing_services(plan, desired, previous),
        network: None,
        incarnation: desired.incarnation.clone(),
    })
}

/// A `healing` status with why the engines' last heals failed, when they
/// did (`failures`, by engine): a heal slower than its back-off starts
/// again as soon as it fails, so the failed status it wrote stands for
/// moments only, and this one is what an operator reads meanwhile.
pub(crate) fn with_last_failures(
    mut update: StatusUpdate,
    failures: &BTreeMap<EngineName, String>,
) -> StatusUpdate {
    if update.phase == Phase::Healing {
        for (engine, failure) in failures {
            update
                .message
                .push_str(&format!("; {engine}'s last heal failed: {failure}"));
        }
    }
    update
}

/// The status published once a rotation's new container for `engine` is
/// ready and verified, while the old one still runs: `update` (the status
/// written while provisioning, or the last such switch) with the new
/// container's credentials, and `note` (what happened) after `engine` in
/// the message. This write is the rotation's commit point: from it on the
/// new container is the live one, and a restarted controller finishes the
/// switch instead of building again. (A persistent sandbox's failed
/// rotation publishes its restored old credentials the same way.)
pub(crate) fn switching(
    mut update: StatusUpdate,
    engine: EngineName,
    service: ServiceStatus,
    note: &str,
) -> StatusUpdate {
    update
        .services
        .insert(engine.as_str().to_owned(), Box::new(service));
    let note = format!("{engine}: {note}");
    update.message = [update.message, note]
        .into_iter()
        .filter(|m| !m.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    update
}

/// Decides the status row and the reconcile's result once every action ran.
pub(crate) fn decide(
    plan: &Plan,
    desired: Option<&DesiredSandbox>,
    previous: Option<&SandboxStatus>,
    outcomes: &Outcomes,
) -> Verdict {
    let Some(desired) = wanted_row(plan, desired) else {
        return decide_unwanted(plan, desired, previous, outcomes);
    };
    let mut services = standing_services(plan, desired, previous);
    let mut failures: Vec<String> = desired
        .invalid
        .iter()
        .map(|reason| format!("the desired row is invalid: {reason}; rewrite it (the database's checks say what is allowed)"))
        .collect();
    failures.extend(desired.unknown_services.iter().map(|name| {
        format!(
            "{name}: unknown engine; this sandboxd does not run it (table sandbox_engines \
                 lists those it does): remove it from services or upgrade sandboxd"
        )
    }));
    failures.extend(outcomes.attach.iter().cloned());
    if let Some(Err(e)) = &outcomes.paused {
        failures.push(format!("pausing the idle sandbox failed: {e}"));
    }
    let paused = matches!(outcomes.paused, Some(Ok(())));
    for (engine, result) in &outcomes.provisioned {
        match result {
            Ok(status) => {
                services.insert(engine.as_str().to_owned(), Box::new(status.clone()));
            }
            Err(e) => failures.push(format!("{engine}: {e}")),
        }
    }
    let mut waiting = Vec::new();
    for (engine, gate) in &outcomes.held {
        if let (HealGate::Now, Some(e)) = (gate, outcomes.heal_failures.get(engine)) {
            waiting.push(format!(
                "healing {engine}: its new container was ended from outside before it was ready ({e}); re-creating it at once, with the same credentials"
            ));
        }
        if let HealGate::At { at, heals } = gate {
            let why = match outcomes.heal_failures.get(engine) {
                Some(e) => format!("its last re-creation did not come up ({e})"),
                None => "its last container's logs say why it dies".to_owned(),
            };
            waiting.push(format!(
                "healing {engine}: crash loop: its container died on its own {heals} time(s) in a row; \
                 the next heal is at {} (the wait doubles up to its cap, and heals go on, with the same credentials); {why}",
                at.format("%H:%M:%S UTC")
            ));
        }
    }
    // Waiting for an image: not failed, not retried (the image's fetch
    // wakes the sandbox), and the row's generation is not observed yet.
    let awaiting = failures.is_empty() && !outcomes.awaiting.is_empty();
    if !failures.is_empty() {
        failures.extend(outcomes.awaiting.iter().cloned());
    }
    let (phase, message, failure) = match (failures.is_empty(), &outcomes.teardown) {
        (true, teardown) if awaiting => (
            Phase::Provisioning,
            outcomes.awaiting.join("\n"),
            teardown.clone().map(Failure::Teardown),
        ),
        (true, None) if !waiting.is_empty() => (Phase::Healing, waiting.join("\n"), None),
        (true, None) if paused => (Phase::Paused, PAUSED.to_owned(), None),
        (true, None) => (Phase::Ready, String::new(), None),
        (true, Some(e)) => (
            Phase::Ready,
            format!("ready; cleanup pending: {e}"),
            Some(Failure::Teardown(e.clone())),
        ),
        (false, _) => {
            let message = failures.join("\n");
            (
                Phase::Failed,
                message.clone(),
                Some(Failure::Provision(message)),
            )
        }
    };
    Verdict {
        publish: Publish::Write(StatusUpdate {
            phase,
            observed_generation: if awaiting {
                observed_generation(previous)
            } else {
                desired.generation
            },
            message,
            services,
            network: None,
            incarnation: desired.incarnation.clone(),
        }),
        failure,
    }
}

/// A deleted or expired row: tear down, report `terminating` while a
/// reap waits for its grace window, and drop the status row of a deleted
/// sandbox once nothing is left.
fn decide_unwanted(
    plan: &Plan,
    desired: Option<&DesiredSandbox>,
    previous: Option<&SandboxStatus>,
    outcomes: &Outcomes,
) -> Verdict {
    if let Some(e) = &outcomes.teardown {
        return Verdict {
            publish: Publish::Nothing,
            failure: Some(Failure::Teardown(e.clone())),
        };
    }
    let publish = match (plan.wanted, plan.is_waiting()) {
        (Wanted::Deleted, false) => Publish::Delete,
        // An orphan (no row, no status) waiting out its grace window:
        // nothing to tell an orchestrator about.
        (Wanted::Deleted, true) if previous.is_none() => Publish::Nothing,
        (why, _) => Publish::Write(StatusUpdate {
            phase: Phase::Terminating,
            observed_generation: desired
                .map_or_else(|| observed_generation(previous), |d| d.generation),
            message: match why {
                Wanted::Expired => "expired: the row is past expires_at".into(),
                Wanted::Idle => "released: idle for longer than its idle timeout (no request or touch); request it again for a new one".into(),
                // One message whether the container is missing, stopped or
                // not opted in (domain::attach): it tells nothing of the host.
                Wanted::OwnerGone => format!(
                    "released: its owner container {} is gone (none runs under that exact name with the label {}={}); request it again for a new one",
                    desired.and_then(|d| d.owner_container.as_deref()).unwrap_or("?"),
                    crate::domain::attach::OPT_IN,
                    desired.map_or("", |d| d.owner.as_str()),
                ),
                Wanted::Deleted | Wanted::Yes => {
                    "deleted: waiting for the grace window before removing containers".into()
                }
            },
            services: BTreeMap::new(),
            network: None,
            incarnation: match desired {
                Some(d) => d.incarnation.clone(),
                None => previous.and_then(|p| p.incarnation.clone()),
            },
        }),
    };
    Verdict {
        publish,
        failure: None,
    }
}

#[cfg(test)]
mod tests;
