//! The rows of the orchestrator contract: what is desired and what was
//! observed.

use super::fork::ForkOf;
use super::id::Incarnation;
use super::id::{EngineName, SandboxId};
use super::isolation::Isolation;
use super::secret::Secret;
use super::seed::SeedHash;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

/// One row of `sandbox_desired`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredSandbox {
    /// The sandbox key.
    pub id: SandboxId,
    /// Who asked.
    pub owner: String,
    /// Engines wanted that this binary knows, in row order.
    pub services: Vec<EngineName>,
    /// Engines the row names that this binary does not know (the database
    /// refuses them, so only a row written for a newer sandboxd has any):
    /// the sandbox is `failed` with a message, their containers are kept.
    pub(crate) unknown_services: Vec<String>,
    /// Features per engine.
    pub features: BTreeMap<EngineName, BTreeSet<String>>,
    /// Names of containers (the orchestrator's agents) to connect to the
    /// sandbox's network; disconnected at teardown.
    pub attach: Vec<String>,
    /// Why the row cannot be used as it is stored (it got past the
    /// database's checks, e.g. with triggers disabled): the sandbox is
    /// `failed` with this reason and its containers are kept untouched.
    pub invalid: Option<String>,
    /// Past it the sandbox is no longer desired.
    pub expires_at: Option<DateTime<Utc>>,
    /// When the sandbox was last requested or touched.
    pub last_used_at: DateTime<Utc>,
    /// The row's idle timeout: `None` for the controller's default,
    /// `Some(Duration::ZERO)` for never.
    pub idle_timeout: Option<Duration>,
    /// Data on a named volume that outlives heals and restarts; never
    /// released for idleness or expiry; removed with the row.
    pub persistent: bool,
    /// What happens once the sandbox is idle: released, or paused.
    pub idle_action: IdleAction,
    /// The agent's container: once it is gone the sandbox is released.
    pub owner_container: Option<String>,
    /// The isolation level the row asks for (`None`: the controller's
    /// `--runtime`); see [`DesiredSandbox::isolation_under`].
    pub isolation: Option<Isolation>,
    /// The seed each engine starts with (`seeds`; an engine without one
    /// starts empty).
    pub seeds: BTreeMap<EngineName, SeedHash>,
    /// The sandbox whose data this one's engines start with (`fork_of`).
    pub fork_of: Option<ForkOf>,
    /// Bumped by the database on every change.
    pub generation: i64,
    /// Which incarnation of the id this row is (set by the database on
    /// insert, kept while the row exists); `None` only when the stored
    /// value cannot be read (the row is then `invalid`).
    pub incarnation: Option<Incarnation>,
    /// When the row last changed (set by the database).
    pub updated_at: DateTime<Utc>,
    /// When the row was inserted (set by the database): its place in
    /// admission's arrival order (`domain::admission`).
    pub(crate) created_at: DateTime<Utc>,
}

impl DesiredSandbox {
    /// Whether its engines start from data of their own (a persistent
    /// sandbox's volume, a fork's copy of its source's), never from a
    /// warm-pool container.
    pub(crate) fn own_data(&self) -> bool {
        self.persistent || self.fork_of.is_some()
    }

    /// Features requested for `engine` (empty if none).
    pub(crate) fn features_for(&self, engine: EngineName) -> BTreeSet<String> {
        self.features.get(&engine).cloned().unwrap_or_default()
    }

    /// The seed `engine` starts with, if the row names one.
    pub(crate) fn seed_for(&self, engine: EngineName) -> Option<&SeedHash> {
        self.seeds.get(&engine)
    }

    /// The isolation level the sandbox's containers run under, given the
    /// controller's `floor` (`--runtime`): the stronger of the two.
    pub(crate) fn isolation_under(&self, floor: Isolation) -> Isolation {
        Isolation::effective(self.isolation, floor)
    }

    /// Whether the row asks for the engine called `name`, known or not.
    pub(crate) fn wants(&self, name: &str) -> bool {
        self.services.iter().any(|e| e.as_str() == name)
            || self.unknown_services.iter().any(|e| e == name)
    }

    /// When the row expires: `expires_at`, unless the sandbox is
    /// persistent (it never expires).
    pub(crate) fn expiry(&self) -> Option<DateTime<Utc>> {
        self.expires_at.filter(|_| !self.persistent)
    }

