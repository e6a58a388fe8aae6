//! The Docker adapter: [`Runtime`] over bollard, speaking in sandboxd's
//! terms (managed containers, specs, teardown) and turning Docker's errors
//! into messages an operator can act on.

use super::host_net;
use crate::domain::attach::{Candidate, Holds};
use crate::domain::container::{
    ByteStream, ContainerState, ExecOutput, FilterOutput, ObservedContainer, RunState,
};
use crate::domain::host_net::{self as domain_host_net, Route, RouteConflict};
use crate::domain::id::{ContainerId, Deployment, SandboxId};
use crate::domain::identity;
use crate::domain::labels::{self, ContainerLabels};
use crate::domain::limits::Limits;
use crate::domain::network::Ipv4Net;
use crate::domain::own_image;
use crate::domain::pool::{self, PooledContainer};
use crate::domain::secret::Secret;
use crate::domain::template_volume::{self, Refusal, Verdict};
use crate::metrics::{self, DockerCall};
use crate::ports::runtime::{
    Commands, ContainerAction, ContainerSpec, Containers, DiskStore, EventStream, FileContent,
    Helper, Host, Images, NetworkSpec, NetworkStream, Networks, ObservedResource, RuntimeError,
    RuntimeEvent, StaleBridge, TemplateJob, Tmpfs, Volume, VolumeFill, Volumes,
};
use async_trait::async_trait;
use bollard::container::AttachContainerResults;
use bollard::errors::Error as DockerError;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::models::{
    ContainerCreateBody, ContainerSummaryStateEnum, EndpointSettings, HostConfig,
    HostConfigLogConfig, Ipam, IpamConfig, Mount, MountType, NetworkConnectRequest,
    NetworkCreateRequest, NetworkDisconnectRequest, NetworkingConfig, PortBinding,
    VolumeCreateRequest,
};
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, CreateContainerOptionsBuilder, CreateImageOptionsBuilder,
    EventsOptionsBuilder, InspectContainerOptions, InspectNetworkOptions,
    ListContainersOptionsBuilder, ListNetworksOptionsBuilder, ListVolumesOptionsBuilder,
    LogsOptionsBuilder, RemoveContainerOptionsBuilder, RemoveVolumeOptions,
    RenameContainerOptionsBuilder, StopContainerOptionsBuilder, UploadToContainerOptionsBuilder,
    WaitContainerOptions,
};
use bollard::Docker;
use chrono::{TimeZone, Utc};
use futures::StreamExt;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

mod disk;
mod node_exec;
pub(crate) use node_exec::HELPER_FAILED;
pub(crate) use node_exec::NODE_EXEC;

/// The host configuration every sandboxd container shares: caps, no
/// capabilities, no new privileges, a read-only root with `tmpfs` owned by
/// `user`, and bounded logs.
fn hardened(user: &str, limits: &Limits, tmpfs: &[Tmpfs]) -> HostConfig {
    let owner = user.replace(':', ",gid=");
    let tmpfs = tmpfs
        .iter()
        .map(|t| {
            (
                t.path.clone(),
                format!("rw,noexec,nosuid,nodev,size={},uid={owner}", t.bytes),
            )
        })
        .collect();
    HostConfig {
        memory: Some(limits.memory_bytes),
        memory_swap: Some(limits.memory_bytes),
        nano_cpus: Some(limits.nano_cpus),
        pids_limit: Some(limits.pids),
        oom_score_adj: Some(limits.oom_score_adj),
        security_opt: Some(vec!["no-new-privileges:true".into()]),
        cap_drop: Some(vec!["ALL".into()]),
        readonly_rootfs: Some(true),
        tmpfs: Some(tmpfs),
        log_config: Some(HostConfigLogConfig {
            typ: Some("json-file".into()),
            config: Some(HashMap::from([
                ("max-size".to_owned(), limits.log_bytes.to_string()),
                ("max-file".to_owned(), limits.log_files.to_string()),
            ])),
        }),
        ..Default::default()
    }
}

/// Writes `secret` to a container's standard input and closes it.
async fn write_secret(
    input: &mut (impl tokio::io::AsyncWrite + Unpin),
    secret: &Secret,
    op: &'static str,
    target: &str,
) -> Result<(), RuntimeError> {
    let io = |e: std::io::Error| RuntimeError::Api {
        op,
        target: target.to_owned(),
        source: Box::new(e),
    };
    input
        .write_all(secret.expose().as_bytes())
        .await
        .map_err(io)?;
    input.flush().await.map_err(io)?;
    input.shutdown().await.map_err(io)
}

/// `volume` mounted at its path.
/// The error for a refused template volume `wanted` that exists with
/// `existing` labels.
fn template_refused(
    wanted: &Volume,
    existing: &HashMap<String, String>,
    refusal: Refusal,
) -> RuntimeError {
    RuntimeError::TemplateRefused {
        volume: wanted.name.clone(),
        refusal,
        deployment: existing.get(labels::DEPLOYMENT).cloned(),
        sandbox: existing.get(labels::SANDBOX).cloned(),
    }
}

/// A tar archive of one file `name` owned by `owner` (`uid:gid`), mode 0644.
fn one_file_tar(
    name: &str,
    owner: &str,
    content: FileContent,
) -> std::io::Result<impl futures::Stream<Item = std::io::Result<bytes::Bytes>> + Send + 'static> {
    use bytes::Bytes;
    use futures::stream;
    /// A tar archive is made of 512-byte blocks and ends with two empty ones.
    const BLOCK: u64 = 512;
    let (uid, gid) = owner.split_once(':').unwrap_or((owner, owner));
    let len = content.len;
    let mut header = tar::Header::new_gnu();
    header.set_path(name)?;
    header.set_size(len);
    header.set_mode(0o644);
    header.set_uid(uid.parse().unwrap_or(0));
    header.set_gid(gid.parse().unwrap_or(0));
    header.set_mtime(0);
    header.set_cksum();
    let header = Bytes::copy_from_slice(header.as_bytes());
    // The content as it comes, then the padding of its last block and the
    // archive's end; content that does not add up to `len` fails it.
    let body = stream::try_unfold(
        (content.chunks, 0u64, false),
        move |(mut chunks, seen, ended)| async move {
            if ended {
                return Ok(None);
            }
            match chunks.next().await {
                Some(chunk) => {
                    let chunk = chunk?;
                    let seen = seen + chunk.len() as u64;
                    if seen > len {
                        return Err(format!("the content is longer than its {len} bytes"));
                    }
                    Ok(Some((chunk, (chunks, seen, false))))
                }
                None if seen == len => {
                    let padding = (BLOCK - len % BLOCK) % BLOCK;
                    let end = Bytes::from(vec![0; (padding + 2 * BLOCK) as usize]);
                    Ok(Some((end, (chunks, seen, true))))
                }
                None => Err(format!("the content ended after {seen} of its {len} bytes")),
            }
        },
    );
    Ok(stream::once(async move { Ok(header) })
        .chain(body)
        .map(|item| item.map_err(std::io::Error::other)))
}

fn mount(volume: &Volume, read_only: bool) -> Mount {
    Mount {
        target: Some(volume.path.clone()),
        source: Some(volume.name.clone()),
        typ: Some(MountType::VOLUME),
        read_only: Some(read_only),
        ..Default::default()
    }
}

pub(super) fn api<'a>(
    op: &'static str,
    target: &'a str,
) -> impl FnOnce(DockerError) -> RuntimeError + 'a {
    move |source| RuntimeError::Api {
        op,
        target: target.to_owned(),
        source: Box::new(source),
    }
}

/// Refuses to touch the network or volume `name` unless its labels say
/// `deployment` created it.
fn refuse_unless_ours(
    kind: &str,
    name: &str,
    labels: &HashMap<String, String>,
    deployment: &Deployment,
) -> Result<(), RuntimeError> {
    if labels::belongs_to(labels, deployment) {
        return Ok(());
    }
    Err(RuntimeError::Refused(format!(
        "{kind} {name} is not deployment {deployment}'s (its labels say {:?}); sandboxd leaves it alone",
        labels.get(labels::DEPLOYMENT)
    )))
}

pub(super) fn is_status(e: &DockerError, codes: &[u16]) -> bool {
    matches!(e, DockerError::DockerResponseServerError { status_code, .. } if codes.contains(status_code))
}

/// How often a pause the kernel's freezer gave up on is tried, and how long
/// apart ([`Containers::pause`]).
const FREEZE_TRIES: u32 = 4;
const FREEZE_AGAIN_AFTER: Duration = Duration::from_millis(250);

/// Whether removing a network failed because it is gone already: a 404,
/// or (a Swarm overlay whose removal raced another, Engine 20.10) a 500
/// saying `network ID not found`.
fn network_gone(e: &DockerError) -> bool {
    match e {
        DockerError::DockerResponseServerError {
            status_code,
            message,
        } => *status_code == 404 || (*status_code == 500 && message.ends_with("not found")),
        _ => false,
    }
}

/// How long a stream may stay silent by default (`--docker-timeout`'s
/// default).
const STREAM_TIMEOUT: Duration = Duration::from_secs(30);

/// The next item of `stream` within `after`: a stream that stops talking
/// (the output of an exec in a paused container, a stuck daemon) is a
/// [`RuntimeError::Timeout`], not a wait without end.
async fn next_within<S: futures::Stream + Unpin>(
    stream: &mut S,
    after: Duration,
    op: &'static str,
    target: &str,
) -> Result<Option<S::Item>, RuntimeError> {
    tokio::time::timeout(after, stream.next())
        .await
        .map_err(|_| RuntimeError::Timeout {
            op,
            target: target.to_owned(),
            after,
        })
}

/// Every network on the host as its host side sees it.
struct HostNetworks {
    /// The subnets they use.
    subnets: Vec<Ipv4Net>,
    /// Each bridge network's Linux bridge, by network name.
    bridges: HashMap<String, String>,
}

