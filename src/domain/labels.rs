//! Container labels: how sandboxd recognises its own containers and reads
//! back what it created after a restart. Never holds credentials.

use super::id::{Deployment, SandboxId};
use super::isolation::Isolation;
use super::seed::{SeedHash, SEED};
use std::collections::{BTreeSet, HashMap};

/// Always `sandboxd` on containers sandboxd manages.
pub(crate) const MANAGED_BY: &str = "io.sandboxd.managed-by";
/// The deployment that owns the container; the scope of a controller.
pub(crate) const DEPLOYMENT: &str = "io.sandboxd.deployment";
/// The sandbox id (`sandbox_desired.id`).
pub(crate) const SANDBOX: &str = "io.sandboxd.sandbox";
/// Who asked for the sandbox.
pub const OWNER: &str = "io.sandboxd.owner";
/// Engine name from the registry.
pub const ENGINE: &str = "io.sandboxd.engine";
/// `sandbox_desired.generation` the container was created for.
pub(crate) const GENERATION: &str = "io.sandboxd.generation";
/// Comma-separated sorted features enabled in the container.
pub const FEATURES: &str = "io.sandboxd.features";
/// Random token naming this container; `sandbox_status` carries it once the
/// container is fully provisioned (ready, features verified) and its
/// credentials published, so a restarted controller can tell a finished,
/// published container from one a crash left half-done. Not derived from
/// the credentials.
pub const INSTANCE: &str = "io.sandboxd.instance";
/// The identity of the state database whose controller created the
/// container, network or volume (`sandbox_identity.state_id`): a controller
/// never touches what carries another.
pub const STATE_ID: &str = "io.sandboxd.state-id";
/// The incarnation of the desired row a container or data volume was
/// created for (`sandbox_desired.incarnation`): a row deleted and inserted
/// again never inherits them.
pub const INCARNATION: &str = "io.sandboxd.incarnation";
/// The isolation level the container runs under
/// ([`crate::domain::isolation::Isolation`]): `container` or `gvisor`
/// (none: made before levels existed, `container`).
pub const ISOLATION: &str = "io.sandboxd.isolation";
/// Labels that mark containers sandboxd runs itself (engines, its state
/// databases, their test copies, the compose stack's services): never
/// attached to a sandbox network ([`super::attach`]).
pub(crate) const OWN_CONTAINERS: &[&str] = &[
    MANAGED_BY,
    DEPLOYMENT,
    "io.sandboxd.state",
    "io.sandboxd.test-state",
];
/// Value of [`MANAGED_BY`].
pub(crate) const MANAGER: &str = "sandboxd";

/// Whether `labels` (of a container, network or volume) say `deployment`
/// owns it.
pub(crate) fn belongs_to(labels: &HashMap<String, String>, deployment: &Deployment) -> bool {
    labels.get(DEPLOYMENT).map(String::as_str) == Some(deployment.as_str())
}

/// The labels of a network or volume `deployment` creates for `sandbox`.
pub(crate) fn of_sandbox(deployment: &Deployment, sandbox: &SandboxId) -> HashMap<String, String> {
    HashMap::from([
        (MANAGED_BY.to_owned(), MANAGER.to_owned()),
        (DEPLOYMENT.to_owned(), deployment.to_string()),
        (SANDBOX.to_owned(), sandbox.to_string()),
    ])
}

/// The features a [`FEATURES`] label lists.
pub fn features(label: &str) -> BTreeSet<String> {
    label
        .split(',')
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
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
    /// The state database's identity (see [`STATE_ID`]); `None` on
    /// containers created before identities existed.
    pub state_id: Option<String>,
    /// The row's incarnation (see [`INCARNATION`]); `None` on containers
    /// created before incarnations existed.
    pub incarnation: Option<String>,
    /// The isolation level it runs under (see [`ISOLATION`]).
    pub isolation: Isolation,
    /// The seed its data started from (label [`SEED`]); `None`: empty.
    pub seed: Option<SeedHash>,
}

