//! The container runtime port: what the controller asks of Docker.

use super::BoxError;
use crate::domain::attach::Candidate;
use crate::domain::container::{ByteStream, ExecOutput, FilterOutput, ObservedContainer, RunState};
use crate::domain::host_net::RouteConflict;
use crate::domain::id::{ContainerId, Deployment, SandboxId};
use crate::domain::labels;
use crate::domain::limits::Limits;
use crate::domain::network::SubnetPool;
use crate::domain::pool::PooledContainer;
use crate::domain::secret::Secret;
use crate::domain::volume_disk;
use async_trait::async_trait;
use futures::stream::BoxStream;
use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

/// Failures of the container runtime.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The daemon could not be reached.
    #[error("cannot reach the Docker daemon ({0}); is dockerd running and is DOCKER_HOST or /var/run/docker.sock correct?")]
    Connect(#[source] BoxError),
    /// An image is absent and could not be pulled.
    #[error("image {image} is not present and could not be pulled ({reason}); build local images with deploy/images/build.sh and point --image/--features-image at them")]
    ImageUnavailable {
        /// The image reference.
        image: String,
        /// Why the pull failed.
        reason: String,
    },
    /// An API call failed.
    #[error("docker {op} failed for {target}: {source}")]
    Api {
        /// What sandboxd was doing.
        op: &'static str,
        /// Container, image or network name.
        target: String,
        /// The runtime's error.
        #[source]
        source: BoxError,
    },
    /// Docker works, but sandboxd will not do what was asked.
    #[error("{0}")]
    Refused(String),
    /// A container could not start because its network is gone (removed
    /// or pruned out of band).
    #[error("network {network} is gone (removed or pruned behind sandboxd's back); sandboxd creates it again")]
    NetworkGone {
        /// The network's name.
        network: String,
    },
    /// The container name is still held by a container Docker is removing
    /// (`docker rm -f` answers before the removal is done; a removal that
    /// failed half-way leaves the container `dead`): the name is free once
    /// that container is gone, so the create is worth trying again then
    /// (see `controller::network::create_and_start`).
    #[error("the container name {name} is still held by container {holder}, which Docker is removing; sandboxd waits for the removal, then creates it")]
    NameBeingRemoved {
        /// The container name.
        name: String,
        /// The container that holds it.
        holder: ContainerId,
    },
    /// A container Docker was removing still held the container name
    /// when the wait for its removal ran out.
    #[error("the container name {name} is still held by container {holder}, which Docker began removing more than {after:?} ago; is the daemon or its storage stuck? (`docker inspect {holder}`; `docker rm -f {holder}` ends it); sandboxd tries again at the next reconcile")]
    NameStillHeld {
        /// The container name.
        name: String,
        /// The container that holds it.
        holder: ContainerId,
        /// How long sandboxd waited.
        after: Duration,
    },
    /// A template job exited with an error.
    #[error("template job {name} exited with code {code}; last log lines:\n{logs}")]
    TemplateJob {
        /// The job's container name.
        name: String,
        /// Its exit code.
        code: i64,
        /// The tail of its output (a template holds no credential).
        logs: String,
    },
    /// The job that makes, attaches or removes a capped volume's file
    /// system failed (see [`crate::domain::volume_disk`]).
    #[error("the disk job ({op}) of volume {volume} exited with code {code}; check that its image exists (deploy/images/build.sh builds sandboxd/disk), that loop devices can be had on the Docker host (losetup -f) and --persistent-disks-dir; last log lines:\n{logs}")]
    DiskJob {
        /// `attach` or `release`.
        op: &'static str,
        /// The volume.
        volume: String,
        /// Its exit code.
        code: i64,
        /// The tail of its output (it handles no credential).
        logs: String,
    },
    /// A volume under a template's name is not one sandboxd may mount or
    /// replace (see [`crate::domain::template_volume::judge`]): the
    /// template's sandboxes start cold until an operator acts.
    #[error("template volume {volume} is refused: {} (its labels say deployment {deployment:?}, sandbox {sandbox:?}); sandboxes that would start from it start cold", refusal.phrase())]
    TemplateRefused {
        /// The volume's name.
        volume: String,
        /// Why.
        refusal: crate::domain::template_volume::Refusal,
        /// The deployment its labels name.
        deployment: Option<String>,
        /// The sandbox its labels name.
        sandbox: Option<String>,
    },
    /// An API call did not answer within its deadline.
    #[error("docker {op} for {target} did not answer within {after:?}; is the Docker daemon overloaded or stuck? (`docker info`, `systemctl status docker`)")]
    Timeout {
        /// What sandboxd was doing.
        op: &'static str,
        /// Container, image or network name.
        target: String,
        /// The deadline.
        after: Duration,
    },
}

