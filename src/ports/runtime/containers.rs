//! Sandbox containers: made and started, found, claimed from the pool,
//! reached, frozen and thawed, removed; and the stream of their events.

use super::{RuntimeError, Volume};
use crate::domain::container::{ObservedContainer, RunState};
use crate::domain::id::{ContainerId, Deployment, SandboxId};
use crate::domain::limits::Limits;
use crate::domain::pool::PooledContainer;
use crate::domain::secret::Secret;
use async_trait::async_trait;
use futures::stream::BoxStream;
use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

/// A tmpfs mount: `noexec,nosuid,nodev`, owned by the container's user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tmpfs {
    /// Mount point.
    pub path: String,
    /// Size cap in bytes (it counts against the memory limit too).
    pub bytes: i64,
}

/// Everything needed to create one sandbox container.
#[derive(Debug, Clone)]
pub struct ContainerSpec {
    /// Container name.
    pub name: String,
    /// Image reference.
    pub image: String,
    /// Environment: never a credential (see [`ContainerSpec::stdin`]).
    pub env: Vec<String>,
    /// Arguments; empty keeps the image's default command. Never a credential.
    pub cmd: Vec<String>,
    /// Replaces the image's entrypoint when set.
    pub entrypoint: Option<Vec<String>>,
    /// Labels (never credentials).
    pub labels: HashMap<String, String>,
    /// Engine port inside the container.
    pub port: u16,
    /// Host port to publish on 127.0.0.1; `None` lets the runtime choose.
    pub host_port: Option<u16>,
    /// Network to attach to.
    pub network: String,
    /// Further names the container answers to on `network`.
    pub aliases: Vec<String>,
    /// `uid:gid` the container runs as from its first instruction.
    pub user: String,
    /// Resource and security limits.
    pub limits: Limits,
    /// tmpfs mounts: data (unless on [`ContainerSpec::volume`]), `/tmp`
    /// and runtime directories (the root filesystem is read-only).
    pub tmpfs: Vec<Tmpfs>,
    /// The data directory of a persistent sandbox.
    pub volume: Option<Volume>,
    /// A pre-initialised template mounted read-only (see
    /// [`TemplateJob`](super::TemplateJob)); it must exist, or the container is not created.
    pub template: Option<Volume>,
    /// Data the engine starts from (the images' `SANDBOXD_TEMPLATE=use`):
    /// a fork's copy of its source's data (see [`Helper`](super::Helper)) or a seed's data
    /// file (see [`VolumeFill`](super::VolumeFill)), mounted read-only; it must exist and
    /// carry the labels asked for, or the container is not created.
    pub start_from: Option<Volume>,
    /// The image's binaries, copied into a volume by the template job and
    /// mounted read-only over their place in the image (see
    /// [`TemplateJob::binaries`](super::TemplateJob::binaries)); it must exist,
    /// or the container is not created.
    pub binaries: Option<Volume>,
    /// Written to the container's standard input once it has started, then
    /// closed: the only way credentials reach a container.
    pub stdin: Option<Secret>,
    /// A label (`key=value`) the image must carry, or the container is not
    /// created: an image that does not read its secrets from standard input
    /// would otherwise start without a password.
    pub image_label: Option<String>,
    /// The OCI runtime the daemon runs the container under (`runsc`:
    /// gVisor; see [`crate::domain::isolation`]); `None`: the daemon's
    /// default. A runtime that cannot choose refuses any.
    pub runtime: Option<String>,
}

/// Container events that may mean a sandbox needs attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ContainerAction {
    /// Created.
    Create,
    /// Started.
    Start,
    /// Its main process ended.
    Die,
    /// The kernel killed it for memory.
    Oom,
    /// Sent a signal.
    Kill,
    /// Stopped.
    Stop,
    /// Removed.
    Destroy,
    /// Its health check changed.
    HealthStatus,
}

impl ContainerAction {
    /// The order from outside this action reports, if it is one (see
    /// [`crate::domain::death`]).
    pub fn order(self) -> Option<crate::domain::death::Order> {
        use crate::domain::death::Order;
        match self {
            ContainerAction::Kill => Some(Order::Kill),
            ContainerAction::Stop => Some(Order::Stop),
            ContainerAction::Destroy => Some(Order::Destroy),
            _ => None,
        }
    }

    /// Every action sandboxd watches for.
    pub const ALL: [ContainerAction; 8] = [
        ContainerAction::Create,
        ContainerAction::Start,
        ContainerAction::Die,
        ContainerAction::Oom,
        ContainerAction::Kill,
        ContainerAction::Stop,
        ContainerAction::Destroy,
        ContainerAction::HealthStatus,
    ];

    /// The name Docker gives the action (and the metrics label).
    pub fn as_str(self) -> &'static str {
        match self {
            ContainerAction::Create => "create",
            ContainerAction::Start => "start",
            ContainerAction::Die => "die",
            ContainerAction::Oom => "oom",
            ContainerAction::Kill => "kill",
            ContainerAction::Stop => "stop",
            ContainerAction::Destroy => "destroy",
            ContainerAction::HealthStatus => "health_status",
        }
    }

    /// Parses Docker's action text; `health_status: healthy` carries the
    /// status after a colon.
    pub fn parse(action: &str) -> Option<Self> {
        let action = action.split(':').next().unwrap_or_default();
        Self::ALL.into_iter().find(|a| a.as_str() == action)
    }

    /// Whether the container list may show this action's effect late
    /// (Docker reports `die` before its list shows the container exited).
    pub fn settles_late(self) -> bool {
        matches!(
            self,
            ContainerAction::Die
                | ContainerAction::Kill
                | ContainerAction::Stop
                | ContainerAction::Oom
                | ContainerAction::Destroy
        )
    }
}

