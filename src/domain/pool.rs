//! The warm pool's pure parts: what a pool container is, how many a refill
//! may start, whether a provision may claim one, and which sandbox a
//! claimed pool container serves (Docker labels cannot change, so a claim
//! is recorded in the state database and read back from there).

pub(crate) mod demand;

use super::container::{ContainerState, ObservedContainer};
use super::id::{ContainerId, Deployment, EngineName, SandboxId};
use super::isolation::Isolation;
use super::labels::ContainerLabels;
use super::plan::ProvisionReason;
use super::seed::SeedHash;
use chrono::{DateTime, Utc};
use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

/// Marks a warm-pool container (value `1`). Pool containers carry no
/// sandbox label, so everything that reads sandbox containers skips them.
pub const POOL: &str = "io.sandboxd.pool";

/// One pool: an engine, a feature set and a seed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolKey {
    /// The engine.
    pub engine: EngineName,
    /// Its features, sorted.
    pub features: BTreeSet<String>,
    /// The seed its containers' data starts from (`None`: empty); only a
    /// pool learned from demand has one.
    pub seed: Option<SeedHash>,
}

impl std::fmt::Display for PoolKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.engine.as_str())?;
        if !self.features.is_empty() {
            let features: Vec<&str> = self.features.iter().map(String::as_str).collect();
            write!(f, ":{}", features.join(","))?;
        }
        if let Some(seed) = &self.seed {
            write!(f, "@{}", seed.short())?;
        }
        Ok(())
    }
}

/// A pool container as the runtime lists it.
#[derive(Debug, Clone)]
pub struct PooledContainer {
    /// Container id.
    pub id: ContainerId,
    /// Container name (changes when it is claimed).
    pub name: String,
    /// Its deployment.
    pub deployment: Deployment,
    /// Engine name, from its labels.
    pub engine: String,
    /// Features enabled in it, from its labels.
    pub features: BTreeSet<String>,
    /// The state database identity that created it.
    pub state_id: Option<String>,
    /// The token naming the pool container (its labels'; a claim gets a new one).
    pub instance: String,
    /// Its state.
    pub state: ContainerState,
    /// Frozen (`docker pause`): a claimed container of a paused sandbox.
    pub paused: bool,
    /// When the runtime created it.
    pub created: DateTime<Utc>,
    /// Its loopback host port.
    pub host_port: Option<u16>,
    /// The networks it is on, by name, as the list saw them.
    pub networks: Vec<String>,
    /// The isolation level it runs under, from its labels (a pool's
    /// containers run under the controller's `--runtime`).
    pub isolation: Isolation,
}

/// What a runtime saw of a container or service besides its labels.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    /// Its id.
    pub(crate) id: ContainerId,
    /// Its name (sandboxd's, which a claim changes).
    pub(crate) name: String,
    /// Its state.
    pub(crate) state: ContainerState,
    /// Frozen (`docker pause`).
    pub(crate) paused: bool,
    /// When the runtime created it.
    pub(crate) created: DateTime<Utc>,
    /// Its loopback host port.
    pub(crate) host_port: Option<u16>,
    /// The networks it is on, by sandboxd's names.
    pub(crate) networks: Vec<String>,
}

impl PooledContainer {
    /// `deployment`'s pool container as its `labels` say, with what the
    /// runtime `seen` of it; `None` for anything else.
    pub(crate) fn from_labels(
        labels: &HashMap<String, String>,
        deployment: &Deployment,
        seen: Seen,
    ) -> Option<Self> {
        use super::labels as l;
        if labels.get(POOL).map(String::as_str) != Some("1") || !l::belongs_to(labels, deployment) {
            return None;
        }
        Some(Self {
            id: seen.id,
            name: seen.name,
            deployment: deployment.clone(),
            engine: labels.get(l::ENGINE)?.clone(),
            features: labels
                .get(l::FEATURES)
                .map(|f| l::features(f))
                .unwrap_or_default(),
            state_id: labels.get(l::STATE_ID).cloned(),
            instance: labels.get(l::INSTANCE).cloned().unwrap_or_default(),
            state: seen.state,
            paused: seen.paused,
            created: seen.created,
            host_port: seen.host_port,
            networks: seen.networks,
            isolation: Isolation::of_label(labels.get(l::ISOLATION).map(String::as_str)),
        })
    }
}

