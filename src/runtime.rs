//! The Docker side: a thin layer over bollard that speaks in sandboxd's
//! terms (managed containers, specs, teardown) and turns Docker's errors
//! into messages an operator can act on.

use crate::id::{Deployment, SandboxId};
use crate::labels::{self, ContainerLabels};
use bollard::errors::Error as DockerError;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::models::{
    ContainerCreateBody, ContainerSummaryStateEnum, HostConfig, NetworkCreateRequest, PortBinding,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, CreateImageOptionsBuilder, InspectContainerOptions,
    ListContainersOptionsBuilder, ListNetworksOptionsBuilder, LogsOptionsBuilder,
    RemoveContainerOptionsBuilder, StopContainerOptionsBuilder,
};
use bollard::Docker;
use chrono::{DateTime, TimeZone, Utc};
use futures::StreamExt;
use prometheus::{HistogramOpts, HistogramTimer, HistogramVec};
use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Duration;

/// Failures talking to Docker.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The daemon could not be reached.
    #[error("cannot reach the Docker daemon ({0}); is dockerd running and is DOCKER_HOST or /var/run/docker.sock correct?")]
    Connect(#[source] DockerError),
    /// An image is absent and could not be pulled.
    #[error("image {image} is not present and could not be pulled ({reason}); build local images with deploy/images/build.sh and point --image/--features-image at them")]
    ImageUnavailable {
        /// The image reference.
        image: String,
        /// Why the pull failed.
        reason: String,
    },
    /// A Docker API call failed.
    #[error("docker {op} failed for {target}: {source}")]
    Api {
        /// What sandboxd was doing.
        op: &'static str,
        /// Container, image or network name.
        target: String,
        /// Docker's error.
        #[source]
        source: DockerError,
    },
}

fn api<'a>(op: &'static str, target: &'a str) -> impl FnOnce(DockerError) -> RuntimeError + 'a {
    move |source| RuntimeError::Api {
        op,
        target: target.to_owned(),
        source,
    }
}

/// Duration of Docker operations, by operation; registered by
/// [`crate::metrics::Metrics::new`].
pub static DOCKER_API_SECONDS: LazyLock<HistogramVec> = LazyLock::new(|| {
    HistogramVec::new(
        HistogramOpts::new(
            "sandboxd_docker_api_seconds",
            "Duration of Docker API operations, by operation",
        )
        .buckets(prometheus::exponential_buckets(0.001, 2.0, 16).expect("static buckets")),
        &["operation"],
    )
    .expect("metric definition is valid")
});

fn timer(operation: &str) -> HistogramTimer {
    DOCKER_API_SECONDS
        .with_label_values(&[operation])
        .start_timer()
}

fn is_status(e: &DockerError, codes: &[u16]) -> bool {
    matches!(e, DockerError::DockerResponseServerError { status_code, .. } if codes.contains(status_code))
}

/// Connects to the local Docker daemon and negotiates the API version
/// (the engine may be older than bollard's default, e.g. 20.10 = API 1.41).
pub async fn connect() -> Result<Docker, RuntimeError> {
    let docker = Docker::connect_with_local_defaults().map_err(RuntimeError::Connect)?;
    let docker = docker
        .negotiate_version()
        .await
        .map_err(RuntimeError::Connect)?;
    docker.ping().await.map_err(RuntimeError::Connect)?;
    Ok(docker)
}

/// Coarse container state as sandboxd needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ContainerState {
    /// Created, not started yet.
    Created,
    /// Running (or restarting/paused: alive in some form).
    Running,
    /// Exited or dead.
    Exited,
    /// Being removed.
    Removing,
}

impl ContainerState {
    /// Every state, for metrics.
    pub const ALL: [ContainerState; 4] = [
        ContainerState::Created,
        ContainerState::Running,
        ContainerState::Exited,
        ContainerState::Removing,
    ];

    /// Label value for metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            ContainerState::Created => "created",
            ContainerState::Running => "running",
            ContainerState::Exited => "exited",
            ContainerState::Removing => "removing",
        }
    }
}

/// One managed container as listed from Docker.
#[derive(Debug, Clone)]
pub struct ObservedContainer {
    /// Container id.
    pub id: String,
    /// Container name without the leading slash.
    pub name: String,
    /// What its labels say.
    pub labels: ContainerLabels,
    /// Its state.
    pub state: ContainerState,
    /// When Docker created it.
    pub created: DateTime<Utc>,
    /// Port published on the host for the engine port, if any.
    pub host_port: Option<u16>,
}