/// The local Docker daemon as a [`Runtime`].
#[derive(Debug, Clone)]
pub struct DockerRuntime {
    docker: Docker,
    /// Held while a subnet is chosen and its network created, so this
    /// process never hands one subnet out twice.
    subnet_lock: Arc<tokio::sync::Mutex<()>>,
    /// The stale bridges the last sweep saw, with when each was first
    /// found stale: one goes once every sweep has found it stale for
    /// `stale_bridge_age`.
    stale_seen: Arc<std::sync::Mutex<HashMap<String, std::time::Instant>>>,
    /// See [`domain_host_net::STALE_BRIDGE_AGE`].
    stale_bridge_age: Duration,
    /// How long any stream may stay silent: each read of an exec's or a
    /// log's output and each progress message of a pull, the event
    /// stream's connect, writing a container's secrets.
    stream_timeout: Duration,
    /// Networks are Swarm overlays (the Swarm backend's), not bridges.
    overlay: Option<Overlay>,
}

/// How the Swarm backend's overlay networks are made.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Overlay {
    /// Whether a network without egress is made `internal` (no gateway
    /// bridge: no route out). A task that publishes a port in host mode
    /// needs the gateway bridge, so it may not be.
    pub(crate) internal_without_egress: bool,
}

impl DockerRuntime {
    /// Every container (running or not) of `deployment` that `filters`
    /// select.
    async fn list_all(
        &self,
        filters: &HashMap<&str, Vec<String>>,
        deployment: &Deployment,
    ) -> Result<Vec<bollard::models::ContainerSummary>, RuntimeError> {
        let options = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(filters)
            .build();
        self.docker
            .list_containers(Some(options))
            .await
            .map_err(api("list", deployment.as_str()))
    }

    /// Creates and starts `cmd` in container `id` with extra environment
    /// `env`, its output attached (and its input, if `stdin`): the exec's
    /// id and how it started.
    async fn start_exec(
        &self,
        id: &ContainerId,
        cmd: &[&str],
        env: Vec<String>,
        stdin: bool,
    ) -> Result<(String, StartExecResults), RuntimeError> {
        let created = self
            .docker
            .create_exec(
                id.as_str(),
                CreateExecOptions {
                    cmd: Some(cmd.iter().map(|s| s.to_string()).collect()),
                    env: Some(env),
                    attach_stdin: Some(stdin),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    ..Default::default()
                },
            )
            .await
            .map_err(api("exec", id.as_str()))?;
        let started = self
            .docker
            .start_exec(&created.id, None::<StartExecOptions>)
            .await
            .map_err(api("exec", id.as_str()))?;
        Ok((created.id, started))
    }

    /// How exec `exec` in container `id` ended (-1 if Docker did not say).
    async fn exec_exit_code(&self, id: &ContainerId, exec: &str) -> Result<i64, RuntimeError> {
        Ok(self
            .docker
            .inspect_exec(exec)
            .await
            .map_err(api("exec inspect", id.as_str()))?
            .exit_code
            .unwrap_or(-1))
    }

    /// Connects to the local Docker daemon and negotiates the API version
    /// (the engine may be older than bollard's default, e.g. 20.10 = API 1.41).
    pub async fn connect() -> Result<Self, RuntimeError> {
        let connect = |e: DockerError| RuntimeError::Connect(Box::new(e));
        let docker = Docker::connect_with_local_defaults().map_err(connect)?;
        let docker = docker.negotiate_version().await.map_err(connect)?;
        docker.ping().await.map_err(connect)?;
        Ok(Self {
            docker,
            subnet_lock: Arc::default(),
            stale_seen: Arc::default(),
            stale_bridge_age: domain_host_net::STALE_BRIDGE_AGE,
            stream_timeout: STREAM_TIMEOUT,
            overlay: None,
        })
    }

    /// The Docker client (for the chaos tool's faults, `adapters::chaos`).
    pub(crate) fn client(&self) -> &Docker {
        &self.docker
    }

    /// Bounds every read of a stream by `after` (default 30 s; `sandboxd
    /// run` passes `--docker-timeout`): each chunk of an exec's or a log's
    /// output, each progress message of a pull, the event stream's
    /// connect, and writing a container's secrets.
    pub fn with_stream_timeout(mut self, after: Duration) -> Self {
        self.stream_timeout = after;
        self
    }

    /// Removes a stale bridge once sweeps have found it stale for `age`
    /// (default [`domain_host_net::STALE_BRIDGE_AGE`]; a test shortens it).
    pub fn with_stale_bridge_age(mut self, age: Duration) -> Self {
        self.stale_bridge_age = age;
        self
    }

    /// Makes networks attachable Swarm overlays (the Swarm backend).
    pub(crate) fn with_overlay_networks(mut self, overlay: Overlay) -> Self {
        self.overlay = Some(overlay);
        self
    }

    /// Container events of `deployment`, replayed from `since`, each
    /// reported as the container `id_of` names for its actor (the
    /// container itself; a Swarm task's service).
    pub(crate) fn container_events(
        &self,
        deployment: &Deployment,
        since: Option<i64>,
        id_of: fn(&bollard::models::EventActor) -> Option<String>,
    ) -> EventStream {
        let filters = HashMap::from([
            ("type", vec!["container".to_owned()]),
            ("label", vec![labels::deployment_filter(deployment)]),
            (
                "event",
                ContainerAction::ALL
                    .iter()
                    .map(|a| a.as_str().to_owned())
                    .collect(),
            ),
        ]);
        let mut options = EventsOptionsBuilder::default().filters(&filters);
        if let Some(t) = since {
            // Ask Docker to replay what its buffer still has since then.
            options = options.since(&t.to_string());
        }
        // The stream stays open while nothing happens, but its connect (the
        // daemon's answer to the request) gets the stream timeout: a stuck
        // daemon ends the stream with an error and the watcher reconnects.
        let connect_within = self.stream_timeout.max(Duration::from_secs(1));
        self.docker
            .clone()
            .with_timeout(connect_within)
            .events(Some(options.build()))
            .filter_map(move |item| async move {
                match item {
                    Err(e) => Some(Err(api("events", "the event stream")(e))),
                    Ok(event) => {
                        let action = ContainerAction::parse(event.action.as_deref()?)?;
                        let actor = event.actor?;
                        let sandbox = actor
                            .attributes
                            .as_ref()
                            .and_then(|a| a.get(labels::SANDBOX))
                            .and_then(|s| SandboxId::parse(s).ok());
                        Some(Ok(RuntimeEvent {
                            container: ContainerId::new(id_of(&actor)?),
                            action,
                            sandbox,
                            time: event.time,
                        }))
                    }
                }
            })
            .boxed()
    }

    /// Ids of the networks called exactly `name`.
    /// Creates the volume unless it exists; refuses one whose labels say
    /// another deployment, sandbox, state database or incarnation of the
    /// row created it (its data is never mounted into this one).
    pub(crate) async fn ensure_volume(&self, volume: &Volume) -> Result<(), RuntimeError> {
        let inspected = {
            let _timer = metrics::time_docker_call(DockerCall::Volume);
            self.docker.inspect_volume(&volume.name).await
        };
        let existing = match inspected {
            Ok(info) => {
                if !identity::may_mount(&info.labels, &volume.labels) {
                    return Err(RuntimeError::Refused(format!(
                        "volume {} exists but was not created for this sandbox (its labels say deployment {:?}, sandbox {:?}, state database {:?}, incarnation {:?}); sandboxd never mounts another's data: remove or rename it",
                        volume.name,
                        info.labels.get(labels::DEPLOYMENT),
                        info.labels.get(labels::SANDBOX),
                        info.labels.get(labels::STATE_ID),
                        info.labels.get(labels::INCARNATION)
                    )));
                }
                Some(disk::Existing {
                    options: info.options,
                    labels: info.labels,
                })
            }
            Err(e) if is_status(&e, &[404]) => None,
            Err(e) => return Err(api("inspect volume", &volume.name)(e)),
        };
        if let Some(disk) = &volume.disk {
            return self.ensure_disk_volume(volume, disk, existing).await;
        }
        if existing.is_some() {
            return Ok(());
        }
        self.create_volume(volume, None).await
    }

