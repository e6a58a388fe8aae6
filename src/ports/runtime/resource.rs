//! A network or volume sandboxd created, as the [`super::Networks`] and
//! [`super::Volumes`] roles list them.

use crate::domain::id::{Deployment, SandboxId};
use crate::domain::labels;
use crate::domain::volume_disk;
use std::collections::HashMap;

/// A network or volume sandboxd created, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedResource {
    /// Network or volume name.
    pub name: String,
    /// The sandbox its labels name, if valid.
    pub sandbox: Option<SandboxId>,
    /// The state database identity its labels name (see
    /// [`labels::STATE_ID`]); `None` if it predates identities.
    pub state_id: Option<String>,
    /// The incarnation its labels name (volumes; see
    /// [`labels::INCARNATION`]).
    pub incarnation: Option<String>,
    /// The key of its file, for a capped volume made since files are
    /// keyed (see [`volume_disk::KEY_LABEL`]).
    pub disk_key: Option<String>,
}

impl ObservedResource {
    /// The network or volume `name` with `labels`, if they say `deployment`
    /// created it.
    pub fn of(
        name: String,
        labels: &HashMap<String, String>,
        deployment: &Deployment,
    ) -> Option<Self> {
        labels::belongs_to(labels, deployment).then(|| Self {
            name,
            sandbox: labels
                .get(labels::SANDBOX)
                .and_then(|s| SandboxId::parse(s).ok()),
            state_id: labels.get(labels::STATE_ID).cloned(),
            incarnation: labels.get(labels::INCARNATION).cloned(),
            disk_key: volume_disk::key_of(labels).map(str::to_owned),
        })
    }
}