/// Lists the containers of `deployment` (optionally only one sandbox's),
/// including stopped ones. Containers with malformed labels are skipped.
pub async fn list_managed(
    docker: &Docker,
    deployment: &Deployment,
    sandbox: Option<&SandboxId>,
) -> Result<Vec<ObservedContainer>, RuntimeError> {
    let _timer = timer("list");
    let filters = HashMap::from([("label", labels::filters(deployment, sandbox))]);
    let options = ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    let summaries = docker
        .list_containers(Some(options))
        .await
        .map_err(api("list", deployment.as_str()))?;
    Ok(summaries
        .into_iter()
        .filter_map(|s| {
            let labels = ContainerLabels::parse(s.labels.as_ref()?)?;
            if &labels.deployment != deployment {
                return None;
            }
            let state = match s.state? {
                ContainerSummaryStateEnum::CREATED => ContainerState::Created,
                ContainerSummaryStateEnum::RUNNING
                | ContainerSummaryStateEnum::PAUSED
                | ContainerSummaryStateEnum::RESTARTING => ContainerState::Running,
                ContainerSummaryStateEnum::REMOVING => ContainerState::Removing,
                _ => ContainerState::Exited,
            };
            let host_port = s
                .ports
                .unwrap_or_default()
                .iter()
                .find_map(|p| p.public_port);
            Some(ObservedContainer {
                id: s.id?,
                name: s.names?.first()?.trim_start_matches('/').to_owned(),
                labels,
                state,
                created: Utc.timestamp_opt(s.created?, 0).single()?,
                host_port,
            })
        })
        .collect())
}

/// Creates the network if it does not exist (a user-defined bridge, so
/// containers resolve each other by name).
///
/// Docker allows two networks with one name, so concurrent creators may
/// race: afterwards every creator keeps the network with the smallest id
/// and removes the others, so all converge on the same one.
pub async fn ensure_network(docker: &Docker, name: &str) -> Result<(), RuntimeError> {
    let _timer = timer("network");
    let mut ids = networks_named(docker, name).await?;
    if ids.is_empty() {
        let request = NetworkCreateRequest {
            name: name.to_owned(),
            driver: Some("bridge".into()),
            labels: Some(HashMap::from([(
                labels::MANAGED_BY.to_owned(),
                labels::MANAGER.to_owned(),
            )])),
            ..Default::default()
        };
        docker
            .create_network(request)
            .await
            .map_err(api("create network", name))?;
        ids = networks_named(docker, name).await?;
    }
    ids.sort();
    for duplicate in ids.iter().skip(1) {
        match docker.remove_network(duplicate).await {
            Ok(()) => {}
            Err(e) if is_status(&e, &[404]) => {}
            Err(e) => return Err(api("remove duplicate network", name)(e)),
        }
    }
    Ok(())
}

/// Ids of the networks called exactly `name`.
async fn networks_named(docker: &Docker, name: &str) -> Result<Vec<String>, RuntimeError> {
    let filters = HashMap::from([("name", vec![name.to_owned()])]);
    let options = ListNetworksOptionsBuilder::default()
        .filters(&filters)
        .build();
    let networks = docker
        .list_networks(Some(options))
        .await
        .map_err(api("list networks", name))?;
    Ok(networks
        .into_iter()
        .filter(|n| n.name.as_deref() == Some(name))
        .filter_map(|n| n.id)
        .collect())
}

/// Whether `image` is present locally.
pub async fn image_exists(docker: &Docker, image: &str) -> Result<bool, RuntimeError> {
    let _timer = timer("inspect_image");
    match docker.inspect_image(image).await {
        Ok(_) => Ok(true),
        Err(e) if is_status(&e, &[404]) => Ok(false),
        Err(e) => Err(api("inspect image", image)(e)),
    }
}

