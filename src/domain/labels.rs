//! Container labels: how sandboxd recognises its own containers and reads
//! back what it created after a restart. Never holds credentials.

use super::id::{Deployment, SandboxId};
use std::collections::{BTreeSet, HashMap};

/// Always `sandboxd` on containers sandboxd manages.
pub const MANAGED_BY: &str = "io.sandboxd.managed-by";
/// The deployment that owns the container; the scope of a controller.
pub const DEPLOYMENT: &str = "io.sandboxd.deployment";
/// The sandbox id (`sandbox_desired.id`).
pub const SANDBOX: &str = "io.sandboxd.sandbox";
/// Who asked for the sandbox.
pub const OWNER: &str = "io.sandboxd.owner";
/// Engine name from the registry.
pub const ENGINE: &str = "io.sandboxd.engine";
/// `sandbox_desired.generation` the container was created for.
pub const GENERATION: &str = "io.sandboxd.generation";
/// Comma-separated sorted features enabled in the container.
pub const FEATURES: &str = "io.sandboxd.features";
/// Random token naming this container; `sandbox_status` carries it once the
/// container is fully provisioned (ready, features verified) and its
/// credentials published, so a restarted controller can tell a finished,
/// published container from one a crash left half-done. Not derived from
/// the credentials.
pub const INSTANCE: &str = "io.sandboxd.instance";
/// Labels that mark containers sandboxd runs itself (engines, its state
/// databases, their test copies): never connected to a sandbox network.
pub const OWN_CONTAINERS: &[&str] = &[
    MANAGED_BY,
    DEPLOYMENT,
    "io.sandboxd.state",
    "io.sandboxd.test-state",
];
/// Value of [`MANAGED_BY`].
pub const MANAGER: &str = "sandboxd";

/// Whether `labels` (of a container, network or volume) say `deployment`
/// owns it.
pub fn belongs_to(labels: &HashMap<String, String>, deployment: &Deployment) -> bool {
    labels.get(DEPLOYMENT).map(String::as_str) == Some(deployment.as_str())
}

/// The labels of a network or volume `deployment` creates for `sandbox`.
pub fn of_sandbox(deployment: &Deployment, sandbox: &SandboxId) -> HashMap<String, String> {
    HashMap::from([
        (MANAGED_BY.to_owned(), MANAGER.to_owned()),
        (DEPLOYMENT.to_owned(), deployment.to_string()),
        (SANDBOX.to_owned(), sandbox.to_string()),
    ])
}

/// What a sandbox container's labels say about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerLabels {
    /// Owning deployment.
    pub deployment: Deployment,
    /// Sandbox id.
    pub sandbox: SandboxId,
    /// Owner from the desired row.
    pub owner: String,
    /// Engine name.
    pub engine: String,
    /// Generation of the desired row the container was made for.
    pub generation: i64,
    /// Features enabled in it.
    pub features: BTreeSet<String>,
    /// Credential-set token (see [`INSTANCE`]).
    pub instance: String,
}

impl ContainerLabels {
    /// The labels to put on a new container.
    pub fn to_map(&self) -> HashMap<String, String> {
        let features: Vec<&str> = self.features.iter().map(String::as_str).collect();
        HashMap::from([
            (MANAGED_BY.to_owned(), MANAGER.to_owned()),
            (DEPLOYMENT.to_owned(), self.deployment.to_string()),
            (SANDBOX.to_owned(), self.sandbox.to_string()),
            (
                OWNER.to_owned(),
                self.owner.chars().filter(|c| !c.is_control()).collect(),
            ),
            (ENGINE.to_owned(), self.engine.clone()),
            (GENERATION.to_owned(), self.generation.to_string()),
            (FEATURES.to_owned(), features.join(",")),
            (INSTANCE.to_owned(), self.instance.clone()),
        ])
    }

    /// Reads labels back; `None` when the container is not a well-formed
    /// sandboxd container (those are left alone).
    pub fn parse(map: &HashMap<String, String>) -> Option<Self> {
        if map.get(MANAGED_BY).map(String::as_str) != Some(MANAGER) {
            return None;
        }
        Some(Self {
            deployment: Deployment::parse(map.get(DEPLOYMENT)?).ok()?,
            sandbox: SandboxId::parse(map.get(SANDBOX)?).ok()?,
            owner: map.get(OWNER).cloned().unwrap_or_default(),
            engine: map.get(ENGINE)?.clone(),
            generation: map.get(GENERATION)?.parse().ok()?,
            features: map
                .get(FEATURES)
                .map(|f| {
                    f.split(',')
                        .filter(|s| !s.is_empty())
                        .map(String::from)
                        .collect()
                })
                .unwrap_or_default(),
            instance: map.get(INSTANCE).cloned().unwrap_or_default(),
        })
    }
}

/// The Docker label filter selecting everything `deployment` labelled
/// (containers, networks, volumes, their events).
pub fn deployment_filter(deployment: &Deployment) -> String {
    format!("{DEPLOYMENT}={deployment}")
}

/// Docker label filters selecting one deployment's containers, optionally
/// one sandbox's.
pub fn filters(deployment: &Deployment, sandbox: Option<&SandboxId>) -> Vec<String> {
    let mut f = vec![
        format!("{MANAGED_BY}={MANAGER}"),
        deployment_filter(deployment),
    ];
    if let Some(id) = sandbox {
        f.push(format!("{SANDBOX}={id}"));
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_round_trip_through_a_map() {
        let l = ContainerLabels {
            deployment: Deployment::parse("prod").unwrap(),
            sandbox: SandboxId::parse("agent-1").unwrap(),
            owner: "ci".into(),
            engine: "postgres".into(),
            generation: 3,
            features: BTreeSet::from(["citext".into(), "pg_trgm".into()]),
            instance: "0123abcd".into(),
        };
        let map = l.to_map();
        assert_eq!(map[FEATURES], "citext,pg_trgm");
        assert_eq!(ContainerLabels::parse(&map), Some(l));
    }

    #[test]
    fn containers_not_managed_by_sandboxd_are_not_parsed() {
        let mut map = HashMap::new();
        map.insert(SANDBOX.to_owned(), "agent-1".to_owned());
        assert_eq!(ContainerLabels::parse(&map), None);
    }
}