impl ContainerLabels {
    /// The labels to put on a new container.
    pub(crate) fn to_map(&self) -> HashMap<String, String> {
        let features: Vec<&str> = self.features.iter().map(String::as_str).collect();
        let mut map = HashMap::from([
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
            (ISOLATION.to_owned(), self.isolation.as_str().to_owned()),
        ]);
        for (key, value) in [(STATE_ID, &self.state_id), (INCARNATION, &self.incarnation)] {
            if let Some(value) = value {
                map.insert(key.to_owned(), value.clone());
            }
        }
        if let Some(seed) = &self.seed {
            map.insert(SEED.to_owned(), seed.to_string());
        }
        map
    }

    /// The labels of the data volume mounted into this container: its
    /// sandbox's, and its state database's and incarnation's, so that the
    /// data is never mounted into another incarnation's container.
    pub(crate) fn of_volume(&self) -> HashMap<String, String> {
        let mut map = of_sandbox(&self.deployment, &self.sandbox);
        for (key, value) in [(STATE_ID, &self.state_id), (INCARNATION, &self.incarnation)] {
            if let Some(value) = value {
                map.insert(key.to_owned(), value.clone());
            }
        }
        map
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
            features: map.get(FEATURES).map(|f| features(f)).unwrap_or_default(),
            instance: map.get(INSTANCE).cloned().unwrap_or_default(),
            state_id: map.get(STATE_ID).cloned(),
            incarnation: map.get(INCARNATION).cloned(),
            isolation: Isolation::of_label(map.get(ISOLATION).map(String::as_str)),
            seed: map.get(SEED).and_then(|s| SeedHash::parse(s)),
        })
    }
}

/// The Docker label filter selecting everything `deployment` labelled
/// (containers, networks, volumes, their events).
pub(crate) fn deployment_filter(deployment: &Deployment) -> String {
    format!("{DEPLOYMENT}={deployment}")
}

/// Docker label filters selecting one deployment's containers, optionally
/// one sandbox's.
pub(crate) fn filters(deployment: &Deployment, sandbox: Option<&SandboxId>) -> Vec<String> {
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
            state_id: Some("5f0c7e3a-9b1d-4c2e-8f00-1a2b3c4d5e6f".into()),
            incarnation: Some("0a0b0c0d-0000-4000-8000-000000000001".into()),
            isolation: Isolation::Gvisor,
            seed: SeedHash::parse(&format!("sha256:{}", "ab".repeat(32))),
        };
        let map = l.to_map();
        assert_eq!(map[FEATURES], "citext,pg_trgm");
        assert_eq!(map[ISOLATION], "gvisor");
        assert_eq!(map[SEED], format!("sha256:{}", "ab".repeat(32)));
        assert_eq!(ContainerLabels::parse(&map), Some(l.clone()));

        let volume = l.of_volume();
        assert_eq!(volume[STATE_ID], "5f0c7e3a-9b1d-4c2e-8f00-1a2b3c4d5e6f");
        assert_eq!(volume[INCARNATION], "0a0b0c0d-0000-4000-8000-000000000001");
        assert_eq!(volume[SANDBOX], "agent-1");
        assert!(!volume.contains_key(INSTANCE));
    }

    #[test]
    fn containers_from_before_identities_read_back_without_them() {
        let l = ContainerLabels {
            deployment: Deployment::parse("prod").unwrap(),
            sandbox: SandboxId::parse("agent-1").unwrap(),
            owner: "ci".into(),
            engine: "redis".into(),
            generation: 1,
            features: BTreeSet::new(),
            instance: "0123abcd".into(),
            state_id: None,
            incarnation: None,
            isolation: Isolation::Container,
            seed: None,
        };
        let mut map = l.to_map();
        assert!(!map.contains_key(STATE_ID) && !map.contains_key(INCARNATION));
        assert_eq!(ContainerLabels::parse(&map), Some(l.clone()));
        // Made before isolation levels: the default runtime's.
        map.remove(ISOLATION);
        assert_eq!(ContainerLabels::parse(&map), Some(l));
    }

    #[test]
    fn containers_not_managed_by_sandboxd_are_not_parsed() {
        let mut map = HashMap::new();
        map.insert(SANDBOX.to_owned(), "agent-1".to_owned());
        assert_eq!(ContainerLabels::parse(&map), None);
    }
}
