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
//! Pure decisions, tested with tables.

use super::container::ObservedContainer;
use super::id::EngineName;
use super::labels;
use super::plan::{Action, Plan};
use super::sandbox::SandboxStatus;
use std::collections::HashMap;
use std::fmt;

/// Why a state database identity or an incarnation was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdentityError {
    /// Not a uuid in its canonical text form.
    #[error("invalid {kind} {value:?}: expected a uuid such as 5f0c7e3a-9b1d-4c2e-8f00-1a2b3c4d5e6f (is the state database migrated? run `sandboxd migrate`)")]
    NotAUuid {
        /// What was being parsed ("state database identity", "incarnation").
        kind: &'static str,
        /// The offending value, cut to 80 characters.
        value: String,
    },
}

/// Whether `s` is a uuid as Postgres prints one: 8-4-4-4-12 lowercase hex.
fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_digit() || (b'a'..=b'f').contains(c),
        })
}

fn parse(kind: &'static str, s: &str) -> Result<String, IdentityError> {
    if is_uuid(s) {
        Ok(s.to_owned())
    } else {
        Err(IdentityError::NotAUuid {
            kind,
            value: s.chars().take(80).collect(),
        })
    }
}

/// The identity of a state database (`sandbox_identity.state_id`): a
/// random uuid its migration created. A restored dump keeps it; a new
/// database has another.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct StateId(String);

impl StateId {
    /// Validates `s` as a state database identity.
    pub fn parse(s: &str) -> Result<Self, IdentityError> {
        parse("state database identity", s).map(Self)
    }

    /// The identity as text (as in the label).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for StateId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One incarnation of a desired row (`sandbox_desired.incarnation`): a
/// random uuid the database sets when the row is inserted and keeps while
/// it exists, so a row deleted and inserted again under the same id is
/// another incarnation.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Incarnation(String);

impl Incarnation {
    /// Validates `s` as an incarnation.
    pub fn parse(s: &str) -> Result<Self, IdentityError> {
        parse("incarnation", s).map(Self)
    }

    /// The incarnation as text (as in the label and the status).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Incarnation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whether `c` belongs to the state database `state`: its
/// `io.sandboxd.state-id` label says so; or it has no such label (it was
/// created before identities existed) and `status`, this database's
/// status row for its sandbox, publishes its `io.sandboxd.instance` token,
/// which proves this database published it.
pub fn is_ours(c: &ObservedContainer, state: &StateId, status: Option<&SandboxStatus>) -> bool {
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
pub fn partition(
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
pub fn resource_is_ours(labels: Option<&str>, state: &StateId) -> bool {
    labels.is_none_or(|theirs| theirs == state.as_str())
}

/// Whether a volume that exists with `existing` labels may be mounted into
/// a container that asks for it with `wanted` labels: the same deployment
/// and sandbox, and neither another state database's nor another
/// incarnation's data (a volume without those labels predates them and is
/// adopted).
pub fn may_mount(existing: &HashMap<String, String>, wanted: &HashMap<String, String>) -> bool {
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
pub fn may_replace(existing: &HashMap<String, String>, wanted: &HashMap<String, String>) -> bool {
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
pub fn hold_names_held_by_foreign(
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