    /// The host path or device the local volume `name` mounts (its
    /// `device` option, when that is an absolute path), if any; `None` for
    /// a plain volume in Docker's own directory, a tmpfs or a network file
    /// system, or a volume gone meanwhile.
    async fn local_volume_device(&self, name: &str) -> Result<Option<String>, RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::Volume);
        match self.docker.inspect_volume(name).await {
            Ok(info) => Ok(info
                .options
                .get("device")
                .filter(|d| d.starts_with('/'))
                .cloned()),
            Err(e) if is_status(&e, &[404]) => Ok(None),
            Err(e) => Err(api("inspect volume", name)(e)),
        }
    }

    /// Creates `volume` with its labels, on the local driver with
    /// `driver_opts` if given (a capped volume's mount).
    async fn create_volume(
        &self,
        volume: &Volume,
        driver_opts: Option<HashMap<String, String>>,
    ) -> Result<(), RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::Volume);
        let request = VolumeCreateRequest {
            name: Some(volume.name.clone()),
            driver: driver_opts.as_ref().map(|_| "local".to_owned()),
            driver_opts,
            labels: Some(volume.labels.clone()),
            ..Default::default()
        };
        self.docker
            .create_volume(request)
            .await
            .map(drop)
            .map_err(api("create volume", &volume.name))
    }

    /// Makes the template (or template binaries) volume `wanted` ready for
    /// its job: creates it if missing; keeps one whose labels prove it
    /// holds this content, whichever state database's controller built it;
    /// removes and creates again this deployment's template of other
    /// content; refuses anything else (see [`template_volume::judge`]).
    pub(crate) async fn ensure_template_volume(&self, wanted: &Volume) -> Result<(), RuntimeError> {
        let existing = {
            let _timer = metrics::time_docker_call(DockerCall::Volume);
            match self.docker.inspect_volume(&wanted.name).await {
                Ok(info) => Some(info.labels),
                Err(e) if is_status(&e, &[404]) => None,
                Err(e) => return Err(api("inspect volume", &wanted.name)(e)),
            }
        };
        if let Some(existing) = existing {
            match template_volume::judge(&existing, &wanted.labels) {
                Verdict::Reuse => return Ok(()),
                Verdict::Refuse(refusal) => {
                    return Err(template_refused(wanted, &existing, refusal))
                }
                Verdict::Replace => {
                    let _timer = metrics::time_docker_call(DockerCall::Volume);
                    match self
                        .docker
                        .remove_volume(&wanted.name, None::<RemoveVolumeOptions>)
                        .await
                    {
                        Ok(()) => {
                            tracing::info!(template = %wanted.name, "removed a template whose labels do not prove this content; building it again")
                        }
                        Err(e) if is_status(&e, &[404]) => {}
                        Err(e) if is_status(&e, &[409]) => {
                            return Err(template_refused(wanted, &existing, Refusal::InUse))
                        }
                        Err(e) => return Err(api("remove volume", &wanted.name)(e)),
                    }
                }
            }
        }
        self.ensure_volume(wanted).await
    }

    /// Refuses a template (or template binaries) volume that is missing
    /// (Docker would create an empty, unlabelled one) or whose labels do
    /// not prove it holds `template`'s content.
    async fn check_template(&self, template: &Volume) -> Result<(), RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::Volume);
        match self.docker.inspect_volume(&template.name).await {
            Ok(info) => match template_volume::judge(&info.labels, &template.labels) {
                Verdict::Reuse => Ok(()),
                Verdict::Refuse(refusal) => Err(template_refused(template, &info.labels, refusal)),
                Verdict::Replace => Err(RuntimeError::Refused(format!(
                    "template volume {} exists but its labels do not prove the content sandboxd builds; its job replaces it",
                    template.name
                ))),
            },
            Err(e) if is_status(&e, &[404]) => Err(RuntimeError::Refused(format!(
                "template volume {} is gone (removed behind sandboxd's back); sandboxd builds it again",
                template.name
            ))),
            Err(e) => Err(api("inspect volume", &template.name)(e)),
        }
    }

    /// Refuses data to start from that is missing (Docker would mount an
    /// empty volume, and the engine would start without the data) or whose
    /// volume lacks the labels asked for (it was not made for this).
    async fn check_start_from(&self, data: &Volume) -> Result<(), RuntimeError> {
        match self.labelled_volume(data).await? {
            Some(true) => Ok(()),
            Some(false) => Err(RuntimeError::Refused(format!(
                "volume {} exists but was not made for this (its labels differ); sandboxd never mounts another's data: remove or rename it",
                data.name
            ))),
            None => Err(RuntimeError::Refused(format!(
                "volume {} is gone (removed behind sandboxd's back): a fork's copy is made again by releasing the fork and forking its source again; a seed's file is written again by the next container that starts from it",
                data.name
            ))),
        }
    }

    /// Whether `volume` exists carrying (at least) its labels: `None` when
    /// it does not exist.
    async fn labelled_volume(&self, volume: &Volume) -> Result<Option<bool>, RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::Volume);
        match self.docker.inspect_volume(&volume.name).await {
            Ok(info) => Ok(Some(
                volume
                    .labels
                    .iter()
                    .all(|(k, v)| info.labels.get(k) == Some(v)),
            )),
            Err(e) if is_status(&e, &[404]) => Ok(None),
            Err(e) => Err(api("inspect volume", &volume.name)(e)),
        }
    }

    /// Waits for the container `name` to exit and returns its exit code.
    async fn wait_exit(&self, name: &str) -> Result<i64, RuntimeError> {
        let mut stream = self
            .docker
            .wait_container(name, None::<WaitContainerOptions>);
        match stream.next().await {
            Some(Ok(response)) => Ok(response.status_code),
            Some(Err(DockerError::DockerContainerWaitError { code, .. })) => Ok(code),
            Some(Err(e)) => Err(api("wait", name)(e)),
            None => Err(RuntimeError::Refused(format!(
                "docker ended the wait for {name} without an exit code"
            ))),
        }
    }

    async fn networks_named(&self, name: &str) -> Result<Vec<String>, RuntimeError> {
        let filters = HashMap::from([("name", vec![name.to_owned()])]);
        let options = ListNetworksOptionsBuilder::default()
            .filters(&filters)
            .build();
        let networks = self
            .docker
            .list_networks(Some(options))
            .await
            .map_err(api("list networks", name))?;
        Ok(networks
            .into_iter()
            .filter(|n| n.name.as_deref() == Some(name))
            .filter_map(|n| n.id)
            .collect())
    }

    /// Every network on this host (any owner's): the subnets they use and
    /// the Linux bridge of each bridge network.
    async fn host_networks(&self) -> Result<HostNetworks, RuntimeError> {
        let networks = self
            .docker
            .list_networks(None::<bollard::query_parameters::ListNetworksOptions>)
            .await
            .map_err(api("list networks", "all networks"))?;
        let subnets = networks
            .iter()
            .filter_map(|n| n.ipam.as_ref()?.config.as_ref())
            .flatten()
            .filter_map(|c| c.subnet.as_deref()?.parse().ok())
            .collect();
        let bridges = networks
            .iter()
            .filter(|n| n.driver.as_deref() == Some("bridge"))
            .filter_map(|n| {
                // Docker's own name unless the network asked for one.
                let bridge = n
                    .options
                    .as_ref()
                    .and_then(|o| o.get("com.docker.network.bridge.name").cloned())
                    .or_else(|| Some(format!("br-{}", n.id.as_deref()?.get(..12)?)))?;
                Some((n.name.clone()?, bridge))
            })
            .collect();
        Ok(HostNetworks { subnets, bridges })
    }

    /// Whether this process sees the network namespace Docker's bridges
    /// are in (the host's; `networks` says which bridges those are): not
    /// on a Swarm backend (overlays have no host bridge), nor in a
    /// container of its own.
    fn sees_host(&self, networks: &HostNetworks) -> bool {
        let bridges: HashSet<&str> = networks.bridges.values().map(String::as_str).collect();
        let sees =
            self.overlay.is_none() && domain_host_net::sees_host(&bridges, host_net::has_link);
        if !sees {
            tracing::debug!("Docker's bridges are not in this process's network namespace: the host's routes and bridges are not checked");
        }
        sees
    }

    /// The host's routes, if this process sees them (none otherwise: the
    /// subnets are then chosen by Docker's networks alone).
    fn host_routes(&self, networks: &HostNetworks) -> Vec<Route> {
        if !self.sees_host(networks) {
            return Vec::new();
        }
        host_net::routes().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "subnets are chosen by Docker's networks alone");
            Vec::new()
        })
    }

    /// Creates the network; with a pool, in the first subnet no network on
    /// this host uses, trying the next when another creator took it first.
    async fn create_network(&self, spec: &NetworkSpec) -> Result<(), RuntimeError> {
        let mut options = HashMap::new();
        if self.overlay.is_some() {
            // Overlays have neither option: their egress is the gateway
            // bridge's, or none when internal.
        } else if !spec.egress {
            // No masquerading: packets may leave the bridge but no answer
            // finds its way back, so nothing outside the host is reachable.
            options.insert(
                "com.docker.network.bridge.enable_ip_masquerade".to_owned(),
                "false".to_owned(),
            );
        }
        if let (Some(bridge), None) = (&spec.bridge, self.overlay) {
            options.insert("com.docker.network.bridge.name".to_owned(), bridge.clone());
        }
        let (driver, attachable, internal) = match self.overlay {
            None => ("bridge", None, None),
            Some(o) => (
                "overlay",
                Some(true),
                Some(o.internal_without_egress && !spec.egress),
            ),
        };
        let request = |subnet: Option<Ipv4Net>| NetworkCreateRequest {
            name: spec.name.clone(),
            driver: Some(driver.into()),
            attachable,
            internal,
            options: Some(options.clone()),
            labels: Some(spec.labels.clone()),
            ipam: subnet.map(|subnet| Ipam {
                config: Some(vec![IpamConfig {
                    subnet: Some(subnet.to_string()),
                    gateway: Some(subnet.gateway().to_string()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let Some(pool) = spec.subnets else {
            self.docker
                .create_network(request(None))
                .await
                .map_err(api("create network", &spec.name))?;
            return Ok(());
        };
        let _one_at_a_time = self.subnet_lock.lock().await;
        let mut taken: Vec<Ipv4Net> = Vec::new();
        for _ in 0..8 {
            let networks = self.host_networks().await?;
            let routes = self.host_routes(&networks);
            let mut used = networks.subnets;
            used.extend(taken.iter().copied());
            // A subnet the host routes through another interface (a bridge
            // that outlived its network) would leave the engines
            // unreachable from the host: never handed out.
            let subnet = domain_host_net::free_subnet(&pool, &used, &routes);
            if let Some(first) = pool.first_free(&used).filter(|f| Some(*f) != subnet) {
                if let Some(route) = domain_host_net::shadowing(&routes, &first) {
                    tracing::warn!(network = %spec.name, subnet = %first, interface = route.iface, route = %route.dest, "subnet skipped: the host routes it through another interface (a stale sandboxd bridge is removed once two relists in a row find it)");
                }
            }
            let subnet = subnet.ok_or_else(|| {
                RuntimeError::Refused(format!(
                    "no free /{} subnet left in the pool {} for network {} (Docker's networks and the host's routes hold them all): remove unused networks (docker network ls --filter label={}) or routes, or give --subnet-pool a larger range",
                    pool.prefix(),
                    pool.pool(),
                    spec.name,
                    labels::MANAGED_BY
                ))
            })?;
            match self.docker.create_network(request(Some(subnet))).await {
                Ok(_) => return Ok(()),
                // Another creator (a second deployment on this host) took
                // the subnet between our list and our create.
                Err(e) if e.to_string().contains("overlaps") => {
                    tracing::debug!(network = %spec.name, %subnet, "subnet taken meanwhile; trying the next");
                    taken.push(subnet);
                }
                Err(e) => return Err(api("create network", &spec.name)(e)),
            }
        }
        Err(RuntimeError::Refused(format!(
            "could not find a free subnet for network {} after 8 attempts: another program keeps taking subnets of the pool {}; give this deployment its own --subnet-pool",
            spec.name,
            pool.pool()
        )))
    }

    /// Refuses to remove a container called `name` that is not the one
    /// `spec` describes (another sandbox's or deployment's, or not ours).
    async fn check_name_owner(&self, spec: &ContainerSpec) -> Result<(), RuntimeError> {
        let info = match self
            .docker
            .inspect_container(&spec.name, None::<InspectContainerOptions>)
            .await
        {
            Ok(info) => info,
            Err(e) if is_status(&e, &[404]) => return Ok(()),
            Err(e) => return Err(api("inspect", &spec.name)(e)),
        };
        let theirs = info.config.and_then(|c| c.labels).unwrap_or_default();
        if identity::may_replace(&theirs, &spec.labels) {
            Ok(())
        } else {
            Err(RuntimeError::Refused(format!(
                "the container name {} is taken by a container that is not this sandbox's (its labels name deployment {:?}, sandbox {:?}, state database {:?}); sandboxd leaves it alone: rename or remove it",
                spec.name,
                theirs.get(labels::DEPLOYMENT),
                theirs.get(labels::SANDBOX),
                theirs.get(labels::STATE_ID)
            )))
        }
    }

    /// What a create (of a container with `labels`) or a rename (`None`)
    /// refused with `409 Conflict` for the container name `name` meets:
    /// the holder Docker names in its refusal, inspected. One being
    /// removed (`docker rm -f` answers the kill before the removal is
    /// done), already gone, or left `dead` by a removal that failed (and
    /// this sandbox's to remove: it is removed now) is
    /// [`RuntimeError::NameBeingRemoved`], which the controller waits out.
    /// A live holder keeps Docker's refusal: another sandbox's, state
    /// database's or program's container is never waited for nor touched.
    async fn name_conflict(
        &self,
        op: &'static str,
        name: &str,
        labels: Option<&HashMap<String, String>>,
        refused: DockerError,
    ) -> RuntimeError {
        use bollard::models::ContainerStateStatusEnum as Status;
        let holder = name_holder(&refused.to_string()).unwrap_or(name).to_owned();
        let being_removed = |holder: String| RuntimeError::NameBeingRemoved {
            name: name.to_owned(),
            holder: ContainerId::new(holder),
        };
        let info = match self
            .docker
            .inspect_container(&holder, None::<InspectContainerOptions>)
            .await
        {
            Ok(info) => info,
            Err(e) if is_status(&e, &[404]) && holder != name => return being_removed(holder),
            Err(_) => return api(op, name)(refused),
        };
        let status = info.state.and_then(|s| s.status);
        let theirs = info.config.and_then(|c| c.labels).unwrap_or_default();
        let holder = info.id.unwrap_or(holder);
        match status {
            Some(Status::REMOVING) => being_removed(holder),
            Some(Status::DEAD) if labels.is_some_and(|l| identity::may_replace(&theirs, l)) => {
                tracing::info!(
                    container = name,
                    holder,
                    "the name's holder is dead (its removal failed); removing it again"
                );
                match self.remove_any(&holder, Duration::ZERO).await {
                    Ok(()) => being_removed(holder),
                    Err(e) => e,
                }
            }
            _ => api(op, name)(refused),
        }
    }

    /// Refuses an image that one of sandboxd's own names but that came
    /// from a registry ([`own_image::check_provenance`]), or that lacks
    /// the label `key=value` when one is asked for.
    pub(crate) async fn check_image(
        &self,
        image: &str,
        label: Option<&str>,
    ) -> Result<(), RuntimeError> {
        let info = self
            .docker
            .inspect_image(image)
            .await
            .map_err(api("inspect image", image))?;
        own_image::check_provenance(image, info.repo_digests.as_deref().unwrap_or_default())
            .map_err(|e| RuntimeError::Refused(e.to_string()))?;
        let Some(label) = label else {
            return Ok(());
        };
        let labels = info.config.and_then(|c| c.labels).unwrap_or_default();
        let (key, value) = label.split_once('=').unwrap_or((label, ""));
        if labels.get(key).map(String::as_str) == Some(value) {
            Ok(())
        } else {
            Err(RuntimeError::Refused(format!(
                "image {image} does not carry the label {label}: its entrypoint may not read \
                 secrets from standard input and would start the engine without a password; \
                 rebuild sandboxd's images (deploy/images/build.sh) or point --image at one that does"
            )))
        }
    }

    /// Writes `secret` to the container's standard input and closes it,
    /// within the stream timeout.
    async fn send_stdin(&self, id: &str, name: &str, secret: &Secret) -> Result<(), RuntimeError> {
        let after = self.stream_timeout;
        tokio::time::timeout(after, self.write_stdin(id, name, secret))
            .await
            .unwrap_or_else(|_| {
                Err(RuntimeError::Timeout {
                    op: "write secrets to",
                    target: name.to_owned(),
                    after,
                })
            })
    }

    async fn write_stdin(&self, id: &str, name: &str, secret: &Secret) -> Result<(), RuntimeError> {
        let options = AttachContainerOptionsBuilder::default()
            .stdin(true)
            .stream(true)
            .build();
        let AttachContainerResults { mut input, output } = self
            .docker
            .attach_container(id, Some(options))
            .await
            .map_err(api("attach", name))?;
        drop(output);
        write_secret(&mut input, secret, "write secrets to", name).await
    }

    /// Stops and removes a container by id or name; a missing one is success.
    async fn remove_any(
        &self,
        id_or_name: &str,
        stop_timeout: Duration,
    ) -> Result<(), RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::Remove);
        if !stop_timeout.is_zero() {
            let t = i32::try_from(stop_timeout.as_secs()).unwrap_or(i32::MAX);
            let options = StopContainerOptionsBuilder::default().t(t).build();
            match self.docker.stop_container(id_or_name, Some(options)).await {
                Ok(()) => {}
                // 304: already stopped; 404: already gone.
                Err(e) if is_status(&e, &[304, 404]) => {}
                Err(e) => {
                    tracing::warn!(container = id_or_name, error = %e, "stop failed; removing by force")
                }
            }
        }
        let options = RemoveContainerOptionsBuilder::default()
            .force(true)
            .v(true)
            .build();
        match self
            .docker
            .remove_container(id_or_name, Some(options))
            .await
        {
            Ok(()) => Ok(()),
            // 404: gone; 409: removal already in progress.
            Err(e) if is_status(&e, &[404, 409]) => Ok(()),
            Err(e) => Err(api("remove", id_or_name)(e)),
        }
    }
}

fn observed(
    summary: bollard::models::ContainerSummary,
    deployment: &Deployment,
) -> Option<ObservedContainer> {
    let labels = ContainerLabels::parse(summary.labels.as_ref()?)?;
    if &labels.deployment != deployment {
        return None;
    }
    let paused = summary.state == Some(ContainerSummaryStateEnum::PAUSED);
    let state = listed_state(summary.state?);
    let networks = network_names(&summary);
    let host_port = summary
        .ports
        .unwrap_or_default()
        .iter()
        .find_map(|p| p.public_port);
    Some(ObservedContainer {
        networks,
        id: ContainerId::new(summary.id?),
        name: summary.names?.first()?.trim_start_matches('/').to_owned(),
        labels,
        state,
        created: Utc.timestamp_opt(summary.created?, 0).single()?,
        host_port,
        paused,
    })
}

/// The networks a listed container is on, by name.
fn network_names(summary: &bollard::models::ContainerSummary) -> Vec<String> {
    summary
        .network_settings
        .as_ref()
        .and_then(|s| s.networks.as_ref())
        .map(|n| n.keys().cloned().collect())
        .unwrap_or_default()
}

/// What a listed container's state means to sandboxd (a paused or
/// restarting container counts as running).
fn listed_state(state: ContainerSummaryStateEnum) -> ContainerState {
    match state {
        ContainerSummaryStateEnum::CREATED => ContainerState::Created,
        ContainerSummaryStateEnum::RUNNING
        | ContainerSummaryStateEnum::PAUSED
        | ContainerSummaryStateEnum::RESTARTING => ContainerState::Running,
        ContainerSummaryStateEnum::REMOVING => ContainerState::Removing,
        _ => ContainerState::Exited,
    }
}

/// A listed warm-pool container of `deployment`, if its labels say so.
fn pooled(
    summary: bollard::models::ContainerSummary,
    deployment: &Deployment,
) -> Option<PooledContainer> {
    let networks = network_names(&summary);
    let seen = pool::Seen {
        networks,
        paused: summary.state == Some(ContainerSummaryStateEnum::PAUSED),
        state: listed_state(summary.state?),
        host_port: summary
            .ports
            .unwrap_or_default()
            .iter()
            .find_map(|p| p.public_port),
        id: ContainerId::new(summary.id?),
        name: summary.names?.first()?.trim_start_matches('/').to_owned(),
        created: Utc.timestamp_opt(summary.created?, 0).single()?,
    };
    PooledContainer::from_labels(summary.labels.as_ref()?, deployment, seen)
}

#[async_trait]
impl Host for DockerRuntime {
    async fn ping(&self) -> Result<(), RuntimeError> {
        self.docker
            .ping()
            .await
            .map(|_| ())
            .map_err(|e| RuntimeError::Connect(Box::new(e)))
    }

    async fn host_memory(&self) -> Result<Option<u64>, RuntimeError> {
        let info = self
            .docker
            .info()
            .await
            .map_err(api("info", "the daemon"))?;
        Ok(info
            .mem_total
            .and_then(|m| u64::try_from(m).ok())
            .filter(|m| *m > 0))
    }

    async fn oci_runtimes(&self) -> Result<Option<Vec<String>>, RuntimeError> {
        let info = self
            .docker
            .info()
            .await
            .map_err(api("info", "the daemon"))?;
        Ok(info.runtimes.map(|r| r.into_keys().collect()))
    }
}

#[async_trait]
impl Containers for DockerRuntime {
    async fn list(
        &self,
        deployment: &Deployment,
        sandbox: Option<&SandboxId>,
    ) -> Result<Vec<ObservedContainer>, RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::List);
        let filters = HashMap::from([("label", labels::filters(deployment, sandbox))]);
        let summaries = self.list_all(&filters, deployment).await?;
        let observed: Vec<ObservedContainer> = summaries
            .into_iter()
            .filter_map(|s| observed(s, deployment))
            .collect();
        if sandbox.is_none() {
            // Both states always, so the series exist with no sandbox.
            let mut counts = std::collections::BTreeMap::from([
                (("local".to_owned(), "running"), 0),
                (("local".to_owned(), "exited"), 0),
            ]);
            for c in &observed {
                let state = match c.state {
                    ContainerState::Exited => "exited",
                    _ => "running",
                };
                *counts.entry(("local".to_owned(), state)).or_insert(0) += 1;
            }
            metrics::set_placement(&counts);
        }
        Ok(observed)
    }

    async fn create_and_start(&self, spec: &ContainerSpec) -> Result<ContainerId, RuntimeError> {
        self.check_image(&spec.image, spec.image_label.as_deref())
            .await?;
        self.check_name_owner(spec).await?;
        self.remove_any(&spec.name, Duration::ZERO).await?;
        if let Some(volume) = &spec.volume {
            self.ensure_volume(volume).await?;
        }
        for template in spec.template.iter().chain(&spec.binaries) {
            self.check_template(template).await?;
        }
        if let Some(data) = &spec.start_from {
            self.check_start_from(data).await?;
        }
        let _timer = metrics::time_docker_call(DockerCall::Create);
        let port_key = format!("{}/tcp", spec.port);
        let binding = PortBinding {
            host_ip: Some("127.0.0.1".into()),
            host_port: Some(spec.host_port.map(|p| p.to_string()).unwrap_or_default()),
        };
        let mut mounts: Vec<Mount> = spec.volume.iter().map(|v| mount(v, false)).collect();
        mounts.extend(spec.template.iter().map(|t| mount(t, true)));
        mounts.extend(spec.start_from.iter().map(|f| mount(f, true)));
        mounts.extend(spec.binaries.iter().map(|b| mount(b, true)));
        let host_config = HostConfig {
            mounts: Some(mounts),
            port_bindings: Some(HashMap::from([(port_key.clone(), Some(vec![binding]))])),
            network_mode: Some(spec.network.clone()),
            // The same hardening under any runtime: gVisor adds its kernel.
            runtime: spec.runtime.clone(),
            ..hardened(&spec.user, &spec.limits, &spec.tmpfs)
        };
        let endpoint = EndpointSettings {
            aliases: Some(spec.aliases.clone()),
            ..Default::default()
        };
        let with_stdin = spec.stdin.is_some();
        let body = ContainerCreateBody {
            image: Some(spec.image.clone()),
            user: Some(spec.user.clone()),
            env: Some(spec.env.clone()),
            cmd: (!spec.cmd.is_empty()).then(|| spec.cmd.clone()),
            entrypoint: spec.entrypoint.clone(),
            labels: Some(spec.labels.clone()),
            exposed_ports: Some(vec![port_key]),
            open_stdin: Some(with_stdin),
            stdin_once: Some(with_stdin),
            attach_stdin: Some(with_stdin),
            host_config: Some(host_config),
            networking_config: Some(NetworkingConfig {
                endpoints_config: Some(HashMap::from([(spec.network.clone(), endpoint)])),
            }),
            ..Default::default()
        };
        let options = CreateContainerOptionsBuilder::default()
            .name(&spec.name)
            .build();
        // Docker 20.10 creates a container on a missing network and refuses
        // to start it; either way it says "network … not found" (404).
        let gone = |op: &'static str| {
            move |e: DockerError| {
                if is_status(&e, &[404])
                    && e.to_string()
                        .contains(&format!("network {} not found", spec.network))
                {
                    RuntimeError::NetworkGone {
                        network: spec.network.clone(),
                    }
                } else {
                    api(op, &spec.name)(e)
                }
            }
        };
        let created = match self.docker.create_container(Some(options), body).await {
            Ok(created) => created,
            Err(e) if is_status(&e, &[409]) => {
                return Err(self
                    .name_conflict("create", &spec.name, Some(&spec.labels), e)
                    .await)
            }
            Err(e) => return Err(gone("create")(e)),
        };
        let started = async {
            self.docker
                .start_container(&created.id, None)
                .await
                .map_err(gone("start"))?;
            if let Some(secret) = &spec.stdin {
                self.send_stdin(&created.id, &spec.name, secret).await?;
            }
            Ok::<_, RuntimeError>(())
        };
        if let Err(e) = started.await {
            // Do not leave a container behind that never got going.
            let _ = self.remove_any(&created.id, Duration::ZERO).await;
            return Err(e);
        }
        Ok(ContainerId::new(created.id))
    }

    async fn rename(&self, id: &ContainerId, name: &str) -> Result<(), RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::Rename);
        let options = RenameContainerOptionsBuilder::default().name(name).build();
        match self.docker.rename_container(id.as_str(), options).await {
            Ok(()) => Ok(()),
            Err(e) if is_status(&e, &[409]) => {
                Err(self.name_conflict("rename", name, None, e).await)
            }
            Err(e) => Err(api("rename", name)(e)),
        }
    }

    async fn published_port(&self, id: &ContainerId) -> Result<Option<u16>, RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::Inspect);
        let info = self
            .docker
            .inspect_container(id.as_str(), None::<InspectContainerOptions>)
            .await
            .map_err(api("inspect", id.as_str()))?;
        Ok(info
            .network_settings
            .and_then(|n| n.ports)
            .into_iter()
            .flat_map(|ports| ports.into_values())
            .flatten()
            .flatten()
            .find_map(|b| b.host_port.and_then(|p| p.parse().ok())))
    }

    async fn inspect(&self, id: &ContainerId) -> Result<Option<RunState>, RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::Inspect);
        match self
            .docker
            .inspect_container(id.as_str(), None::<InspectContainerOptions>)
            .await
        {
            Ok(info) => {
                let state = info.state.unwrap_or_default();
                let running = state.running.unwrap_or(false);
                Ok(Some(RunState {
                    running,
                    // Docker keeps the last run's code (0 before any run).
                    exit_code: state.exit_code.filter(|_| !running),
                    oom_killed: state.oom_killed.unwrap_or(false),
                    // Docker says 0001-01-01T00:00:00Z for "never".
                    finished_at: state
                        .finished_at
                        .and_then(|t| chrono::DateTime::parse_from_rfc3339(&t).ok())
                        .map(|t| t.with_timezone(&Utc))
                        .filter(|t| t.timestamp() > 0),
                }))
            }
            Err(e) if is_status(&e, &[404]) => Ok(None),
            Err(e) => Err(api("inspect", id.as_str())(e)),
        }
    }

    async fn remove(&self, id: &ContainerId, stop_timeout: Duration) -> Result<(), RuntimeError> {
        self.remove_any(id.as_str(), stop_timeout).await
    }

    async fn pause(&self, id: &ContainerId) -> Result<(), RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::Pause);
        let mut tries = 1;
        loop {
            match self.docker.pause_container(id.as_str()).await {
                Ok(()) => return Ok(()),
                // 409: already paused (or not running: the next look heals it).
                Err(e) if is_status(&e, &[409]) && e.to_string().contains("already paused") => {
                    return Ok(())
                }
                // The kernel's freezer gives up while a process cannot stop
                // yet, and runc leaves the container thawed ("unable to
                // freeze", seen on a loaded two-core machine): a moment
                // later it freezes.
                Err(e) if tries < FREEZE_TRIES && e.to_string().contains("unable to freeze") => {
                    tracing::debug!(container = %id, error = %e, "the container did not freeze; trying again");
                    tries += 1;
                    tokio::time::sleep(FREEZE_AGAIN_AFTER).await;
                }
                Err(e) => return Err(api("pause", id.as_str())(e)),
            }
        }
    }

    async fn unpause(&self, id: &ContainerId) -> Result<(), RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::Pause);
        match self.docker.unpause_container(id.as_str()).await {
            Ok(()) => Ok(()),
            // 404: gone; 409: not paused.
            Err(e) if is_status(&e, &[404, 409]) => Ok(()),
            Err(e) => Err(api("unpause", id.as_str())(e)),
        }
    }

    async fn logs_tail(&self, id: &ContainerId, lines: usize) -> Result<String, RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::Logs);
        let options = LogsOptionsBuilder::default()
            .stdout(true)
            .stderr(true)
            .tail(&lines.to_string())
            .build();
        let mut out = String::new();
        let mut stream = self.docker.logs(id.as_str(), Some(options));
        while let Some(chunk) =
            next_within(&mut stream, self.stream_timeout, "logs", id.as_str()).await?
        {
            let chunk = chunk.map_err(api("logs", id.as_str()))?;
            out.push_str(&String::from_utf8_lossy(&chunk.into_bytes()));
        }
        Ok(out.trim_end().to_owned())
    }

    async fn pool_containers(
        &self,
        deployment: &Deployment,
    ) -> Result<Vec<PooledContainer>, RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::List);
        let filters = HashMap::from([(
            "label",
            vec![
                format!("{}={}", labels::MANAGED_BY, labels::MANAGER),
                labels::deployment_filter(deployment),
                format!("{}=1", pool::POOL),
            ],
        )]);
        let summaries = self.list_all(&filters, deployment).await?;
        Ok(summaries
            .into_iter()
            .filter_map(|s| pooled(s, deployment))
            .collect())
    }

    fn events(&self, deployment: &Deployment, since: Option<i64>) -> EventStream {
        self.container_events(deployment, since, |actor| actor.id.clone())
    }
}

