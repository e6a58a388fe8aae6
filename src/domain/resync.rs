//! Which sandboxes a relist must reconcile. A relist holds both sides of
//! the whole fleet at once; a sandbox that this snapshot shows converged
//! (its plan keeps every container, its status would not change, its
//! engines are on their network) would only be read again, one sandbox at
//! a time, by a reconcile that then does nothing. The relist skips it (and
//! asks for a look when the row expires or may go idle, as that reconcile
//! would have), so that an idle fleet costs a few lists per relist instead
//! of a few Docker calls per sandbox. Everything else is reconciled, and a
//! periodic full resync reconciles every sandbox whatever its snapshot
//! says.

use super::container::ObservedContainer;
use super::pause;
use super::plan::{self, Action, Policy, Wanted};
use super::sandbox::{DesiredSandbox, Phase, SandboxStatus};
use super::status::{self, Outcomes, Publish};
use chrono::{DateTime, Utc};

/// One sandbox as a relist saw it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Snapshot<'a> {
    pub(crate) desired: Option<&'a DesiredSandbox>,
    /// This state database's containers of the sandbox (claimed warm-pool
    /// containers included).
    pub(crate) observed: &'a [ObservedContainer],
    pub(crate) status: Option<&'a SandboxStatus>,
    /// The network its engines must be on, if that network exists.
    pub(crate) network: Option<&'a str>,
    /// Whether another state database's containers carry its id.
    pub(crate) foreign: bool,
}

/// What a relist does with one sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Judgement {
    /// Reconcile it now.
    Reconcile,
    /// Converged: nothing to do now. Look at it again at `recheck_at`, if
    /// set (when the row expires or may go idle).
    Converged {
        /// When the row may stop being wanted.
        recheck_at: Option<DateTime<Utc>>,
    },
}

/// Whether the snapshot shows the sandbox converged: a ready (or paused)
/// status of the row's incarnation and generation, every engine's
/// container running and kept as published (and frozen exactly when the
/// row is idle and asks to pause), on the sandbox's network. A row that asks for more
/// than the snapshot shows (attached containers, an owner container) or
/// that is invalid is never judged converged here.
pub(crate) fn judge(snapshot: &Snapshot<'_>, now: DateTime<Utc>, policy: &Policy) -> Judgement {
    match converged(snapshot, now, policy) {
        Some(recheck_at) => Judgement::Converged { recheck_at },
        None => Judgement::Reconcile,
    }
}

/// `Some(recheck_at)` if converged.
fn converged(
    snapshot: &Snapshot<'_>,
    now: DateTime<Utc>,
    policy: &Policy,
) -> Option<Option<DateTime<Utc>>> {
    let desired = snapshot.desired?;
    let network = snapshot.network?;
    if snapshot.foreign
        || desired.invalid.is_some()
        || !desired.unknown_services.is_empty()
        || !desired.attach.is_empty()
        || desired.owner_container.is_some()
    {
        return None;
    }
    let previous = status::of_incarnation(snapshot.status, Some(desired))?;
    if !matches!(previous.phase, Phase::Ready | Phase::Paused)
        || previous.network.as_deref() != Some(network)
    {
        return None;
    }
    let plan = plan::plan(
        Some(desired),
        snapshot.observed,
        Some(previous),
        None,
        None,
        now,
        policy,
    );
    if plan.wanted != Wanted::Yes {
        return None;
    }
    let all_kept_on_network = plan.actions.iter().all(|action| match action {
        Action::Keep { engine, status } => snapshot.observed.iter().any(|c| {
            c.labels.engine == engine.as_str()
                && c.labels.instance == status.instance
                && c.networks.iter().any(|n| n == network)
        }),
        _ => false,
    });
    if !all_kept_on_network || plan.next_wake().is_some() || plan.data_kept_until.is_some() {
        return None;
    }
    // A paused sandbox is converged when every container is frozen as it
    // should be: nothing to freeze and nothing to thaw.
    let freezing = pause::step(&plan, snapshot.observed);
    if !freezing.freeze.is_empty() || !freezing.thaw.is_empty() {
        return None;
    }
    let outcomes = Outcomes {
        paused: freezing.paused.then_some(Ok(())),
        ..Outcomes::default()
    };
    let verdict = status::decide(&plan, Some(desired), Some(previous), &outcomes);
    match verdict.publish {
        Publish::Write(mut update) if verdict.failure.is_none() => {
            update.network = Some(network.to_owned());
            status::unchanged(&update, previous).then_some(plan.recheck_at)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests;