    /// Whether the row is past its [`expiry`](Self::expiry) at `now`.
    #[cfg(test)]
    pub(crate) fn is_expired(&self, now: DateTime<Utc>) -> bool {
        self.expiry().is_some_and(|t| t <= now)
    }

    /// When the sandbox becomes idle, given the controller's default
    /// timeout: `None` if it never does (no timeout, or a zero one, or a
    /// persistent sandbox that would be released: only pausing keeps its
    /// data).
    pub(crate) fn idle_at(&self, default_timeout: Option<Duration>) -> Option<DateTime<Utc>> {
        let timeout = self.idle_timeout.or(default_timeout)?;
        if (self.persistent && self.idle_action == IdleAction::Release) || timeout.is_zero() {
            return None;
        }
        let timeout = chrono::Duration::from_std(timeout).ok()?;
        self.last_used_at.checked_add_signed(timeout)
    }
}

/// What an idle sandbox becomes (`sandbox_desired.idle_action`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum IdleAction {
    /// Torn down, status `terminating` (the default).
    #[default]
    Release,
    /// Its containers frozen (`docker pause`), status `paused`; a request,
    /// a touch or `sandboxd resume` thaws them with their data.
    Pause,
}

impl IdleAction {
    /// The text stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            IdleAction::Release => "release",
            IdleAction::Pause => "pause",
        }
    }

    /// Parses the stored text.
    pub fn parse(s: &str) -> Option<Self> {
        [IdleAction::Release, IdleAction::Pause]
            .into_iter()
            .find(|a| a.as_str() == s)
    }
}

impl fmt::Display for IdleAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Lifecycle phase in `sandbox_status.phase`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Seen, nothing done yet.
    Pending,
    /// Containers are being created or re-created.
    Provisioning,
    /// An engine that was ready died and is being re-created with the same
    /// credentials (its data is lost unless the sandbox is persistent);
    /// `message` names the engine and the cause.
    Healing,
    /// Every requested engine answers with the published credentials.
    Ready,
    /// The last attempt failed; `message` says why. Retried with backoff.
    Failed,
    /// No longer desired; containers are being torn down.
    Terminating,
    /// Idle, and the row asks to pause rather than release: every engine
    /// container is frozen with its data and credentials; a request, a
    /// touch or `sandboxd resume` makes it `ready` again.
    Paused,
}

impl Phase {
    /// Every phase, for metrics.
    pub const ALL: [Phase; 7] = [
        Phase::Pending,
        Phase::Provisioning,
        Phase::Healing,
        Phase::Ready,
        Phase::Failed,
        Phase::Terminating,
        Phase::Paused,
    ];

    /// The text stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "pending",
            Phase::Provisioning => "provisioning",
            Phase::Healing => "healing",
            Phase::Ready => "ready",
            Phase::Failed => "failed",
            Phase::Terminating => "terminating",
            Phase::Paused => "paused",
        }
    }

    /// Parses the stored text.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == s)
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `sandbox_status.services`: each engine's endpoints and credentials, by
/// engine name. The entries are boxed: a B-tree node holds room for eleven
/// of them inline, so a map of one engine would otherwise take 2.6 KB, and
/// a relist holds one map per sandbox of the fleet.
pub(crate) type Services = BTreeMap<String, Box<ServiceStatus>>;

/// One engine's entry in `sandbox_status.services`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceStatus {
    /// Host name for clients on the sandbox's Docker network.
    pub host: String,
    /// Port for clients on the sandbox's Docker network.
    pub port: u16,
    /// Port published on 127.0.0.1 for clients on the Docker host.
    pub host_port: u16,
    /// User name.
    pub user: String,
    /// Password.
    pub password: Secret,
    /// Database name (Redis: logical db number).
    pub database: String,
    /// Connection URL for clients on the Docker network.
    pub url: String,
    /// Environment variables for an agent's test suite.
    pub env: BTreeMap<String, String>,
    /// Extensions or modules present in the engine.
    pub available_extensions: Vec<String>,
    /// Token of the container these credentials were published for, equal
    /// to its `io.sandboxd.instance` label (not derived from the credentials).
    #[serde(default)]
    pub instance: String,
    /// When the running container became ready: its data is as old as this
    /// (tmpfs data does not survive a heal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_at: Option<DateTime<Utc>>,
    /// How many times this engine was healed with these credentials (each
    /// heal of a non-persistent sandbox starts with empty data).
    #[serde(default)]
    pub heals: u32,
    /// The image the running container was created from (empty: published
    /// by a sandboxd that did not record it).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
    /// The Swarm node the engine's task runs on, by host name (under
    /// `--backend swarm`: where `host_port` is published, and where a
    /// persistent sandbox's data is); absent on one host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The seed the engine's data started from (its hash); absent: empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<SeedHash>,
}