#[async_trait]
impl Networks for DockerRuntime {
    /// Creates the network if it does not exist (a user-defined bridge, so
    /// containers resolve each other by name).
    ///
    /// Docker allows two networks with one name, so concurrent creators may
    /// race: afterwards every creator keeps the network with the smallest id
    /// and removes the others, so all converge on the same one.
    async fn ensure_network(&self, spec: &NetworkSpec) -> Result<bool, RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::Network);
        let mut ids = self.networks_named(&spec.name).await?;
        let created = ids.is_empty();
        if created {
            self.create_network(spec).await?;
            ids = self.networks_named(&spec.name).await?;
        }
        ids.sort();
        for duplicate in ids.iter().skip(1) {
            match self.docker.remove_network(duplicate).await {
                Ok(()) => {}
                Err(e) if is_status(&e, &[404]) => {}
                Err(e) => return Err(api("remove duplicate network", &spec.name)(e)),
            }
        }
        Ok(created)
    }

    async fn remove_stale_bridges(&self) -> Result<Vec<StaleBridge>, RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::Network);
        // No network of this process is created meanwhile (its bridge
        // would be seen before its network is listed).
        let _one_at_a_time = self.subnet_lock.lock().await;
        // The links first, then the networks that own bridges: a bridge
        // whose network someone else was creating as the links were read
        // is listed with its network by then. And only a bridge every sweep
        // has found stale for a while goes: one caught between its
        // network's creation or removal and Docker's list is stale only
        // for as long as that takes.
        let links = match host_net::links() {
            Ok(links) => links,
            Err(e) => {
                tracing::warn!(error = %e, "stale bridges are not looked for");
                return Ok(Vec::new());
            }
        };
        let networks = self.host_networks().await?;
        if !self.sees_host(&networks) {
            return Ok(Vec::new());
        }
        let owned: HashSet<&str> = networks.bridges.values().map(String::as_str).collect();
        let stale = domain_host_net::stale_bridges(&links, &owned);
        let due = {
            let mut seen = self.stale_seen.lock().unwrap_or_else(|p| p.into_inner());
            domain_host_net::due_for_removal(
                &stale,
                &mut seen,
                std::time::Instant::now(),
                self.stale_bridge_age,
            )
        };
        let mut swept = Vec::new();
        for name in due {
            let outcome = host_net::delete_bridge(name, self.stream_timeout).await;
            swept.push(StaleBridge {
                name: name.to_owned(),
                outcome,
            });
        }
        Ok(swept)
    }

    async fn route_conflict(
        &self,
        id: &ContainerId,
    ) -> Result<Option<RouteConflict>, RuntimeError> {
        let info = match self
            .docker
            .inspect_container(id.as_str(), None::<InspectContainerOptions>)
            .await
        {
            Ok(info) => info,
            Err(e) if is_status(&e, &[404]) => return Ok(None),
            Err(e) => return Err(api("inspect", id.as_str())(e)),
        };
        let endpoints = info
            .network_settings
            .and_then(|n| n.networks)
            .unwrap_or_default();
        let networks = self.host_networks().await?;
        if !self.sees_host(&networks) {
            return Ok(None);
        }
        let (Ok(links), Ok(routes)) = (host_net::links(), host_net::routes()) else {
            return Ok(None);
        };
        let owned: HashSet<&str> = networks.bridges.values().map(String::as_str).collect();
        let stale = domain_host_net::stale_bridges(&links, &owned);
        let mut endpoints: Vec<_> = endpoints.into_iter().collect();
        endpoints.sort_by(|a, b| a.0.cmp(&b.0));
        for (network, endpoint) in endpoints {
            let (Some(bridge), Some(addr)) = (
                networks.bridges.get(&network),
                endpoint.ip_address.as_deref().and_then(|a| a.parse().ok()),
            ) else {
                continue;
            };
            if let Some(conflict) =
                domain_host_net::route_conflict(&routes, addr, &network, bridge, &stale)
            {
                return Ok(Some(conflict));
            }
        }
        Ok(None)
    }

    async fn networks(
        &self,
        deployment: &Deployment,
    ) -> Result<Vec<ObservedResource>, RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::Network);
        let filters = HashMap::from([("label", vec![labels::deployment_filter(deployment)])]);
        let options = ListNetworksOptionsBuilder::default()
            .filters(&filters)
            .build();
        let networks = self
            .docker
            .list_networks(Some(options))
            .await
            .map_err(api("list networks", deployment.as_str()))?;
        Ok(networks
            .into_iter()
            .filter_map(|n| {
                ObservedResource::of(n.name?, &n.labels.unwrap_or_default(), deployment)
            })
            .collect())
    }

    async fn remove_network(
        &self,
        name: &str,
        deployment: &Deployment,
    ) -> Result<(), RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::Network);
        let info = match self
            .docker
            .inspect_network(name, None::<InspectNetworkOptions>)
            .await
        {
            Ok(info) => info,
            Err(e) if is_status(&e, &[404]) => return Ok(()),
            Err(e) => return Err(api("inspect network", name)(e)),
        };
        refuse_unless_ours(
            "network",
            name,
            &info.labels.unwrap_or_default(),
            deployment,
        )?;
        let id = info.id.unwrap_or_else(|| name.to_owned());
        for endpoint in info.containers.unwrap_or_default().into_keys() {
            self.disconnect(&id, &endpoint).await?;
        }
        match self.docker.remove_network(&id).await {
            Ok(()) => Ok(()),
            Err(e) if network_gone(&e) => Ok(()),
            Err(e) => Err(api("remove network", name)(e)),
        }
    }

    async fn network_members(&self, network: &str) -> Result<Option<Vec<String>>, RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::Network);
        match self
            .docker
            .inspect_network(network, None::<InspectNetworkOptions>)
            .await
        {
            Ok(info) => Ok(Some(
                info.containers
                    .unwrap_or_default()
                    .into_values()
                    .filter_map(|c| c.name)
                    .collect(),
            )),
            Err(e) if is_status(&e, &[404]) => Ok(None),
            Err(e) => Err(api("inspect network", network)(e)),
        }
    }

    async fn attach_candidate(&self, name: &str) -> Result<Option<Candidate>, RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::Network);
        // Docker resolves `name` as a full id, an exact name or a unique id
        // prefix; the judgement (`domain::attach`) compares the name.
        let info = match self
            .docker
            .inspect_container(name, None::<InspectContainerOptions>)
            .await
        {
            Ok(info) => info,
            Err(e) if is_status(&e, &[404]) => return Ok(None),
            // An id prefix several containers share (Engine 20.10 says so
            // with a 500): no one container answers to the name. Said as
            // an error, it would tell an orchestrator what ids the host's
            // containers have.
            Err(e)
                if e.to_string()
                    .to_lowercase()
                    .contains("multiple ids found with provided prefix") =>
            {
                return Ok(None)
            }
            Err(e) => return Err(api("inspect", name)(e)),
        };
        let host = info.host_config.unwrap_or_default();
        let mut host_paths = Vec::new();
        for m in info.mounts.unwrap_or_default() {
            match m.typ.as_deref() {
                Some("bind" | "npipe") => host_paths.extend(m.source),
                // A local volume may be a host path or device in disguise
                // (`--opt o=bind --opt device=/`, a capped volume's loop
                // device).
                Some("volume") if m.driver.as_deref().is_none_or(|d| d == "local") => {
                    if let Some(name) = &m.name {
                        host_paths.extend(self.local_volume_device(name).await?);
                    }
                }
                _ => {}
            }
        }
        let devices = host
            .devices
            .unwrap_or_default()
            .into_iter()
            .map(|d| d.path_on_host.unwrap_or_default())
            .chain(host.device_cgroup_rules.unwrap_or_default())
            .chain(
                host.device_requests
                    .unwrap_or_default()
                    .into_iter()
                    .map(|r| format!("device request ({:?})", r.driver.unwrap_or_default())),
            )
            .collect();
        Ok(Some(Candidate {
            id: ContainerId::new(info.id.unwrap_or_default()),
            name: info
                .name
                .unwrap_or_default()
                .trim_start_matches('/')
                .to_owned(),
            labels: info.config.and_then(|c| c.labels).unwrap_or_default(),
            holds: Holds {
                privileged: host.privileged.unwrap_or(false),
                network_mode: host.network_mode.unwrap_or_default(),
                pid_mode: host.pid_mode.unwrap_or_default(),
                ipc_mode: host.ipc_mode.unwrap_or_default(),
                uts_mode: host.uts_mode.unwrap_or_default(),
                userns_mode: host.userns_mode.unwrap_or_default(),
                host_paths,
                cap_add: host.cap_add.unwrap_or_default(),
                devices,
                security_opt: host.security_opt.unwrap_or_default(),
                masked_paths: host.masked_paths.unwrap_or_default(),
                readonly_paths: host.readonly_paths.unwrap_or_default(),
            },
        }))
    }

    async fn connect(&self, network: &str, container: &str) -> Result<(), RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::Network);
        let info = match self
            .docker
            .inspect_container(container, None::<InspectContainerOptions>)
            .await
        {
            Ok(info) => info,
            Err(e) => return Err(api("inspect", container)(e)),
        };
        let connected = info
            .network_settings
            .and_then(|n| n.networks)
            .is_some_and(|n| n.contains_key(network));
        if connected {
            return Ok(());
        }
        let request = NetworkConnectRequest {
            container: container.to_owned(),
            endpoint_config: None,
        };
        match self.docker.connect_network(network, request).await {
            Ok(()) => Ok(()),
            Err(e) if e.to_string().contains("already exists") => Ok(()),
            Err(e) => Err(api("connect to network", container)(e)),
        }
    }

    async fn disconnect(&self, network: &str, container: &str) -> Result<(), RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::Network);
        let request = NetworkDisconnectRequest {
            container: container.to_owned(),
            force: Some(true),
        };
        match self.docker.disconnect_network(network, request).await {
            Ok(()) => Ok(()),
            Err(e) if is_status(&e, &[404]) || e.to_string().contains("is not connected") => Ok(()),
            Err(e) => Err(api("disconnect from network", container)(e)),
        }
    }

    async fn rejoin(
        &self,
        network: &str,
        id: &ContainerId,
        aliases: &[String],
    ) -> Result<(), RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::Network);
        let disconnect = NetworkDisconnectRequest {
            container: id.as_str().to_owned(),
            force: Some(true),
        };
        match self.docker.disconnect_network(network, disconnect).await {
            Ok(()) => {}
            Err(e) if e.to_string().contains("is not connected") => {}
            Err(e) => return Err(api("disconnect from network", id.as_str())(e)),
        }
        let connect = NetworkConnectRequest {
            container: id.as_str().to_owned(),
            endpoint_config: Some(EndpointSettings {
                aliases: Some(aliases.to_vec()),
                ..Default::default()
            }),
        };
        self.docker
            .connect_network(network, connect)
            .await
            .map_err(api("connect to network", id.as_str()))
    }

    fn removed_networks(&self) -> NetworkStream {
        let filters = HashMap::from([
            ("type", vec!["network".to_owned()]),
            ("event", vec!["destroy".to_owned()]),
        ]);
        let options = EventsOptionsBuilder::default().filters(&filters).build();
        let connect_within = self.stream_timeout.max(Duration::from_secs(1));
        self.docker
            .clone()
            .with_timeout(connect_within)
            .events(Some(options))
            .filter_map(|item| async move {
                match item {
                    Err(e) => Some(Err(api("events", "the network event stream")(e))),
                    Ok(event) => event.actor?.attributes?.get("name").cloned().map(Ok),
                }
            })
            .boxed()
    }
}