/// A claimed pool container: the sandbox it serves now (recorded in the
/// state database before the container was changed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolClaim {
    /// The container.
    pub container: ContainerId,
    /// The sandbox that claimed it.
    pub sandbox: SandboxId,
    /// Engine name.
    pub engine: String,
    /// The row's generation at the claim.
    pub generation: i64,
    /// The row's incarnation.
    pub incarnation: Option<String>,
    /// The row's owner.
    pub owner: String,
    /// Features enabled in the container.
    pub features: BTreeSet<String>,
    /// The new instance token (published once the claim finished).
    pub instance: String,
    /// The seed its data started from.
    pub seed: Option<SeedHash>,
}

/// The claimed pool containers among `listed`, each as the sandbox
/// container its claim makes it (see [`PoolClaim::observed`]), and the
/// claims whose container is no longer listed (removed: torn down,
/// replaced, or by hand). The one join of claims and pool containers:
/// the controller's and the chaos run's view of a sandbox's containers
/// both come from it.
pub(crate) fn claimed<'a>(
    claims: impl IntoIterator<Item = &'a PoolClaim>,
    listed: &[PooledContainer],
) -> (Vec<ObservedContainer>, Vec<&'a PoolClaim>) {
    let mut seen = Vec::new();
    let mut gone = Vec::new();
    for claim in claims {
        match listed.iter().find(|l| l.id == claim.container) {
            Some(l) => seen.push(claim.observed(l)),
            None => gone.push(claim),
        }
    }
    (seen, gone)
}

impl PoolClaim {
    /// The claimed container as the planner sees a sandbox container: the
    /// labels it would carry had it been created for the sandbox.
    pub(crate) fn observed(&self, listed: &PooledContainer) -> ObservedContainer {
        ObservedContainer {
            id: listed.id.clone(),
            name: listed.name.clone(),
            labels: self.labels(
                &listed.deployment,
                listed.state_id.clone(),
                listed.isolation,
            ),
            state: listed.state,
            created: listed.created,
            host_port: listed.host_port,
            networks: listed.networks.clone(),
            paused: listed.paused,
        }
    }
}

impl PoolClaim {
    /// The labels the claimed container would carry had it been created
    /// for the sandbox, by `deployment` under `isolation` for the state
    /// database `state_id` (as the pool container's own labels say).
    pub(crate) fn labels(
        &self,
        deployment: &Deployment,
        state_id: Option<String>,
        isolation: Isolation,
    ) -> ContainerLabels {
        ContainerLabels {
            deployment: deployment.clone(),
            sandbox: self.sandbox.clone(),
            owner: self.owner.clone(),
            engine: self.engine.clone(),
            generation: self.generation,
            features: self.features.clone(),
            instance: self.instance.clone(),
            state_id,
            incarnation: self.incarnation.clone(),
            isolation,
            seed: self.seed.clone(),
        }
    }
}

/// Which kind of provision claims from the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum ClaimKind {
    /// A new sandbox (or a replacement): fresh credentials.
    Create,
    /// A heal: the sandbox's existing credentials.
    Heal,
}

impl ClaimKind {
    /// Every kind, for metrics.
    pub(crate) const ALL: [ClaimKind; 2] = [ClaimKind::Create, ClaimKind::Heal];

    /// Label value for metrics.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ClaimKind::Create => "create",
            ClaimKind::Heal => "heal",
        }
    }
}

/// Whether a provision may claim from the pool, and as which kind: creates,
/// replacements and heals may; a rotation (it builds next to the running
/// container and switches), a sandbox with data of its own (`own_data`: a
/// persistent sandbox's volume, a fork's copy, which a pool container does
/// not have) and a sandbox whose isolation
/// level is not the pool's (`same_isolation` false: a pool runs under the
/// controller's `--runtime`, and a container cannot change its runtime)
/// never do.
pub(crate) fn claim_kind(
    reason: ProvisionReason,
    own_data: bool,
    rotating: bool,
    same_isolation: bool,
) -> Option<ClaimKind> {
    if own_data || rotating || !same_isolation {
        return None;
    }
    match reason {
        ProvisionReason::Create | ProvisionReason::Replace => Some(ClaimKind::Create),
        ProvisionReason::Heal => Some(ClaimKind::Heal),
        ProvisionReason::Rotate => None,
    }
}