/// Ensures `image` is present: uses it if it is, else pulls it within
/// `timeout`. Returns true when it had to pull.
pub async fn ensure_image(
    docker: &Docker,
    image: &str,
    timeout: Duration,
) -> Result<bool, RuntimeError> {
    if image_exists(docker, image).await? {
        return Ok(false);
    }
    let (name, tag) = split_reference(image);
    let options = CreateImageOptionsBuilder::default()
        .from_image(name)
        .tag(tag)
        .build();
    let _timer = timer("pull");
    let pull = async {
        let mut stream = docker.create_image(Some(options), None, None);
        while let Some(item) = stream.next().await {
            item.map_err(|e| e.to_string())?;
        }
        Ok::<(), String>(())
    };
    let unavailable = |reason: String| RuntimeError::ImageUnavailable {
        image: image.to_owned(),
        reason,
    };
    match tokio::time::timeout(timeout, pull).await {
        Ok(Ok(())) => Ok(true),
        Ok(Err(reason)) => Err(unavailable(reason)),
        Err(_) => Err(unavailable(format!("pull timed out after {timeout:?}"))),
    }
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

/// Everything needed to create one sandbox container.
#[derive(Debug, Clone)]
pub struct ContainerSpec {
    /// Container name.
    pub name: String,
    /// Image reference.
    pub image: String,
    /// Environment (may hold credentials: the image contract requires it).
    pub env: Vec<String>,
    /// Arguments; empty keeps the image's default command.
    pub cmd: Vec<String>,
    /// Labels (never credentials).
    pub labels: HashMap<String, String>,
    /// Engine port inside the container.
    pub port: u16,
    /// Host port to publish on 127.0.0.1; `None` lets Docker choose.
    pub host_port: Option<u16>,
    /// Docker network to attach to.
    pub network: String,
    /// Resource and security limits.
    pub limits: Limits,
    /// Data directory mounted as tmpfs.
    pub tmpfs_path: String,
    /// Capabilities added back after dropping all.
    pub cap_add: Vec<String>,
}

/// Resource caps for sandbox containers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Memory limit in bytes (swap is capped to the same value).
    pub memory_bytes: i64,
    /// CPU limit in billionths of a CPU.
    pub nano_cpus: i64,
    /// Maximum number of processes.
    pub pids: i64,
    /// Size of the tmpfs data directory in bytes.
    pub tmpfs_bytes: i64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            memory_bytes: 512 * 1024 * 1024,
            nano_cpus: 1_000_000_000,
            pids: 256,
            tmpfs_bytes: 512 * 1024 * 1024,
        }
    }
}

/// Removes any container called `spec.name`, then creates and starts the
/// container. Returns its id.
pub async fn create_and_start(
    docker: &Docker,
    spec: &ContainerSpec,
) -> Result<String, RuntimeError> {
    let _timer = timer("create");
    remove(docker, &spec.name, Duration::ZERO).await?;
    let port_key = format!("{}/tcp", spec.port);
    let binding = PortBinding {
        host_ip: Some("127.0.0.1".into()),
        host_port: Some(spec.host_port.map(|p| p.to_string()).unwrap_or_default()),
    };
    let host_config = HostConfig {
        memory: Some(spec.limits.memory_bytes),
        memory_swap: Some(spec.limits.memory_bytes),
        nano_cpus: Some(spec.limits.nano_cpus),
        pids_limit: Some(spec.limits.pids),
        security_opt: Some(vec!["no-new-privileges:true".into()]),
        cap_drop: Some(vec!["ALL".into()]),
        cap_add: Some(spec.cap_add.clone()),
        tmpfs: Some(HashMap::from([(
            spec.tmpfs_path.clone(),
            format!("rw,nosuid,nodev,size={}", spec.limits.tmpfs_bytes),
        )])),
        port_bindings: Some(HashMap::from([(port_key.clone(), Some(vec![binding]))])),
        network_mode: Some(spec.network.clone()),
        ..Default::default()
    };
    let body = ContainerCreateBody {
        image: Some(spec.image.clone()),
        env: Some(spec.env.clone()),
        cmd: (!spec.cmd.is_empty()).then(|| spec.cmd.clone()),
        labels: Some(spec.labels.clone()),
        exposed_ports: Some(vec![port_key]),
        host_config: Some(host_config),
        ..Default::default()
    };
    let options = CreateContainerOptionsBuilder::default()
        .name(&spec.name)
        .build();
    let created = docker
        .create_container(Some(options), body)
        .await
        .map_err(api("create", &spec.name))?;
    if let Err(e) = docker.start_container(&created.id, None).await {
        // Do not leave a created-but-never-started container behind.
        let _ = remove(docker, &created.id, Duration::ZERO).await;
        return Err(api("start", &spec.name)(e));
    }
    Ok(created.id)
}