#[async_trait]
impl Volumes for DockerRuntime {
    async fn volumes(
        &self,
        deployment: &Deployment,
    ) -> Result<Vec<ObservedResource>, RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::Volume);
        let filters = HashMap::from([("label", vec![labels::deployment_filter(deployment)])]);
        let options = ListVolumesOptionsBuilder::default()
            .filters(&filters)
            .build();
        let listed = self
            .docker
            .list_volumes(Some(options))
            .await
            .map_err(api("list volumes", deployment.as_str()))?;
        Ok(listed
            .volumes
            .unwrap_or_default()
            .into_iter()
            .filter_map(|v| ObservedResource::of(v.name, &v.labels, deployment))
            .collect())
    }

    async fn remove_volume(
        &self,
        name: &str,
        deployment: &Deployment,
        disks: Option<&DiskStore>,
    ) -> Result<(), RuntimeError> {
        let info = {
            let _timer = metrics::time_docker_call(DockerCall::Volume);
            match self.docker.inspect_volume(name).await {
                Ok(info) => info,
                Err(e) if is_status(&e, &[404]) => return Ok(()),
                Err(e) => return Err(api("inspect volume", name)(e)),
            }
        };
        refuse_unless_ours("volume", name, &info.labels, deployment)?;
        if let Some(disks) = disks {
            // The file first: a Docker volume left without it (sandboxd
            // stopped in between) is still listed, and removed next time.
            self.release_disk(name, &info.options, disks).await?;
        }
        let _timer = metrics::time_docker_call(DockerCall::Volume);
        match self
            .docker
            .remove_volume(name, None::<RemoveVolumeOptions>)
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if is_status(&e, &[404]) => Ok(()),
            Err(e) => Err(api("remove volume", name)(e)),
        }
    }

    async fn run_template_job(&self, job: &TemplateJob) -> Result<(), RuntimeError> {
        self.check_image(&job.image, None).await?;
        self.remove_any(&job.name, Duration::ZERO).await?;
        self.ensure_template_volume(&job.volume).await?;
        let mut mounts = vec![mount(&job.volume, false)];
        if let Some(binaries) = &job.binaries {
            // Empty when created: Docker copies the image's files into it
            // when the job's container is created.
            self.ensure_template_volume(binaries).await?;
            mounts.push(mount(binaries, false));
        }
        let _timer = metrics::time_docker_call(DockerCall::Create);
        let body = ContainerCreateBody {
            image: Some(job.image.clone()),
            user: Some(job.user.clone()),
            env: Some(job.env.clone()),
            cmd: (!job.cmd.is_empty()).then(|| job.cmd.clone()),
            labels: Some(job.labels.clone()),
            network_disabled: Some(true),
            host_config: Some(HostConfig {
                mounts: Some(mounts),
                network_mode: Some("none".into()),
                ..hardened(&job.user, &job.limits, &job.tmpfs)
            }),
            ..Default::default()
        };
        let options = CreateContainerOptionsBuilder::default()
            .name(&job.name)
            .build();
        self.docker
            .create_container(Some(options), body)
            .await
            .map_err(api("create", &job.name))?;
        let ran = async {
            self.docker
                .start_container(&job.name, None)
                .await
                .map_err(api("start", &job.name))?;
            self.wait_exit(&job.name).await
        }
        .await;
        let outcome = match ran {
            Ok(0) => Ok(()),
            Ok(code) => Err(RuntimeError::TemplateJob {
                name: job.name.clone(),
                code,
                logs: self
                    .logs_tail(&ContainerId::new(job.name.clone()), 15)
                    .await
                    .unwrap_or_else(|e| format!("(logs unavailable: {e})")),
            }),
            Err(e) => Err(e),
        };
        // The job's container is removed whatever happened; a failure to
        // remove it is left to the next job of that name.
        if let Err(e) = self.remove_any(&job.name, Duration::ZERO).await {
            tracing::warn!(container = %job.name, error = %e, "could not remove a template job's container");
        }
        outcome
    }

    async fn fill_volume(
        &self,
        fill: &VolumeFill,
        content: FileContent,
    ) -> Result<(), RuntimeError> {
        self.check_image(&fill.image, None).await?;
        match self.labelled_volume(&fill.volume).await? {
            Some(true) => {}
            Some(false) => {
                return Err(RuntimeError::Refused(format!(
                    "volume {} exists but was not made for this (its labels differ); sandboxd never writes into another's volume: remove or rename it",
                    fill.volume.name
                )))
            }
            None => self.create_volume(&fill.volume, None).await?,
        }
        self.remove_any(&fill.name, Duration::ZERO).await?;
        let archive = one_file_tar(&fill.file, &fill.owner, content).map_err(|e| {
            RuntimeError::Refused(format!(
                "packing {} for volume {}: {e}",
                fill.file, fill.volume.name
            ))
        })?;
        let body = ContainerCreateBody {
            image: Some(fill.image.clone()),
            user: Some(fill.owner.clone()),
            // Never started: Docker mounts the volume for the upload.
            entrypoint: Some(vec!["true".into()]),
            labels: Some(fill.labels.clone()),
            network_disabled: Some(true),
            host_config: Some(HostConfig {
                mounts: Some(vec![mount(&fill.volume, false)]),
                network_mode: Some("none".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let options = CreateContainerOptionsBuilder::default()
            .name(&fill.name)
            .build();
        {
            let _timer = metrics::time_docker_call(DockerCall::Create);
            self.docker
                .create_container(Some(options), body)
                .await
                .map_err(api("create", &fill.name))?;
        }
        let upload = UploadToContainerOptionsBuilder::default()
            .path(&fill.volume.path)
            .build();
        let uploaded = self
            .docker
            .upload_to_container(&fill.name, Some(upload), bollard::body_try_stream(archive))
            .await
            .map_err(api("upload", &fill.name));
        if let Err(e) = self.remove_any(&fill.name, Duration::ZERO).await {
            tracing::warn!(container = %fill.name, error = %e, "could not remove a volume fill's container");
        }
        uploaded
    }

    async fn start_helper(&self, helper: &Helper) -> Result<ContainerId, RuntimeError> {
        self.check_image(&helper.image, None).await?;
        self.remove_any(&helper.name, Duration::ZERO).await?;
        self.ensure_volume(&helper.volume).await?;
        let _timer = metrics::time_docker_call(DockerCall::Create);
        let body = ContainerCreateBody {
            image: Some(helper.image.clone()),
            user: Some(helper.user.clone()),
            // It only waits for the execs; past its lifetime it exits, and
            // Docker removes it.
            entrypoint: Some(vec![
                "sleep".into(),
                helper.lifetime.as_secs().max(1).to_string(),
            ]),
            labels: Some(helper.labels.clone()),
            host_config: Some(HostConfig {
                mounts: Some(vec![mount(&helper.volume, false)]),
                network_mode: Some(format!("container:{}", helper.sees)),
                pid_mode: Some(format!("container:{}", helper.sees)),
                auto_remove: Some(true),
                ..hardened(&helper.user, &helper.limits, &helper.tmpfs)
            }),
            ..Default::default()
        };
        let options = CreateContainerOptionsBuilder::default()
            .name(&helper.name)
            .build();
        let created = self
            .docker
            .create_container(Some(options), body)
            .await
            .map_err(api("create", &helper.name))?;
        if let Err(e) = self.docker.start_container(&helper.name, None).await {
            let _ = self.remove_any(&helper.name, Duration::ZERO).await;
            return Err(api("start", &helper.name)(e));
        }
        Ok(ContainerId::new(created.id))
    }
}

#[async_trait]
impl Images for DockerRuntime {
    async fn image_labels(
        &self,
        image: &str,
    ) -> Result<Option<HashMap<String, String>>, RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::InspectImage);
        match self.docker.inspect_image(image).await {
            Ok(info) => Ok(Some(info.config.and_then(|c| c.labels).unwrap_or_default())),
            Err(e) if is_status(&e, &[404]) => Ok(None),
            Err(e) => Err(api("inspect image", image)(e)),
        }
    }

    async fn image_id(&self, image: &str) -> Result<Option<String>, RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::InspectImage);
        match self.docker.inspect_image(image).await {
            Ok(info) => Ok(info.id),
            Err(e) if is_status(&e, &[404]) => Ok(None),
            Err(e) => Err(api("inspect image", image)(e)),
        }
    }

    async fn pull(&self, image: &str) -> Result<(), RuntimeError> {
        let (name, tag) = split_reference(image);
        let options = CreateImageOptionsBuilder::default()
            .from_image(name)
            .tag(tag)
            .build();
        let _timer = metrics::time_docker_call(DockerCall::Pull);
        let mut stream = self.docker.create_image(Some(options), None, None);
        // A pull that reports no progress for the stream timeout is stuck.
        let silent = |_| RuntimeError::ImageUnavailable {
            image: image.to_owned(),
            reason: format!(
                "the pull reported no progress for {:?}",
                self.stream_timeout
            ),
        };
        while let Some(item) = next_within(&mut stream, self.stream_timeout, "pull", image)
            .await
            .map_err(silent)?
        {
            item.map_err(|e| RuntimeError::ImageUnavailable {
                image: image.to_owned(),
                reason: e.to_string(),
            })?;
        }
        Ok(())
    }
}

