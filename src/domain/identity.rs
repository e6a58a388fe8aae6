//! Which state database, and which incarnation of a row, a container
//! belongs to: the two labels that scope what a controller may touch.
//!
//! * The state database's identity ([`StateId`], `sandbox_identity`,
//!   created by its migration) is on every container, network and volume
//!   sandboxd creates (`io.sandboxd.state-id`). A container of this
//!   deployment that carries another identity is *foreign*: another state
//!   database's (a controller pointed at an empty or another database, say).
//!   It is never torn down, healed or rotated and is left out of the plan.
//! * A row's incarnation ([`Incarnation`], `sandbox_desired.incarnation`,
//!   set by the database on insert and kept on update) tells a row deleted
//!   and inserted again from the row before: containers and volumes carry
//!   it (`io.sandboxd.incarnation`), statuses too, and a container of
//!   another incarnation is never the row's (see `plan`).
//!
//! Templates are not scoped by the state database: they hold no tenant's
//! data, so a template another identity built is reused when its labels
//! prove the same content ([`super::template_volume::judge`]); only data
//! volumes obey [`may_mount`].
//!
//! Pure decisions, tested with tables.

use super::container::ObservedContainer;
use super::id::EngineName;
pub use super::id::{IdentityError, Incarnation, StateId};
use super::labels;
use super::plan::{Action, Plan};
use super::sandbox::SandboxStatus;
use std::collections::HashMap;

/// Whether `c` belongs to the state database `state`: its
/// `io.sandboxd.state-id` label says so; or it has no such label (it was
/// created before identities existed) and `status`, this database's
/// status row for its sandbox, publishes its `io.sandboxd.instance` token,
/// which proves this database published it.
pub(crate) fn is_ours(
    c: &ObservedContainer,
    state: &StateId,
    status: Option<&SandboxStatus>,
) -> bool {
    match c.labels.state_id.as_deref() {
        Some(theirs) => theirs == state.as_str(),
        None => status.is_some_and(|s| {
            !c.labels.instance.is_empty()
                && s.services.values().any(|p| p.instance == c.labels.instance)
        }),
    }
}

/// Splits one sandbox's containers into this state database's and the
/// foreign ones (see [`is_ours`]); `status` is this database's status row
/// for the sandbox.
pub(crate) fn partition(
    observed: Vec<ObservedContainer>,
    state: &StateId,
    status: Option<&SandboxStatus>,
) -> (Vec<ObservedContainer>, Vec<ObservedContainer>) {
    observed
        .into_iter()
        .partition(|c| is_ours(c, state, status))
}

/// Whether a network or volume with `labels` may be removed by the
/// controller of `state`: it carries this identity, or none (it was
/// created before identities existed and is treated as before).
pub(crate) fn resource_is_ours(labels: Option<&str>, state: &StateId) -> bool {
    labels.is_none_or(|theirs| theirs == state.as_str())
}

/// Whether a volume that exists with `existing` labels may be mounted into
/// a container that asks for it with `wanted` labels: the same deployment
/// and sandbox, and neither another state database's nor another
/// incarnation's data (a volume without those labels predates them and is
/// adopted).
pub(crate) fn may_mount(
    existing: &HashMap<String, String>,
    wanted: &HashMap<String, String>,
) -> bool {
    let same = |k: &str| existing.get(k) == wanted.get(k);
    let same_if_set = |k: &str| existing.get(k).is_none_or(|v| wanted.get(k) == Some(v));
    same(labels::DEPLOYMENT)
        && same(labels::SANDBOX)
        && same_if_set(labels::STATE_ID)
        && same_if_set(labels::INCARNATION)
}

/// Whether a container that exists with `existing` labels may be removed
/// to create one with `wanted` labels under its name: the same deployment,
/// sandbox and engine, and not another state database's (one without the
/// identity label predates it; the plan has already judged it).
pub(crate) fn may_replace(
    existing: &HashMap<String, String>,
    wanted: &HashMap<String, String>,
) -> bool {
    let same = |k: &str| existing.contains_key(k) && existing.get(k) == wanted.get(k);
    same(labels::DEPLOYMENT)
        && same(labels::SANDBOX)
        && same(labels::ENGINE)
        && existing
            .get(labels::STATE_ID)
            .is_none_or(|v| wanted.get(labels::STATE_ID) == Some(v))
}

/// Takes out of `plan` every provision whose container name a foreign
/// container holds (creating it would first remove that container) and
/// returns, per engine, the message the sandbox fails with.
pub(crate) fn hold_names_held_by_foreign(
    plan: &mut Plan,
    foreign: &[ObservedContainer],
    state: &StateId,
) -> Vec<(EngineName, String)> {
    let mut held = Vec::new();
    plan.actions.retain(|action| {
        let Action::Provision(p) = action else {
            return true;
        };
        let Some(holder) = foreign
            .iter()
            .find(|c| c.labels.engine == p.engine.as_str())
        else {
            return true;
        };
        let whose = match &holder.labels.state_id {
            Some(theirs) => format!(
                "belongs to another state database (its io.sandboxd.state-id is {theirs}, this one's is {state})"
            ),
            None => "was created before state database identities and this database's status does not vouch for it".to_owned(),
        };
        held.push((
            p.engine,
            format!(
                "not provisioned: the container name {} is held by container {} that {whose}; \
                 sandboxd never touches another database's containers: point this deployment's \
                 controllers at one state database, or remove that container (docker rm -f {}) \
                 if nothing uses it, or use another sandbox id",
                holder.name, holder.id, holder.name
            ),
        ));
        false
    });
    held
}

#[cfg(test)]
mod tests;