impl fmt::Display for ContainerAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One container event of this deployment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeEvent {
    /// The container.
    pub container: ContainerId,
    /// What happened.
    pub action: ContainerAction,
    /// The sandbox its labels name, if valid.
    pub sandbox: Option<SandboxId>,
    /// When, in seconds since the epoch (for replay after a reconnect).
    pub time: Option<i64>,
}

/// A stream of runtime events; it ends (or yields an error) when the
/// connection drops.
pub type EventStream = BoxStream<'static, Result<RuntimeEvent, RuntimeError>>;

/// The runtime's containers (sandbox engines and the pool's).
#[async_trait]
pub trait Containers: Send + Sync {
    /// The containers of `deployment` (optionally one sandbox's), stopped
    /// ones included; containers with malformed labels are skipped.
    async fn list(
        &self,
        deployment: &Deployment,
        sandbox: Option<&SandboxId>,
    ) -> Result<Vec<ObservedContainer>, RuntimeError>;
    /// Removes any container called `spec.name` (refusing if its labels say
    /// it belongs to another sandbox or deployment), creates `spec.volume`
    /// if it is missing (refusing one another deployment created), then
    /// creates and starts the container and writes `spec.stdin` to it.
    async fn create_and_start(&self, spec: &ContainerSpec) -> Result<ContainerId, RuntimeError>;
    /// Renames the sandboxd container `id` to `name`; fails if another
    /// container is called `name`.
    async fn rename(&self, id: &ContainerId, name: &str) -> Result<(), RuntimeError>;
    /// Makes the claimed pool container `id` its sandbox's: called `name`
    /// and, where the runtime can change them, carrying the sandbox's
    /// `labels` (a Swarm service's; a container's labels cannot change, and
    /// the claim recorded in the state database says whose it is). Fails
    /// as [`Containers::rename`] does.
    async fn claim_as(
        &self,
        id: &ContainerId,
        name: &str,
        _labels: &HashMap<String, String>,
    ) -> Result<(), RuntimeError> {
        self.rename(id, name).await
    }
    /// The host port published for the container's engine port.
    async fn published_port(&self, id: &ContainerId) -> Result<Option<u16>, RuntimeError>;
    /// Where sandboxd reaches that port when it is not 127.0.0.1: the
    /// address of the Swarm node that runs the task. Containers on this
    /// host: `None`.
    async fn published_host(&self, _id: &ContainerId) -> Result<Option<String>, RuntimeError> {
        Ok(None)
    }
    /// The host name of the Swarm node that runs the container `id`'s
    /// task (published in its status, see `ServiceStatus::node`).
    /// Containers on this host: `None`.
    async fn node_of(&self, _id: &ContainerId) -> Result<Option<String>, RuntimeError> {
        Ok(None)
    }
    /// The host name sandboxd reaches the engine of the container `id`
    /// (called `name`) by on a network they share (`--probe-via network`):
    /// its name on one host; under Swarm the service's own name, which a
    /// claimed pool service keeps (its aliases are fixed at creation).
    async fn probe_host(&self, _id: &ContainerId, name: &str) -> Result<String, RuntimeError> {
        Ok(name.to_owned())
    }
    /// How the container's last run is doing; `None` if it no longer exists.
    async fn inspect(&self, id: &ContainerId) -> Result<Option<RunState>, RuntimeError>;
    /// Stops (SIGTERM, SIGKILL after `stop_timeout`) and removes the
    /// container. Idempotent: a missing container is success.
    async fn remove(&self, id: &ContainerId, stop_timeout: Duration) -> Result<(), RuntimeError>;
    /// Freezes every process of the sandboxd container `id` (`docker
    /// pause`): it keeps its memory, data and connections but runs nothing
    /// until [`Containers::unpause`]. Already paused is success.
    async fn pause(&self, id: &ContainerId) -> Result<(), RuntimeError>;
    /// Thaws a container [`Containers::pause`] froze: it serves at once. Not
    /// paused is success.
    async fn unpause(&self, id: &ContainerId) -> Result<(), RuntimeError>;
    /// The last `lines` lines of the container's output.
    async fn logs_tail(&self, id: &ContainerId, lines: usize) -> Result<String, RuntimeError>;
    /// The warm-pool containers of `deployment` (label
    /// [`crate::domain::pool::POOL`]), claimed or not, stopped ones included.
    async fn pool_containers(
        &self,
        deployment: &Deployment,
    ) -> Result<Vec<PooledContainer>, RuntimeError>;
    /// Container events of `deployment`, replayed from `since` (seconds
    /// since the epoch) as far as the runtime still has them.
    fn events(&self, deployment: &Deployment, since: Option<i64>) -> EventStream;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_actions_parse_with_and_without_a_status_suffix() {
        assert_eq!(ContainerAction::parse("die"), Some(ContainerAction::Die));
        assert_eq!(
            ContainerAction::parse("health_status: healthy"),
            Some(ContainerAction::HealthStatus)
        );
        assert_eq!(ContainerAction::parse("attach"), None);
        for a in ContainerAction::ALL {
            assert_eq!(ContainerAction::parse(a.as_str()), Some(a));
        }
    }
}