#[async_trait]
impl Commands for DockerRuntime {
    async fn exec(
        &self,
        id: &ContainerId,
        cmd: &[&str],
        env: Vec<String>,
    ) -> Result<ExecOutput, RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::Exec);
        let (exec, started) = self.start_exec(id, cmd, env, false).await?;
        let mut output = String::new();
        if let StartExecResults::Attached {
            output: mut stream, ..
        } = started
        {
            while let Some(Ok(chunk)) =
                next_within(&mut stream, self.stream_timeout, "exec", id.as_str()).await?
            {
                output.push_str(&String::from_utf8_lossy(&chunk.into_bytes()));
            }
        }
        let exit_code = self.exec_exit_code(id, &exec).await?;
        Ok(ExecOutput { exit_code, output })
    }

    async fn filter(
        &self,
        id: &ContainerId,
        cmd: &[&str],
        env: Vec<String>,
        mut input: ByteStream<'_>,
        keep: usize,
    ) -> Result<FilterOutput, RuntimeError> {
        use bollard::container::LogOutput;
        /// What of the standard error is kept: enough for a message.
        const STDERR_BYTES: usize = 64 * 1024;
        let _timer = metrics::time_docker_call(DockerCall::Exec);
        let program = cmd.first().copied().unwrap_or("");
        let (exec, started) = self.start_exec(id, cmd, env, true).await?;
        let StartExecResults::Attached {
            output: mut stream,
            input: mut stdin,
        } = started
        else {
            return Err(RuntimeError::Refused(format!(
                "container {id}: `{program}` started detached, so its input could not be written"
            )));
        };
        // Written while the output is read: a process that writes as it
        // reads would otherwise fill its pipe and wait forever. A chunk at
        // a time, as it arrives: the input is never held whole.
        let write = async move {
            while let Some(chunk) = input.next().await {
                let chunk = chunk.map_err(|reason| {
                    RuntimeError::Refused(format!(
                        "container {id}: the input of `{program}` ended early: {reason}"
                    ))
                })?;
                if stdin.write_all(&chunk).await.is_err() {
                    // The process stopped reading (it exited): its exit
                    // code and standard error say why.
                    return Ok(());
                }
            }
            // Closing the write half is the process's end of input.
            let _ = stdin.shutdown().await;
            Ok::<(), RuntimeError>(())
        };
        // No deadline per output item here: a process that reads a long
        // input may print nothing until its end. The whole call is bounded
        // by its caller (controller::guard).
        let read = async {
            let mut stdout = Vec::new();
            let mut stderr = Vec::new();
            while let Some(item) = stream.next().await {
                match item.map_err(api("exec", id.as_str()))? {
                    LogOutput::StdOut { message } => {
                        stdout.extend_from_slice(&message);
                        if stdout.len() > keep {
                            stdout.drain(..stdout.len() - keep);
                        }
                    }
                    LogOutput::StdErr { message } => {
                        let room = STDERR_BYTES.saturating_sub(stderr.len());
                        stderr.extend_from_slice(&message[..message.len().min(room)]);
                    }
                    _ => {}
                }
            }
            Ok((stdout, stderr))
        };
        let ((), (stdout, stderr)) = tokio::try_join!(write, read)?;
        let exit_code = self.exec_exit_code(id, &exec).await?;
        Ok(FilterOutput {
            exit_code,
            stdout,
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
        })
    }
}