/// A tmpfs mount: `noexec,nosuid,nodev`, owned by the container's user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tmpfs {
    /// Mount point.
    pub path: String,
    /// Size cap in bytes (it counts against the memory limit too).
    pub bytes: i64,
}

/// A named volume mounted in a container: created with `labels` if it
/// does not exist, refused if it exists with another deployment's labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    /// Volume name.
    pub name: String,
    /// Mount point (the runtime copies the image's directory there into a
    /// new volume, ownership included).
    pub path: String,
    /// Labels (deployment and sandbox, so that it is found and cleaned up).
    pub labels: HashMap<String, String>,
    /// Its size cap, enforced by the file system (persistent sandboxes'
    /// data; `None`: uncapped, as templates are, whose content is fixed).
    pub disk: Option<Disk>,
}

/// Where capped volumes keep their file systems: one sparse file
/// `DIR/NAME.KEY.img` per volume on the Docker host, made, attached to a loop
/// device and removed by a short privileged job in `image`
/// (see `domain::volume_disk`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskStore {
    /// The directory of the files, on the Docker host.
    pub dir: String,
    /// The image of the job (`deploy/images/disk`: e2fsprogs, util-linux).
    pub image: String,
}

/// A volume's size cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disk {
    /// Where its file lives.
    pub store: DiskStore,
    /// Its size in bytes (a file made earlier keeps the size it was made with).
    pub bytes: u64,
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
    /// [`TemplateJob`]); it must exist, or the container is not created.
    pub template: Option<Volume>,
    /// Data the engine starts from (the images' `SANDBOXD_TEMPLATE=use`):
    /// a fork's copy of its source's data (see [`Helper`]) or a seed's data
    /// file (see [`VolumeFill`]), mounted read-only; it must exist and
    /// carry the labels asked for, or the container is not created.
    pub start_from: Option<Volume>,
    /// The image's binaries, copied into a volume by the template job and
    /// mounted read-only over their place in the image (see
    /// [`TemplateJob::binaries`]); it must exist, or the container is not
    /// created.
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

/// A one-off container that fills a template volume and exits: no
/// network, no published port, no standard input, the same hardening as a
/// sandbox container (read-only root, no capabilities, caps, tmpfs), and
/// the volume read-write at its mount point. Running the job on a volume
/// that holds a complete template must succeed without changing it, so a
/// template is built once however often the job runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateJob {
    /// Container name.
    pub name: String,
    /// The engine image.
    pub image: String,
    /// Environment (never a credential: a template holds none).
    pub env: Vec<String>,
    /// Arguments to the image's entrypoint.
    pub cmd: Vec<String>,
    /// Container labels (so a crashed job's container is found and removed).
    pub labels: HashMap<String, String>,
    /// `uid:gid` the container runs as.
    pub user: String,
    /// Resource caps.
    pub limits: Limits,
    /// tmpfs mounts (`/tmp`, runtime directories).
    pub tmpfs: Vec<Tmpfs>,
    /// The template volume, created with its labels if missing.
    pub volume: Volume,
    /// A volume for the image's binaries, created with its labels if
    /// missing and mounted read-write, so that Docker fills it from the
    /// image when it is empty. Containers that mount it read-only share
    /// one page cache of the binaries instead of each reading its own copy
    /// through the storage driver (which each container pays for in
    /// memory on fuse-overlayfs).
    pub binaries: Option<Volume>,
}

/// A short-lived container in another container's PID and network
/// namespaces (it sees its processes, through `/proc/1/root` its files,
/// and its loopback), holding a volume read-write: a fork's copy is taken
/// in one, with `docker exec`. No network of its own, no published port,
/// no standard input, the same hardening as a sandbox container; it exits
/// on its own after
/// [`Helper::lifetime`] and is then removed by the runtime, so a helper
/// that sandboxd lost track of does not stay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Helper {
    /// Container name.
    pub name: String,
    /// The image (its tools: the source's image).
    pub image: String,
    /// Container labels.
    pub labels: HashMap<String, String>,
    /// `uid:gid` the container runs as (the source's: files and
    /// `/proc/1/root` are reachable for the same user only).
    pub user: String,
    /// Resource caps.
    pub limits: Limits,
    /// tmpfs mounts (`/tmp`, runtime directories).
    pub tmpfs: Vec<Tmpfs>,
    /// Created with its labels if missing (refused if another sandbox's),
    /// mounted read-write.
    pub volume: Volume,
    /// The container whose PID and network namespaces it joins.
    pub sees: ContainerId,
    /// How long it lives at most.
    pub lifetime: Duration,
}