/// Host port Docker published for the container's first port binding.
pub async fn published_port(docker: &Docker, id: &str) -> Result<Option<u16>, RuntimeError> {
    let _timer = timer("inspect");
    let info = docker
        .inspect_container(id, None::<InspectContainerOptions>)
        .await
        .map_err(api("inspect", id))?;
    Ok(info
        .network_settings
        .and_then(|n| n.ports)
        .into_iter()
        .flat_map(|ports| ports.into_values())
        .flatten()
        .flatten()
        .find_map(|b| b.host_port.and_then(|p| p.parse().ok())))
}

/// The container's state as Docker reports it; `None` if it no longer exists.
async fn inspect_state(
    docker: &Docker,
    id: &str,
) -> Result<Option<bollard::models::ContainerState>, RuntimeError> {
    let _timer = timer("inspect");
    match docker
        .inspect_container(id, None::<InspectContainerOptions>)
        .await
    {
        Ok(info) => Ok(Some(info.state.unwrap_or_default())),
        Err(e) if is_status(&e, &[404]) => Ok(None),
        Err(e) => Err(api("inspect", id)(e)),
    }
}

/// Whether the container is running; `None` if it no longer exists.
pub async fn is_running(docker: &Docker, id: &str) -> Result<Option<bool>, RuntimeError> {
    Ok(inspect_state(docker, id)
        .await?
        .map(|s| s.running.unwrap_or(false)))
}

/// Whether the kernel OOM-killed the container's last run (false if it
/// no longer exists).
pub async fn was_oom_killed(docker: &Docker, id: &str) -> Result<bool, RuntimeError> {
    Ok(inspect_state(docker, id)
        .await?
        .and_then(|s| s.oom_killed)
        .unwrap_or(false))
}

/// Stops the container (SIGTERM, then SIGKILL after `stop_timeout`) and
/// removes it. Idempotent: a missing container is success.
pub async fn remove(
    docker: &Docker,
    id_or_name: &str,
    stop_timeout: Duration,
) -> Result<(), RuntimeError> {
    let _timer = timer("remove");
    if !stop_timeout.is_zero() {
        let t = i32::try_from(stop_timeout.as_secs()).unwrap_or(i32::MAX);
        let options = StopContainerOptionsBuilder::default().t(t).build();
        match docker.stop_container(id_or_name, Some(options)).await {
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
    match docker.remove_container(id_or_name, Some(options)).await {
        Ok(()) => Ok(()),
        // 404: gone; 409: removal already in progress.
        Err(e) if is_status(&e, &[404, 409]) => Ok(()),
        Err(e) => Err(api("remove", id_or_name)(e)),
    }
}

/// The last `lines` lines of the container's output, for error messages.
pub async fn logs_tail(docker: &Docker, id: &str, lines: usize) -> String {
    let _timer = timer("logs");
    let options = LogsOptionsBuilder::default()
        .stdout(true)
        .stderr(true)
        .tail(&lines.to_string())
        .build();
    let mut out = String::new();
    let mut stream = docker.logs(id, Some(options));
    while let Some(Ok(chunk)) = stream.next().await {
        out.push_str(&String::from_utf8_lossy(&chunk.into_bytes()));
    }
    out.trim_end().to_owned()
}

/// Result of a command run inside a container.
#[derive(Debug)]
pub struct ExecOutput {
    /// Exit code (-1 if Docker did not report one).
    pub exit_code: i64,
    /// Combined stdout and stderr.
    pub output: String,
}

/// Runs `cmd` inside the container with extra environment `env`.
pub async fn exec(
    docker: &Docker,
    id: &str,
    cmd: &[&str],
    env: Vec<String>,
) -> Result<ExecOutput, RuntimeError> {
    let _timer = timer("exec");
    let created = docker
        .create_exec(
            id,
            CreateExecOptions {
                cmd: Some(cmd.iter().map(|s| s.to_string()).collect()),
                env: Some(env),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                ..Default::default()
            },
        )
        .await
        .map_err(api("exec", id))?;
    let mut output = String::new();
    if let StartExecResults::Attached {
        output: mut stream, ..
    } = docker
        .start_exec(&created.id, None::<StartExecOptions>)
        .await
        .map_err(api("exec", id))?
    {
        while let Some(Ok(chunk)) = stream.next().await {
            output.push_str(&String::from_utf8_lossy(&chunk.into_bytes()));
        }
    }
    let exit_code = docker
        .inspect_exec(&created.id)
        .await
        .map_err(api("exec inspect", id))?
        .exit_code
        .unwrap_or(-1);
    Ok(ExecOutput { exit_code, output })
}

#[cfg(test)]
mod tests {
    use super::*;

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