/// The container Docker names in a `409 Conflict` refusal of a name
/// (`Conflict. The container name "/x" is already in use by container
/// "<id>". You have to remove (or rename) …`).
fn name_holder(refusal: &str) -> Option<&str> {
    let (_, rest) = refusal.split_once("is already in use by container \"")?;
    let (id, _) = rest.split_once('"')?;
    (!id.is_empty()).then_some(id)
}

/// Splits `repo[:tag]` (registry ports and digests included) into name and tag.
fn split_reference(image: &str) -> (&str, &str) {
    if image.contains('@') {
        return (image, "");
    }
    match image.rsplit_once(':') {
        Some((name, tag)) if !tag.contains('/') => (name, tag),
        _ => (image, "latest"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn a_network_removal_that_finds_it_gone_is_a_removal() {
        let error = |status_code, message: &str| DockerError::DockerResponseServerError {
            status_code,
            message: message.to_owned(),
        };
        for (e, gone) in [
            (error(404, "network x not found"), true),
            (
                error(500, "network d5vbht0uwe9ogwtolriphwyol not found"),
                true,
            ),
            (
                error(500, "error while removing network: has active endpoints"),
                false,
            ),
            (error(403, "not found"), false),
        ] {
            assert_eq!(network_gone(&e), gone, "{e}");
        }
    }

    /// A Docker daemon on a Unix socket that never finishes an answer: the
    /// event stream gets no answer at all, every other request the headers
    /// of a streamed answer and then silence (as a paused container's exec
    /// or a wedged daemon gives). Connections stay open until the process
    /// ends.
    fn silent_daemon() -> std::path::PathBuf {
        use rand::distr::{Alphanumeric, SampleString};
        let path = std::env::temp_dir().join(format!(
            "sandboxd-silent-{}.sock",
            Alphanumeric.sample_string(&mut rand::rng(), 12)
        ));
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            let mut open = Vec::new();
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let mut request = Vec::new();
                let mut byte = [0u8; 1];
                while !request.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap_or(0) == 1 {
                    request.push(byte[0]);
                }
                let line = String::from_utf8_lossy(&request);
                if !line.lines().next().unwrap_or_default().contains("/events") {
                    let _ = conn.write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
                    );
                }
                open.push(conn);
            }
        });
        path
    }

    /// `call`, or a panic if it takes a minute: the test fails, not hangs.
    async fn bounded<T>(call: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(60), call)
            .await
            .expect("a streamed call gave up by itself")
    }

    #[tokio::test]
    async fn a_daemon_that_stops_talking_costs_every_streamed_call_a_timeout_not_a_hang() {
        let after = Duration::from_secs(1);
        let socket = silent_daemon();
        let docker =
            Docker::connect_with_unix(&socket.to_string_lossy(), 120, bollard::API_DEFAULT_VERSION)
                .unwrap();
        let runtime = DockerRuntime {
            docker,
            subnet_lock: Arc::default(),
            stale_seen: Arc::default(),
            stale_bridge_age: domain_host_net::STALE_BRIDGE_AGE,
            stream_timeout: STREAM_TIMEOUT,
            overlay: None,
        }
        .with_stream_timeout(after);

        let err = bounded(runtime.logs_tail(&ContainerId::new("c1"), 5))
            .await
            .unwrap_err();
        assert!(
            matches!(err, RuntimeError::Timeout { op: "logs", .. }),
            "{err}"
        );
        let err = bounded(runtime.pull("sandboxd/none:1")).await.unwrap_err();
        assert!(
            err.to_string()
                .contains("the pull reported no progress for 1s"),
            "{err}"
        );
        let deployment = Deployment::parse("silent").unwrap();
        let first = bounded(runtime.events(&deployment, None).next()).await;
        assert!(
            matches!(first, Some(Err(RuntimeError::Api { op: "events", .. }))),
            "the event stream's connect is bounded: {first:?}"
        );
        let _ = std::fs::remove_file(socket);
    }

    #[test]
    fn a_name_conflict_names_the_container_that_holds_the_name() {
        let cases = [
            (
                r#"Docker responded with status code 409: Conflict. The container name "/sandboxd.d.a.postgres" is already in use by container "3f2a9c". You have to remove (or rename) that container to be able to reuse that name."#,
                Some("3f2a9c"),
            ),
            ("Docker responded with status code 409: removal of container 3f2a9c is already in progress", None),
            (r#"is already in use by container """#, None),
            ("", None),
        ];
        for (refusal, holder) in cases {
            assert_eq!(name_holder(refusal), holder, "{refusal}");
        }
    }

    #[test]
    fn image_references_split_into_name_and_tag() {
        assert_eq!(
            split_reference("postgres:16-alpine"),
            ("postgres", "16-alpine")
        );
        assert_eq!(split_reference("redis"), ("redis", "latest"));
        assert_eq!(
            split_reference("localhost:5000/sandboxd/postgres"),
            ("localhost:5000/sandboxd/postgres", "latest")
        );
        assert_eq!(
            split_reference("localhost:5000/pg:15"),
            ("localhost:5000/pg", "15")
        );
    }
}