/// One file written into a volume by a container that is created, given
/// the file through Docker's archive upload, and removed, never started:
/// how a seed's data file (a Redis RDB file) gets into the volume its
/// containers start from. Writing it again writes the same file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeFill {
    /// The container's name.
    pub name: String,
    /// Its image (the engine's: the volume takes the mount point's owner).
    pub image: String,
    /// Its labels.
    pub labels: HashMap<String, String>,
    /// The volume: created with its labels if missing; one that exists
    /// must carry them.
    pub volume: Volume,
    /// The file's name in the volume.
    pub file: String,
    /// The file's owner, `uid:gid`.
    pub owner: String,
}

/// A file's content for [`Runtime::fill_volume`], as it streams in.
pub struct FileContent {
    /// Its length in bytes, which the chunks must add up to.
    pub len: u64,
    /// The content.
    pub chunks: ByteStream<'static>,
}

/// A network for sandbox containers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkSpec {
    /// Network name.
    pub name: String,
    /// Labels (deployment and sandbox, so that it is found and cleaned up).
    pub labels: HashMap<String, String>,
    /// Where its subnet comes from; `None` lets the daemon choose.
    pub subnets: Option<SubnetPool>,
    /// Whether its containers may reach beyond the host through NAT.
    pub egress: bool,
    /// The Linux bridge's name; `None` lets the daemon choose.
    pub bridge: Option<String>,
}

/// What became of one stale bridge (a Linux bridge named like sandboxd's
/// that no Docker network owns; see [`crate::domain::host_net`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BridgeOutcome {
    /// It was removed, and its route with it.
    Removed,
    /// This process may not remove it (no CAP_NET_ADMIN, or no `ip`):
    /// the reason says what the operator does instead.
    NotPermitted(String),
    /// It was gone by the time it was removed (Docker removed it with
    /// its network meanwhile).
    Gone,
    /// Removing it failed otherwise.
    Failed(String),
}

/// A stale bridge a sweep found, and what became of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleBridge {
    /// The bridge's name.
    pub name: String,
    /// What became of it.
    pub outcome: BridgeOutcome,
}

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

/// A stream of network names; it ends (or yields an error) when the
/// connection drops.
pub type NetworkStream = BoxStream<'static, Result<String, RuntimeError>>;

/// What a runtime can do beyond the methods every runtime has: each
/// adapter declares its own, and the controller decides by them alone, so
/// a new backend (say, Kubernetes) says what it can and the controller
/// follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// A running container can join another network under new aliases
    /// ([`Runtime::rejoin`]). A Swarm task cannot (its networks are fixed
    /// at creation): a pool container is then claimed only by a sandbox
    /// that adopts its network.
    pub rejoins: bool,
    /// A running container can be renamed ([`Runtime::rename`]), so a
    /// rotation builds the new container beside the old one and gives it
    /// the old one's name afterwards. A Swarm service cannot: it rotates
    /// in place (the old container first, then the new one).
    pub renames: bool,
    /// A container can start from a volume this host copied from another
    /// container, which seeds' templates are. Under Swarm a task may run
    /// on a node that has no such copy: seeds are loaded instead.
    pub local_copies: bool,
}

impl Capabilities {
    /// Everything (one Docker engine).
    pub const ALL: Capabilities = Capabilities {
        rejoins: true,
        renames: true,
        local_copies: true,
    };
}