impl ServiceStatus {
    /// This entry without its secrets: `password`, `url` and `env` empty
    /// (see [`SandboxStatus::redacted`]).
    pub fn redacted(&self) -> Self {
        ServiceStatus {
            host: self.host.clone(),
            port: self.port,
            host_port: self.host_port,
            user: self.user.clone(),
            password: Secret::new(String::new()),
            database: self.database.clone(),
            url: String::new(),
            env: BTreeMap::new(),
            available_extensions: self.available_extensions.clone(),
            instance: self.instance.clone(),
            ready_at: self.ready_at,
            heals: self.heals,
            image: self.image.clone(),
            node: self.node.clone(),
            seed: self.seed.clone(),
        }
    }

    /// What a client connected with `self` would need anew to use
    /// `after` (a heal promises none): the fields that differ, named, not
    /// shown, since they hold the password.
    pub fn connection_changes(&self, after: &ServiceStatus) -> Vec<&'static str> {
        [
            ("host", self.host == after.host),
            ("port", self.port == after.port),
            ("host_port", self.host_port == after.host_port),
            ("user", self.user == after.user),
            (
                "password",
                self.password.expose() == after.password.expose(),
            ),
            ("database", self.database == after.database),
            ("url", self.url == after.url),
            ("env", self.env == after.env),
        ]
        .into_iter()
        .filter(|(_, same)| !same)
        .map(|(name, _)| name)
        .collect()
    }

    /// [`connection_changes`](Self::connection_changes) but for
    /// `host_port`: what a client on the sandbox's network, or one that
    /// reads the status again, would lose. A heal served by the warm pool
    /// keeps every one of these but moves `host_port` (Docker binds a
    /// container's ports when it is created, and the pool's container was
    /// created before the heal); a heal that re-creates the container keeps
    /// that too.
    pub fn credential_changes(&self, after: &ServiceStatus) -> Vec<&'static str> {
        let mut changed = self.connection_changes(after);
        changed.retain(|field| *field != "host_port");
        changed
    }
}

impl fmt::Debug for ServiceStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceStatus")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("host_port", &self.host_port)
            .field("user", &self.user)
            .field("database", &self.database)
            .field("available_extensions", &self.available_extensions)
            .field("ready_at", &self.ready_at)
            .field("heals", &self.heals)
            .field("image", &self.image)
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

/// One row of `sandbox_status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxStatus {
    /// The sandbox key.
    pub id: SandboxId,
    /// Lifecycle phase.
    pub phase: Phase,
    /// The desired generation this status reflects.
    pub observed_generation: i64,
    /// Why the phase is what it is (empty when ready).
    pub message: String,
    /// Per-engine endpoints and credentials.
    pub services: Services,
    /// The Docker network the sandbox's engines are reachable on.
    pub network: Option<String>,
    /// Last write.
    pub updated_at: Option<DateTime<Utc>>,
    /// The incarnation of the row this status is about (`None`: written
    /// before incarnations, or for no row); a client waiting for its row
    /// accepts only a status of the row's incarnation.
    pub incarnation: Option<Incarnation>,
}

impl SandboxStatus {
    /// This row without its secrets: every engine's entry
    /// [`ServiceStatus::redacted`] (what
    /// [`crate::ports::store::Store::list_status_redacted`] gives).
    pub fn redacted(&self) -> Self {
        SandboxStatus {
            id: self.id.clone(),
            phase: self.phase,
            observed_generation: self.observed_generation,
            message: self.message.clone(),
            services: self
                .services
                .iter()
                .map(|(engine, entry)| (engine.clone(), Box::new(entry.redacted())))
                .collect(),
            network: self.network.clone(),
            updated_at: self.updated_at,
            incarnation: self.incarnation.clone(),
        }
    }
}