/// How many pool containers one reconcile may claim for a sandbox: any
/// number where a running container can join the sandbox's network
/// (`rejoins`); otherwise (a Swarm task) one, and only for a sandbox that
/// `adopts` the claimed one's network, or none.
pub(crate) fn claims_at_most(rejoins: bool, adopts: bool) -> usize {
    match (rejoins, adopts) {
        (true, _) => usize::MAX,
        (false, true) => 1,
        (false, false) => 0,
    }
}

/// How many pool containers a refill starts now: up to `size` counting
/// those `ready` and those being `creating`, and at most `at_once` being
/// created at a time; none while `busy` (requests wait for a worker).
pub(crate) fn to_start(
    size: usize,
    ready: usize,
    creating: usize,
    at_once: usize,
    busy: bool,
) -> usize {
    if busy {
        return 0;
    }
    let missing = size.saturating_sub(ready + creating);
    missing.min(at_once.saturating_sub(creating))
}

/// Which sandbox each claimed pool container serves, for the event
/// watcher (a pool container's events carry no sandbox label).
#[derive(Debug, Default)]
pub struct ClaimIndex(Mutex<HashMap<ContainerId, SandboxId>>);

impl ClaimIndex {
    /// Records that `container` serves `sandbox`.
    pub fn insert(&self, container: ContainerId, sandbox: SandboxId) {
        self.0.lock().unwrap().insert(container, sandbox);
    }
    /// Forgets `container`.
    pub fn remove(&self, container: &ContainerId) {
        self.0.lock().unwrap().remove(container);
    }
    /// Replaces everything (a new term reads the claims back).
    pub fn replace(&self, claims: &[PoolClaim]) {
        let mut map = self.0.lock().unwrap();
        map.clear();
        map.extend(
            claims
                .iter()
                .map(|c| (c.container.clone(), c.sandbox.clone())),
        );
    }
    /// The sandbox `container` serves, if it is a claimed pool container.
    pub(crate) fn sandbox_of(&self, container: &ContainerId) -> Option<SandboxId> {
        self.0.lock().unwrap().get(container).cloned()
    }
    /// Whether any claimed container serves `sandbox`.
    pub fn serves(&self, sandbox: &SandboxId) -> bool {
        self.0.lock().unwrap().values().any(|s| s == sandbox)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claimed_pool_container_is_its_sandboxs_and_a_claim_without_a_container_is_gone() {
        let dep = Deployment::parse("sbx").unwrap();
        let listed = |id: &str| PooledContainer {
            id: ContainerId::new(id),
            name: format!("sandboxd.sbx.s1.postgres-{id}"),
            deployment: dep.clone(),
            engine: "postgres".into(),
            features: BTreeSet::new(),
            state_id: Some("state".into()),
            instance: "pool-token".into(),
            state: ContainerState::Running,
            paused: true,
            created: DateTime::<Utc>::UNIX_EPOCH,
            host_port: Some(5000),
            networks: vec!["n".into()],
            isolation: Isolation::Container,
        };
        let claim = |container: &str| PoolClaim {
            container: ContainerId::new(container),
            sandbox: SandboxId::parse("s1").unwrap(),
            engine: "postgres".into(),
            generation: 3,
            incarnation: Some("inc".into()),
            owner: "alice".into(),
            features: BTreeSet::new(),
            instance: "claim-token".into(),
            seed: None,
        };
        let claims = [claim("c1"), claim("c2")];
        let (seen, gone) = claimed(&claims, &[listed("c1"), listed("c3")]);
        assert_eq!(seen.len(), 1, "the unclaimed c3 is nobody's");
        let c = &seen[0];
        assert_eq!(c.id, ContainerId::new("c1"));
        assert_eq!(c.labels.sandbox.as_str(), "s1");
        assert_eq!(c.labels.owner, "alice");
        assert_eq!(c.labels.incarnation.as_deref(), Some("inc"));
        assert_eq!(
            c.labels.instance, "claim-token",
            "the claim's token, not the pool's"
        );
        assert_eq!(c.labels.state_id.as_deref(), Some("state"));
        assert!(c.paused, "what the runtime saw is kept");
        assert_eq!(gone, [&claims[1]]);
    }

    #[test]
    fn where_containers_cannot_join_a_network_only_an_adopting_sandbox_claims_and_once() {
        for (rejoins, adopts, at_most) in [
            (true, true, usize::MAX),
            (true, false, usize::MAX),
            (false, true, 1),
            (false, false, 0),
        ] {
            assert_eq!(
                claims_at_most(rejoins, adopts),
                at_most,
                "rejoins {rejoins}, adopts {adopts}"
            );
        }
    }

    #[test]
    fn a_refill_never_goes_above_the_size_counting_containers_being_created() {
        assert_eq!(to_start(2, 0, 0, 2, false), 2);
        assert_eq!(to_start(2, 1, 0, 2, false), 1);
        assert_eq!(to_start(2, 1, 1, 2, false), 0);
        assert_eq!(to_start(2, 2, 0, 2, false), 0);
        assert_eq!(to_start(2, 3, 0, 2, false), 0);
        assert_eq!(to_start(1, 0, 1, 2, false), 0);
    }

    #[test]
    fn a_refill_starts_at_most_a_few_at_a_time() {
        assert_eq!(to_start(10, 0, 0, 2, false), 2);
        assert_eq!(to_start(10, 0, 1, 2, false), 1);
        assert_eq!(to_start(10, 0, 2, 2, false), 0);
    }

    #[test]
    fn a_refill_waits_while_requests_wait_for_a_worker() {
        assert_eq!(to_start(2, 0, 0, 2, true), 0);
    }

    #[test]
    fn creates_and_heals_claim_but_rotations_and_persistent_sandboxes_never_do() {
        use ProvisionReason::*;
        assert_eq!(
            claim_kind(Create, false, false, true),
            Some(ClaimKind::Create)
        );
        assert_eq!(
            claim_kind(Replace, false, false, true),
            Some(ClaimKind::Create)
        );
        assert_eq!(claim_kind(Heal, false, false, true), Some(ClaimKind::Heal));
        assert_eq!(claim_kind(Rotate, false, false, true), None);
        assert_eq!(claim_kind(Create, true, false, true), None);
        assert_eq!(claim_kind(Heal, true, false, true), None);
        assert_eq!(claim_kind(Create, false, true, true), None);
    }

    #[test]
    fn a_sandbox_under_another_isolation_level_than_the_pool_s_never_claims() {
        use ProvisionReason::*;
        // A gVisor sandbox must never be served a runc pool container
        // (nor the other way round): its level is fixed at the create.
        for reason in [Create, Replace, Heal, Rotate] {
            assert_eq!(claim_kind(reason, false, false, false), None, "{reason:?}");
        }
    }

    #[test]
    fn a_claimed_container_is_seen_as_its_sandbox_s() {
        let listed = PooledContainer {
            id: ContainerId::new("c1"),
            name: "sandboxd.prod.agent-1.postgres".into(),
            deployment: Deployment::parse("prod").unwrap(),
            engine: "postgres".into(),
            features: BTreeSet::new(),
            state_id: Some("s".into()),
            instance: "pool".into(),
            state: ContainerState::Running,
            created: Utc::now(),
            host_port: Some(5000),
            networks: Vec::new(),
            paused: false,
            isolation: Isolation::Gvisor,
        };
        let claim = PoolClaim {
            container: listed.id.clone(),
            sandbox: SandboxId::parse("agent-1").unwrap(),
            engine: "postgres".into(),
            generation: 3,
            incarnation: Some("i".into()),
            owner: "ci".into(),
            features: BTreeSet::new(),
            instance: "claimed".into(),
            seed: None,
        };
        let seen = claim.observed(&listed);
        assert_eq!(seen.labels.sandbox.as_str(), "agent-1");
        assert_eq!(seen.labels.instance, "claimed");
        assert_eq!(seen.labels.generation, 3);
        assert_eq!(seen.labels.state_id.as_deref(), Some("s"));
        assert_eq!(seen.labels.isolation, Isolation::Gvisor);
        let index = ClaimIndex::default();
        index.replace(std::slice::from_ref(&claim));
        assert_eq!(index.sandbox_of(&listed.id), Some(claim.sandbox.clone()));
        assert!(index.serves(&claim.sandbox));
        index.remove(&listed.id);
        assert_eq!(index.sandbox_of(&listed.id), None);
    }
}