/// The container runtime. Every method may fail; none may be trusted to
/// return promptly (the controller bounds each call).
#[async_trait]
pub trait Runtime: Send + Sync + 'static {
    /// Whether the daemon answers.
    async fn ping(&self) -> Result<(), RuntimeError>;
    /// The host's memory in bytes, as the daemon reports it (`docker
    /// info`'s total memory); `None` when it does not say.
    async fn host_memory(&self) -> Result<Option<u64>, RuntimeError> {
        Ok(None)
    }
    /// The OCI runtimes the daemon can run containers under, by name
    /// (`docker info`'s Runtimes); `None` when it does not say. One that
    /// cannot choose a runtime per container (Swarm) has none.
    async fn oci_runtimes(&self) -> Result<Option<Vec<String>>, RuntimeError> {
        Ok(None)
    }
    /// The containers of `deployment` (optionally one sandbox's), stopped
    /// ones included; containers with malformed labels are skipped.
    async fn list(
        &self,
        deployment: &Deployment,
        sandbox: Option<&SandboxId>,
    ) -> Result<Vec<ObservedContainer>, RuntimeError>;
    /// Creates the network unless one of that name exists (true when it
    /// created it); a per-sandbox network takes the first free subnet of
    /// its pool.
    async fn ensure_network(&self, spec: &NetworkSpec) -> Result<bool, RuntimeError>;
    /// Removes the host's Linux bridges named like sandboxd's (`sbx…`)
    /// that no Docker network of any kind owns and nothing is plugged
    /// into: one that outlived its network keeps its subnet's route, and a
    /// network given that subnet is unreachable from the host. Runtimes
    /// without host bridges (or that cannot see the host's) find none.
    async fn remove_stale_bridges(&self) -> Result<Vec<StaleBridge>, RuntimeError> {
        Ok(Vec::new())
    }
    /// Why the host cannot reach the container `id` on a network of its,
    /// if the host's route for its address goes through another interface
    /// than that network's bridge (`None`: it does not, or the runtime
    /// cannot tell).
    async fn route_conflict(
        &self,
        _id: &ContainerId,
    ) -> Result<Option<RouteConflict>, RuntimeError> {
        Ok(None)
    }
    /// The networks `deployment` created.
    async fn networks(
        &self,
        deployment: &Deployment,
    ) -> Result<Vec<ObservedResource>, RuntimeError>;
    /// Disconnects everything from the network `name` and removes it, if it
    /// exists and its labels say `deployment` created it. Idempotent.
    async fn remove_network(&self, name: &str, deployment: &Deployment)
        -> Result<(), RuntimeError>;
    /// Names of the containers connected to the network; `None` if it does
    /// not exist.
    async fn network_members(&self, network: &str) -> Result<Option<Vec<String>>, RuntimeError>;
    /// What the runtime says of the container it resolves `name` to: an
    /// exact name, but as Docker resolves them also a full id or a unique
    /// id prefix (the judgement, [`crate::domain::attach::judge`], compares
    /// the name); `None` when it resolves to none.
    async fn attach_candidate(&self, name: &str) -> Result<Option<Candidate>, RuntimeError>;
    /// Connects the container `container` (sandboxd's own container by
    /// name, or an attach candidate by its full id) to `network`. Checks
    /// nothing: an orchestrator's container is judged first
    /// ([`crate::domain::attach`]). Already connected is success.
    async fn connect(&self, network: &str, container: &str) -> Result<(), RuntimeError>;
    /// Disconnects the container from `network`. Not connected is success.
    async fn disconnect(&self, network: &str, container: &str) -> Result<(), RuntimeError>;
    /// The volumes `deployment` created.
    async fn volumes(&self, deployment: &Deployment)
        -> Result<Vec<ObservedResource>, RuntimeError>;
    /// Removes the volume `name` if it exists and its labels say
    /// `deployment` created it, and its capped file system's file in
    /// `disks` if it has one. Idempotent; fails while a container uses it.
    async fn remove_volume(
        &self,
        name: &str,
        deployment: &Deployment,
        disks: Option<&DiskStore>,
    ) -> Result<(), RuntimeError>;
    /// The labels of `image` if it is present locally, `None` if not.
    async fn image_labels(
        &self,
        image: &str,
    ) -> Result<Option<HashMap<String, String>>, RuntimeError>;
    /// The id of `image` if it is present locally, `None` if not.
    async fn image_id(&self, image: &str) -> Result<Option<String>, RuntimeError>;
    /// Pulls `image`.
    async fn pull(&self, image: &str) -> Result<(), RuntimeError>;
    /// Runs `job` to its end (creating its volume if missing) and removes
    /// its container; fails with the exit code and the last lines of its
    /// output unless it exits 0.
    async fn run_template_job(&self, job: &TemplateJob) -> Result<(), RuntimeError>;
    /// Starts a [`Helper`] and returns its id; [`Runtime::exec`] runs in
    /// it, [`Runtime::remove`] ends it. A runtime that cannot place a
    /// container next to another's processes refuses.
    async fn start_helper(&self, helper: &Helper) -> Result<ContainerId, RuntimeError> {
        Err(RuntimeError::Refused(format!(
            "helper {}: this runtime cannot start a container in another's PID namespace (forks need --backend docker)",
            helper.name
        )))
    }
    /// Writes [`VolumeFill::file`] into its volume with `content`, which
    /// streams in (an `Err` in it fails the write). A runtime that cannot
    /// reach a volume from here refuses.
    async fn fill_volume(
        &self,
        fill: &VolumeFill,
        _content: FileContent,
    ) -> Result<(), RuntimeError> {
        Err(RuntimeError::Refused(format!(
            "volume {}: this runtime cannot write a file into a volume (data-file seeds need --backend docker)",
            fill.volume.name
        )))
    }
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
    /// as [`Runtime::rename`] does.
    async fn claim_as(
        &self,
        id: &ContainerId,
        name: &str,
        _labels: &HashMap<String, String>,
    ) -> Result<(), RuntimeError> {
        self.rename(id, name).await
    }
    /// Makes the sandboxd container `id`, already on `network`, answer to
    /// `aliases` there. Docker cannot change an endpoint's aliases, so the
    /// container is disconnected and connected again: its published port
    /// is bound anew (to another host port unless the container asked for
    /// a fixed one).
    async fn rejoin(
        &self,
        network: &str,
        id: &ContainerId,
        aliases: &[String],
    ) -> Result<(), RuntimeError>;
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
    /// What this runtime can do beyond the methods every runtime has
    /// (default: everything). The controller asks this, never which
    /// backend it runs on.
    fn capabilities(&self) -> Capabilities {
        Capabilities::ALL
    }
    /// How the container's last run is doing; `None` if it no longer exists.
    async fn inspect(&self, id: &ContainerId) -> Result<Option<RunState>, RuntimeError>;
    /// Stops (SIGTERM, SIGKILL after `stop_timeout`) and removes the
    /// container. Idempotent: a missing container is success.
    async fn remove(&self, id: &ContainerId, stop_timeout: Duration) -> Result<(), RuntimeError>;
    /// Freezes every process of the sandboxd container `id` (`docker
    /// pause`): it keeps its memory, data and connections but runs nothing
    /// until [`Runtime::unpause`]. Already paused is success.
    async fn pause(&self, id: &ContainerId) -> Result<(), RuntimeError>;
    /// Thaws a container [`Runtime::pause`] froze: it serves at once. Not
    /// paused is success.
    async fn unpause(&self, id: &ContainerId) -> Result<(), RuntimeError>;
    /// The last `lines` lines of the container's output.
    async fn logs_tail(&self, id: &ContainerId, lines: usize) -> Result<String, RuntimeError>;
    /// Runs `cmd` inside the container with extra environment `env`.
    async fn exec(
        &self,
        id: &ContainerId,
        cmd: &[&str],
        env: Vec<String>,
    ) -> Result<ExecOutput, RuntimeError>;
    /// Runs `cmd` inside the container with extra environment `env` and
    /// `input` on its standard input, written as it arrives and closed at
    /// its end (an input that ends early with an `Err` is not closed
    /// cleanly: the call fails with its reason). Returns the last `keep`
    /// bytes of its standard output and the first of its standard error.
    /// A runtime that cannot attach to a process's input refuses.
    async fn filter(
        &self,
        id: &ContainerId,
        cmd: &[&str],
        _env: Vec<String>,
        _input: ByteStream<'_>,
        _keep: usize,
    ) -> Result<FilterOutput, RuntimeError> {
        Err(RuntimeError::Refused(format!(
            "container {id}: this runtime cannot run `{}` with input",
            cmd.first().unwrap_or(&"")
        )))
    }
    /// The warm-pool containers of `deployment` (label
    /// [`crate::domain::pool::POOL`]), claimed or not, stopped ones included.
    async fn pool_containers(
        &self,
        deployment: &Deployment,
    ) -> Result<Vec<PooledContainer>, RuntimeError>;
    /// Container events of `deployment`, replayed from `since` (seconds
    /// since the epoch) as far as the runtime still has them.
    fn events(&self, deployment: &Deployment, since: Option<i64>) -> EventStream;
    /// The names of networks as they are removed, any owner's (Docker's
    /// network events carry no labels: the watcher picks its own by name).
    fn removed_networks(&self) -> NetworkStream;
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
