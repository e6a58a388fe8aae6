//! The Swarm adapter: [`Runtime`] over a Docker Swarm manager, each sandbox
//! engine a one-replica service (see docs/swarm.md).
//!
//! The runtime's "container" is the service: its id is the service's id,
//! its state that of the service's current task. Swarm never restarts a
//! task (restart condition `none`): sandboxd heals a service whose task
//! ended by removing it and creating it again with the same credentials,
//! as it re-creates a dead container, and Swarm places the new task on a
//! node that can take it (a drained node's task ends, so draining moves
//! sandboxes). What only a node can do (volumes, `exec`, logs, images,
//! attaching an agent's container to an overlay) goes to the node sandboxd
//! talks to, through the container adapter.

use super::docker::{api, is_status, DockerRuntime, Overlay};
use crate::domain::attach::Candidate;
use crate::domain::container::{
    ByteStream, ContainerState, ExecOutput, FilterOutput, ObservedContainer, RunState,
};
use crate::domain::id::{ContainerId, Deployment, SandboxId};
use crate::domain::identity;
use crate::domain::labels::{self, ContainerLabels};
use crate::domain::limits::Limits;
use crate::domain::pool::{self, PooledContainer};
use crate::metrics::{self, DockerCall};
use crate::ports::runtime::{
    Capabilities, Commands, ContainerSpec, Containers, DiskStore, EventStream, Host, Images,
    NetworkSpec, NetworkStream, Networks, ObservedResource, RuntimeError, TemplateJob, Tmpfs,
    Volume, Volumes,
};
use async_trait::async_trait;
use base64::Engine as _;
use bollard::models::{
    EndpointPortConfig, EndpointPortConfigProtocolEnum, EndpointPortConfigPublishModeEnum,
    EndpointSpec, EndpointSpecModeEnum, Limit, Mount, MountType, MountVolumeOptions,
    MountVolumeOptionsDriverConfig, NetworkAttachmentConfig, Node, NodeSpecAvailabilityEnum,
    NodeState, ResourceObject, SecretSpec, Service, ServiceSpec, ServiceSpecMode,
    ServiceSpecModeReplicated, Task, TaskSpec, TaskSpecContainerSpec, TaskSpecContainerSpecFile,
    TaskSpecContainerSpecSecrets, TaskSpecLogDriver, TaskSpecPlacement, TaskSpecResources,
    TaskSpecRestartPolicy, TaskSpecRestartPolicyConditionEnum, TaskState,
};
use bollard::query_parameters::{
    ListContainersOptionsBuilder, ListNetworksOptionsBuilder, ListSecretsOptionsBuilder,
    ListServicesOptionsBuilder, ListTasksOptionsBuilder, ListVolumesOptionsBuilder,
    RemoveVolumeOptions,
};
use bollard::Docker;
use futures::StreamExt;
use sha2::Digest;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

mod node_exec;
mod template_job;

/// The label naming the container name sandboxd gave a service (service
/// names are shorter and have no dots; see [`service_name`]).
const NAME: &str = "io.sandboxd.name";
/// The label tying a secret or tmpfs volume to its service's name.
const SERVICE: &str = "io.sandboxd.swarm-service";
/// The label naming the deployment of a secret or tmpfs volume. Not
/// [`labels::DEPLOYMENT`]: the controller's own volume collection must not
/// take a running task's scratch space for a sandbox's data.
const PART_OF: &str = "io.sandboxd.swarm-deployment";
/// The label Docker gives a task's container: its service's id.
const TASK_SERVICE_ID: &str = "com.docker.swarm.service.id";
/// Where a service's secret file is mounted; the engine images read it
/// when `SANDBOXD_SECRETS_FILE` names it.
const SECRETS_FILE: &str = "/run/secrets/sandboxd";
/// Secrets and volumes younger than this are never collected as orphans:
/// a service being created has its secret before it exists.
const ORPHAN_AGE: Duration = Duration::from_secs(120);

/// The Swarm backend's runtime.
pub struct SwarmRuntime {
    docker: Docker,
    node: DockerRuntime,
    /// Whether a service publishes its engine port on the node that runs
    /// its task (Swarm's host mode); otherwise engines answer on their
    /// sandbox's overlay only.
    publish_on_host: bool,
    /// The Swarm id of the node `node` is: where persistent sandboxes'
    /// volumes are made, and their services held.
    node_id: String,
    /// SIGTERM-to-SIGKILL time of a service's task (`--stop-timeout`).
    stop_grace: Duration,
    /// Docker names of the overlays this process created or listed, to
    /// sandboxd's (for the network removal stream).
    overlays: std::sync::Arc<std::sync::Mutex<HashMap<String, String>>>,
    /// The nodes each template was built on, or failed on.
    templates: template_job::Built,
    /// The image of the helper that runs commands in engines on other
    /// nodes (`--swarm-helper-image`, see `node_exec`).
    helper_image: String,
}

impl SwarmRuntime {
    /// Uses the Swarm that `node` (connected to a manager) manages; refuses
    /// an engine that is not a Swarm manager. Networks become attachable
    /// overlays, internal unless `publish_on_host` needs the gateway
    /// bridge; then, unless sandboxes may have `egress`, the gateway bridge
    /// must not masquerade (see [`check_gateway_bridge`]). Commands inside
    /// engines on other nodes run in helpers of `helper_image` (see
    /// `node_exec`).
    pub async fn connect(
        node: DockerRuntime,
        publish_on_host: bool,
        egress: bool,
        helper_image: String,
    ) -> Result<Self, RuntimeError> {
        let docker = node.client().clone();
        let info = docker
            .info()
            .await
            .map_err(|e| RuntimeError::Connect(Box::new(e)))?;
        let manager = info
            .swarm
            .as_ref()
            .and_then(|s| s.control_available)
            .unwrap_or(false);
        if !manager {
            return Err(RuntimeError::Refused(
                "--backend swarm needs a Swarm manager, and this Docker engine is none: run `docker swarm init` (or `docker swarm join` as a manager), or point DOCKER_HOST at a manager"
                    .into(),
            ));
        }
        let node_id = info
            .swarm
            .as_ref()
            .and_then(|s| s.node_id.clone())
            .filter(|id| !id.is_empty())
            .ok_or_else(|| {
                RuntimeError::Refused("the Swarm manager did not say its node id".into())
            })?;
        if publish_on_host && !egress {
            check_gateway_bridge(&docker).await?;
        }
        let node = node.with_overlay_networks(Overlay {
            internal_without_egress: !publish_on_host,
        });
        Ok(Self {
            docker,
            node,
            publish_on_host,
            node_id,
            stop_grace: Duration::from_secs(2),
            overlays: Default::default(),
            templates: Default::default(),
            helper_image,
        })
    }

    /// Gives services' tasks `grace` between SIGTERM and SIGKILL (default
    /// 2 s; `sandboxd run` passes `--stop-timeout`).
    pub fn with_stop_grace(mut self, grace: Duration) -> Self {
        self.stop_grace = grace;
        self
    }

    /// The service called `name` (a Docker service name), if any.
    async fn service_named(
        &self,
        name: &str,
    ) -> Result<Option<bollard::models::Service>, RuntimeError> {
        match self.docker.inspect_service(name, None).await {
            Ok(s) => Ok(Some(s)),
            Err(e) if is_status(&e, &[404]) => Ok(None),
            Err(e) => Err(api("inspect service", name)(e)),
        }
    }

    /// The node a persistent sandbox's service is held to (where its data
    /// volume is), if it is held to one and the node is known.
    async fn pinned_node(&self, id: &ContainerId) -> Result<Option<Node>, RuntimeError> {
        let Some(service) = self.service_named(id.as_str()).await? else {
            return Ok(None);
        };
        let constraints = service
            .spec
            .and_then(|s| s.task_template)
            .and_then(|t| t.placement)
            .and_then(|p| p.constraints)
            .unwrap_or_default();
        let Some(node) = constraints.iter().find_map(|c| c.strip_prefix("node.id==")) else {
            return Ok(None);
        };
        match self.docker.inspect_node(node).await {
            Ok(info) => Ok(Some(info)),
            // Removed from the Swarm: said as such.
            Err(e) if is_status(&e, &[404]) => Ok(Some(Node {
                id: Some(node.to_owned()),
                ..Default::default()
            })),
            Err(e) => Err(api("inspect node", node)(e)),
        }
    }

    /// Where `spec`'s service may run: a persistent sandbox on this node
    /// (its data volume is here); one from a template not on the nodes
    /// where the template's job failed.
    fn placement(&self, spec: &ContainerSpec) -> Vec<String> {
        if spec.volume.is_some() {
            return vec![format!("node.id=={}", self.node_id)];
        }
        spec.template
            .as_ref()
            .map(|t| self.templates.avoid(&t.name))
            .unwrap_or_default()
    }

    /// The node the service `id`'s current task was placed on, if any.
    async fn task_node(&self, id: &ContainerId) -> Result<Option<Node>, RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::Inspect);
        let tasks = self.tasks_of(&[id.as_str()]).await?;
        let Some(node) = current(tasks.iter()).and_then(|t| t.node_id.clone()) else {
            return Ok(None);
        };
        self.node_by_id(&node).await
    }

    /// The Swarm node `id`, or `None` once it left the Swarm.
    async fn node_by_id(&self, id: &str) -> Result<Option<Node>, RuntimeError> {
        match self.docker.inspect_node(id).await {
            Ok(info) => Ok(Some(info)),
            Err(e) if is_status(&e, &[404]) => Ok(None),
            Err(e) => Err(api("inspect node", id)(e)),
        }
    }

    /// Remembers that the overlay sandboxd calls `name` is `docker`.
    fn remember(&self, docker: String, name: String) {
        if let Ok(mut map) = self.overlays.lock() {
            map.insert(docker, name);
        }
    }

    /// Overlay ids to sandboxd's names for them (a service's spec names
    /// its networks by id).
    async fn network_names(&self) -> Result<HashMap<String, String>, RuntimeError> {
        let filters = HashMap::from([("driver", vec!["overlay".to_owned()])]);
        let networks = self
            .docker
            .list_networks(Some(
                ListNetworksOptionsBuilder::default()
                    .filters(&filters)
                    .build(),
            ))
            .await
            .map_err(api("list networks", "overlays"))?;
        Ok(networks
            .into_iter()
            .filter_map(|n| {
                let name = n
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(NAME).cloned())
                    .or(n.name)?;
                Some((n.id?, name))
            })
            .collect())
    }

    /// The tasks of the services `ids` (all tasks when there are many).
    async fn tasks_of(&self, ids: &[&str]) -> Result<Vec<Task>, RuntimeError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut filters = HashMap::new();
        if ids.len() <= 64 {
            filters.insert("service", ids.iter().map(|s| (*s).to_owned()).collect());
        }
        let options = ListTasksOptionsBuilder::default().filters(&filters).build();
        match self.docker.list_tasks(Some(options)).await {
            Ok(tasks) => Ok(tasks),
            // A service named in the filter was removed since it was listed
            // (a pool service replaced, a sandbox reaped): Docker refuses
            // the whole filter, so every task is listed and picked here.
            Err(e) if is_status(&e, &[404]) => {
                let all = self
                    .docker
                    .list_tasks(None::<bollard::query_parameters::ListTasksOptions>)
                    .await
                    .map_err(api("list tasks", "services"))?;
                Ok(all
                    .into_iter()
                    .filter(|t| t.service_id.as_deref().is_some_and(|s| ids.contains(&s)))
                    .collect())
            }
            Err(e) => Err(api("list tasks", "services")(e)),
        }
    }

    /// The services labelled with all of `label_filters` (`key=value`),
    /// each with its newest task, and the overlays' ids to sandboxd's names.
    async fn services_with_tasks(
        &self,
        label_filters: Vec<String>,
        deployment: &Deployment,
    ) -> Result<(Vec<(Service, Option<Task>)>, HashMap<String, String>), RuntimeError> {
        let filters = HashMap::from([("label", label_filters)]);
        let services = self
            .docker
            .list_services(Some(
                ListServicesOptionsBuilder::default()
                    .filters(&filters)
                    .build(),
            ))
            .await
            .map_err(api("list services", deployment.as_str()))?;
        let ids: Vec<&str> = services.iter().filter_map(|s| s.id.as_deref()).collect();
        let tasks = self.tasks_of(&ids).await?;
        let mut by_service: HashMap<&str, Vec<&Task>> = HashMap::new();
        for t in &tasks {
            if let Some(s) = t.service_id.as_deref() {
                by_service.entry(s).or_default().push(t);
            }
        }
        let names = self.network_names().await?;
        let listed = services
            .iter()
            .map(|s| {
                let task =
                    s.id.as_deref()
                        .and_then(|id| current(by_service.get(id).into_iter().flatten().copied()));
                (s.clone(), task.cloned())
            })
            .collect();
        Ok((listed, names))
    }

    /// The local containers of the service `id`'s tasks, newest first.
    async fn task_containers(
        &self,
        id: &ContainerId,
        running: bool,
    ) -> Result<Vec<String>, RuntimeError> {
        let mut filters =
            HashMap::from([("label", vec![format!("{TASK_SERVICE_ID}={}", id.as_str())])]);
        if running {
            filters.insert("status", vec!["running".to_owned()]);
        }
        let options = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        let mut found = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(api("list task containers", id.as_str()))?;
        found.sort_by_key(|c| std::cmp::Reverse(c.created.unwrap_or_default()));
        Ok(found.into_iter().filter_map(|c| c.id).collect())
    }

    /// Removes the secrets and this node's tmpfs volumes of the service
    /// called `name`; what is still in use stays for the orphan collection.
    async fn remove_parts(&self, name: &str) {
        self.remove_parts_where(format!("{SERVICE}={name}"), |_, _| true)
            .await;
    }

    /// Removes `deployment`'s secrets and this node's tmpfs volumes whose
    /// service is gone (a removal that could not finish, a crash between
    /// creating a secret and its service), once older than [`ORPHAN_AGE`].
    async fn collect_orphans(&self, deployment: &Deployment, services: &[String]) {
        let removed = self
            .remove_parts_where(format!("{PART_OF}={deployment}"), |labels, created| {
                let orphan = labels
                    .and_then(|l| l.get(SERVICE))
                    .is_some_and(|s| !services.contains(s));
                orphan && past_orphan_age(created)
            })
            .await;
        if removed > 0 {
            tracing::info!(removed, "orphan swarm secrets and tmpfs volumes removed");
        }
        self.collect_exec_jobs(deployment).await;
    }

    /// Removes the secrets and this node's tmpfs volumes labelled `label`
    /// (`key=value`) that `doomed` picks by their labels and creation
    /// time; one still in use (a task still stopping) is left for next
    /// time. Returns how many went.
    async fn remove_parts_where(
        &self,
        label: String,
        doomed: impl Fn(Option<&HashMap<String, String>>, Option<chrono::DateTime<chrono::Utc>>) -> bool,
    ) -> usize {
        let filter = HashMap::from([("label", vec![label])]);
        let mut removed = 0;
        let secrets = self
            .docker
            .list_secrets(Some(
                ListSecretsOptionsBuilder::default()
                    .filters(&filter)
                    .build(),
            ))
            .await
            .unwrap_or_default();
        for s in secrets {
            let labels = s.spec.as_ref().and_then(|s| s.labels.as_ref());
            let (Some(id), true) = (&s.id, doomed(labels, time(s.created_at))) else {
                continue;
            };
            match self.docker.delete_secret(id).await {
                Ok(()) => removed += 1,
                Err(e) => tracing::debug!(secret = id, error = %e, "secret not removed yet"),
            }
        }
        let volumes = self
            .docker
            .list_volumes(Some(
                ListVolumesOptionsBuilder::default()
                    .filters(&filter)
                    .build(),
            ))
            .await
            .map(|v| v.volumes.unwrap_or_default())
            .unwrap_or_default();
        for v in volumes {
            if !doomed(Some(&v.labels), time(v.created_at)) {
                continue;
            }
            match self
                .docker
                .remove_volume(&v.name, None::<RemoveVolumeOptions>)
                .await
            {
                Ok(()) => removed += 1,
                Err(e) => {
                    tracing::debug!(volume = v.name, error = %e, "tmpfs volume not removed yet")
                }
            }
        }
        removed
    }

    /// Sets the placement gauge from each engine's state and the node id
    /// of its current task.
    async fn record_placement(&self, observed: &[(ContainerState, Option<String>)]) {
        let nodes: HashMap<String, String> = self
            .docker
            .list_nodes(None)
            .await
            .unwrap_or_default()
            .into_iter()
            .filter_map(|n| {
                let host = n.description?.hostname?;
                Some((n.id?, host))
            })
            .collect();
        let mut counts = BTreeMap::new();
        for (state, node) in observed {
            let node = node
                .as_ref()
                .map(|id| nodes.get(id).cloned().unwrap_or_else(|| id.clone()))
                .unwrap_or_else(|| "unassigned".to_owned());
            let state = match state {
                ContainerState::Exited => "exited",
                _ => "running",
            };
            *counts.entry((node, state)).or_insert(0) += 1;
        }
        metrics::set_placement(&counts);
    }

    fn refuse(what: &str) -> RuntimeError {
        RuntimeError::Refused(format!(
            "{what} is not available under --backend swarm (see docs/swarm.md)"
        ))
    }
}

/// The bridge through which a task that publishes a port reaches
/// anything beyond its overlay.
pub const GATEWAY_BRIDGE: &str = "docker_gwbridge";

/// Refuses a gateway bridge that masquerades (or allows traffic between
/// its containers): every task that publishes a port is on it, so it would
/// route sandboxes out, or to each other's published ports.
async fn check_gateway_bridge(docker: &Docker) -> Result<(), RuntimeError> {
    let how = "create it before the node joins the Swarm (or after `docker swarm leave`): docker network create --driver bridge --opt com.docker.network.bridge.name=docker_gwbridge --opt com.docker.network.bridge.enable_ip_masquerade=false --opt com.docker.network.bridge.enable_icc=false docker_gwbridge; or pass --allow-egress (WEAKER)";
    let info = match docker
        .inspect_network(
            GATEWAY_BRIDGE,
            None::<bollard::query_parameters::InspectNetworkOptions>,
        )
        .await
    {
        Ok(info) => info,
        Err(e) if is_status(&e, &[404]) => {
            return Err(RuntimeError::Refused(format!(
                "--swarm-publish host puts every task on the network {GATEWAY_BRIDGE}, which does not exist yet on this node: {how}"
            )))
        }
        Err(e) => return Err(api("inspect network", GATEWAY_BRIDGE)(e)),
    };
    let options = info.options.unwrap_or_default();
    let off = |key: &str| options.get(key).map(String::as_str) == Some("false");
    if off("com.docker.network.bridge.enable_ip_masquerade")
        && off("com.docker.network.bridge.enable_icc")
    {
        Ok(())
    } else {
        Err(RuntimeError::Refused(format!(
            "--swarm-publish host puts every task on the network {GATEWAY_BRIDGE}, which masquerades or lets its containers reach each other: sandboxes would have a route out. Remove it and {how}"
        )))
    }
}

/// The Docker name of the service or overlay network sandboxd calls
/// `name`: Swarm wants DNS name components (at most 63 characters, no
/// dots), sandboxd's container and network names are dotted and may be
/// longer. Readable, and unique by a digest of the whole name. Under
/// Swarm, `docker network ls --filter label=io.sandboxd.sandbox=ID` finds
/// a sandbox's overlay; the row's `attach` connects containers by itself.
pub fn docker_name(name: &str) -> String {
    let digest = sha2::Sha256::digest(name.as_bytes());
    let hash = crate::domain::hex::short(&digest);
    let readable: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(63 - 1 - hash.len())
        .collect();
    format!("{}-{hash}", readable.trim_matches('-'))
}

/// Why a persistent sandbox's service cannot run on `node`, the one its
/// data volume is on, or `None` when the node is ready and active. Swarm
/// will not place it elsewhere (the data would not follow), and sandboxd
/// never starts it empty on another node.
fn unavailable(node: &Node) -> Option<String> {
    let name = node
        .description
        .as_ref()
        .and_then(|d| d.hostname.clone())
        .or_else(|| node.id.clone())
        .unwrap_or_default();
    let state = node.status.as_ref().and_then(|s| s.state);
    let availability = node.spec.as_ref().and_then(|s| s.availability);
    let why = match (state, availability) {
        (None, _) => "is no longer in the Swarm".to_owned(),
        (Some(NodeState::READY), Some(NodeSpecAvailabilityEnum::ACTIVE)) => return None,
        (Some(NodeState::READY), Some(other)) => format!(
            "is set to {other} (make it active again: docker node update --availability active {name})"
        ),
        (Some(other), _) => format!("is {other}"),
    };
    Some(format!(
        "its data volume is on the Swarm node {name}, which {why}: the sandbox waits for that node, since its data cannot follow it elsewhere; or release the sandbox, and its data with it"
    ))
}

/// Whether Swarm places new tasks on `node`: ready and active.
fn takes_tasks(node: &Node) -> bool {
    node.status.as_ref().and_then(|s| s.state) == Some(NodeState::READY)
        && node.spec.as_ref().and_then(|s| s.availability) == Some(NodeSpecAvailabilityEnum::ACTIVE)
}

/// Whether a task has ended (or is being made to end): Swarm does not
/// restart it, so its service is dead until sandboxd replaces it.
fn ended(task: &Task) -> bool {
    let state = task.status.as_ref().and_then(|s| s.state);
    let terminal = matches!(
        state,
        Some(
            TaskState::COMPLETE
                | TaskState::SHUTDOWN
                | TaskState::FAILED
                | TaskState::REJECTED
                | TaskState::REMOVE
                | TaskState::ORPHANED
        )
    );
    let told_to_stop = matches!(
        task.desired_state,
        Some(TaskState::SHUTDOWN | TaskState::REMOVE | TaskState::COMPLETE)
    );
    terminal || told_to_stop
}

/// The task that stands for its service: the newest.
fn current<'a>(tasks: impl Iterator<Item = &'a Task>) -> Option<&'a Task> {
    tasks.max_by_key(|t| t.version.as_ref().and_then(|v| v.index).unwrap_or(0))
}

/// The host port a task publishes (host mode).
fn task_port(task: &Task) -> Option<u16> {
    task.status
        .as_ref()?
        .port_status
        .as_ref()?
        .ports
        .as_ref()?
        .iter()
        .find_map(|p| u16::try_from(p.published_port?).ok().filter(|p| *p != 0))
}

/// A service's state: its current task's; a service without a task yet
/// is starting, which counts as alive.
fn service_state(task: Option<&Task>) -> ContainerState {
    match task {
        Some(t) if ended(t) => ContainerState::Exited,
        _ => ContainerState::Running,
    }
}

/// What a listing saw of the service `s` whose newest task is `task`
/// (overlay ids to sandboxd's names: `names`): its name is sandboxd's
/// (the label [`NAME`], which a pool claim moves).
fn seen(s: &Service, task: Option<&Task>, names: &HashMap<String, String>) -> Option<pool::Seen> {
    let spec = s.spec.as_ref()?;
    let networks = spec
        .task_template
        .as_ref()
        .and_then(|t| t.networks.as_ref())
        .map(|n| {
            n.iter()
                .filter_map(|a| a.target.as_ref())
                .map(|t| names.get(t).unwrap_or(t).clone())
                .collect()
        })
        .unwrap_or_default();
    Some(pool::Seen {
        id: ContainerId::new(s.id.clone()?),
        name: spec
            .labels
            .as_ref()
            .and_then(|l| l.get(NAME).cloned())
            .or_else(|| spec.name.clone())
            .unwrap_or_default(),
        state: service_state(task),
        paused: false,
        created: time(s.created_at).unwrap_or_default(),
        host_port: task.and_then(task_port),
        networks,
    })
}

/// One of Swarm's times as sandboxd's.
fn time(t: Option<bollard::models::BollardDate>) -> Option<chrono::DateTime<chrono::Utc>> {
    let nanos = t?.unix_timestamp_nanos();
    let secs = i64::try_from(nanos.div_euclid(1_000_000_000)).ok()?;
    let sub = u32::try_from(nanos.rem_euclid(1_000_000_000)).ok()?;
    chrono::DateTime::from_timestamp(secs, sub)
}

/// Whether something created at `created` is older than [`ORPHAN_AGE`]
/// (unknown: no).
fn past_orphan_age(created: Option<chrono::DateTime<chrono::Utc>>) -> bool {
    created.is_some_and(|c| {
        (chrono::Utc::now() - c)
            .to_std()
            .is_ok_and(|age| age > ORPHAN_AGE)
    })
}

/// The labels that tie a secret or volume to its service.
fn part_labels(owner: &HashMap<String, String>, service: &str) -> HashMap<String, String> {
    let mut l = HashMap::from([(SERVICE.to_owned(), service.to_owned())]);
    if let Some(d) = owner.get(labels::DEPLOYMENT) {
        l.insert(PART_OF.to_owned(), d.clone());
    }
    if let Some(s) = owner.get(labels::SANDBOX) {
        l.insert(labels::SANDBOX.to_owned(), s.clone());
    }
    l.insert(labels::MANAGED_BY.to_owned(), labels::MANAGER.to_owned());
    l
}

/// The `uid` and `gid` of `user` (`uid:gid`), which `what` runs as.
fn uid_gid<'a>(user: &'a str, what: &str) -> Result<(&'a str, &'a str), RuntimeError> {
    user.split_once(':')
        .ok_or_else(|| RuntimeError::Refused(format!("user {user:?} of {what} is not uid:gid")))
}

/// `tmpfs` as local volumes with tmpfs options, named after `instance`,
/// owned by `uid:gid` and labelled `parts` (a service's own tmpfs mount is
/// root-owned on Engine 20.10, see docs/swarm.md).
fn tmpfs_mounts(
    tmpfs: &[Tmpfs],
    instance: &str,
    (uid, gid): (&str, &str),
    parts: &HashMap<String, String>,
) -> Vec<Mount> {
    tmpfs
        .iter()
        .enumerate()
        .map(|(i, t)| Mount {
            target: Some(t.path.clone()),
            source: Some(format!("{instance}-{i}")),
            typ: Some(MountType::VOLUME),
            read_only: Some(false),
            volume_options: Some(MountVolumeOptions {
                labels: Some(parts.clone()),
                driver_config: Some(MountVolumeOptionsDriverConfig {
                    name: Some("local".into()),
                    options: Some(HashMap::from([
                        ("type".to_owned(), "tmpfs".to_owned()),
                        ("device".to_owned(), "tmpfs".to_owned()),
                        (
                            "o".to_owned(),
                            format!(
                                "size={},uid={uid},gid={gid},mode=0700,noexec,nosuid,nodev",
                                t.bytes
                            ),
                        ),
                    ])),
                }),
                ..Default::default()
            }),
            ..Default::default()
        })
        .collect()
}

/// A named volume `v` mounted at its path, read-only or not; one missing
/// on the task's node is made there with the image's directory copied in
/// (and the labels `labels`, if given).
fn named_mount(v: &Volume, read_only: bool, labels: Option<&HashMap<String, String>>) -> Mount {
    Mount {
        target: Some(v.path.clone()),
        source: Some(v.name.clone()),
        typ: Some(MountType::VOLUME),
        read_only: Some(read_only),
        volume_options: labels.map(|l| MountVolumeOptions {
            labels: Some(l.clone()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The CPU, memory and pids caps of a task.
fn caps(limits: &Limits) -> Limit {
    Limit {
        nano_cpus: Some(limits.nano_cpus),
        memory_bytes: Some(limits.memory_bytes),
        pids: Some(limits.pids),
    }
}

/// The json-file log driver with the sandbox's size caps.
fn log_driver(limits: &Limits) -> TaskSpecLogDriver {
    TaskSpecLogDriver {
        name: Some("json-file".into()),
        options: Some(HashMap::from([
            ("max-size".to_owned(), limits.log_bytes.to_string()),
            ("max-file".to_owned(), limits.log_files.to_string()),
        ])),
    }
}

/// Builds the service for `spec`, its secret `secret` (id, name) mounted
/// as [`SECRETS_FILE`], its tmpfs directories on local volumes named after
/// `instance`, its persistent data volume (made already) or its template
/// and binaries, placed by `constraints` (a persistent sandbox's node; the
/// nodes its template's job failed on).
fn service_spec(
    spec: &ContainerSpec,
    service: &str,
    instance: &str,
    secret: Option<(&str, &str)>,
    publish_on_host: bool,
    stop_grace: Duration,
    constraints: Vec<String>,
) -> Result<ServiceSpec, RuntimeError> {
    let (uid, gid) = uid_gid(&spec.user, &spec.name)?;
    let parts = part_labels(&spec.labels, service);
    // The data volume by name: the node's own (no driver options, so
    // Docker uses the volume as made), the image's directory copied into
    // it when it is new, as for a container. A template and the image's
    // binaries are read-only. Where a node lacks them, they are made with
    // their labels (sandboxd's, so that its job may fill them later): the
    // binaries from the image, the template empty, from which the
    // entrypoint refuses to start; sandboxd then starts the sandbox cold
    // and runs the template's job again (see `template_job`).
    let mut mounts: Vec<Mount> = spec
        .volume
        .iter()
        .map(|v| named_mount(v, false, None))
        .collect();
    mounts.extend(
        spec.template
            .iter()
            .chain(&spec.binaries)
            .map(|t| named_mount(t, true, Some(&t.labels))),
    );
    mounts.extend(tmpfs_mounts(&spec.tmpfs, instance, (uid, gid), &parts));
    let mut env = spec.env.clone();
    let mut secrets = Vec::new();
    if let Some((id, name)) = secret {
        env.push(format!("SANDBOXD_SECRETS_FILE={SECRETS_FILE}"));
        secrets.push(TaskSpecContainerSpecSecrets {
            file: Some(TaskSpecContainerSpecFile {
                name: Some("sandboxd".into()),
                uid: Some(uid.to_owned()),
                gid: Some(gid.to_owned()),
                mode: Some(0o400),
            }),
            secret_id: Some(id.to_owned()),
            secret_name: Some(name.to_owned()),
        });
    }
    let mut container_labels = spec.labels.clone();
    container_labels.insert(NAME.to_owned(), spec.name.clone());
    let mut aliases = spec.aliases.clone();
    aliases.push(spec.name.clone());
    let limits = &spec.limits;
    let ports = match publish_on_host {
        false => None,
        // Always a port the node picks, never the one a heal or rotation
        // would keep (`spec.host_port`): Engine 20.10 binds a picked port
        // with one number on IPv4 and another on IPv6, so asking for an old
        // number again collides with another task's other half (measured:
        // "Bind for :::32796 failed: port is already allocated", the task
        // failing at every retry). The status says the new port.
        true => Some(vec![EndpointPortConfig {
            protocol: Some(EndpointPortConfigProtocolEnum::TCP),
            target_port: Some(i64::from(spec.port)),
            published_port: None,
            publish_mode: Some(EndpointPortConfigPublishModeEnum::HOST),
            ..Default::default()
        }]),
    };
    Ok(ServiceSpec {
        name: Some(service.to_owned()),
        labels: Some(container_labels.clone()),
        mode: Some(ServiceSpecMode {
            replicated: Some(ServiceSpecModeReplicated { replicas: Some(1) }),
            ..Default::default()
        }),
        task_template: Some(TaskSpec {
            container_spec: Some(TaskSpecContainerSpec {
                image: Some(spec.image.clone()),
                labels: Some(container_labels),
                command: spec.entrypoint.clone(),
                args: (!spec.cmd.is_empty()).then(|| spec.cmd.clone()),
                env: Some(env),
                user: Some(spec.user.clone()),
                read_only: Some(true),
                mounts: Some(mounts),
                stop_grace_period: Some(i64::try_from(stop_grace.as_nanos()).unwrap_or(i64::MAX)),
                secrets: Some(secrets),
                capability_drop: Some(vec!["ALL".into()]),
                ..Default::default()
            }),
            resources: Some(TaskSpecResources {
                limits: Some(caps(limits)),
                // Reserve what the caps allow, so Swarm never places more
                // on a node than its memory holds.
                reservations: Some(ResourceObject {
                    memory_bytes: Some(limits.memory_bytes),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            restart_policy: Some(TaskSpecRestartPolicy {
                condition: Some(TaskSpecRestartPolicyConditionEnum::NONE),
                ..Default::default()
            }),
            placement: (!constraints.is_empty()).then(|| TaskSpecPlacement {
                constraints: Some(constraints),
                ..Default::default()
            }),
            networks: Some(vec![NetworkAttachmentConfig {
                target: Some(docker_name(&spec.network)),
                aliases: Some(aliases),
                ..Default::default()
            }]),
            log_driver: Some(log_driver(limits)),
            ..Default::default()
        }),
        endpoint_spec: Some(EndpointSpec {
            mode: Some(EndpointSpecModeEnum::DNSRR),
            ports,
        }),
        ..Default::default()
    })
}

#[async_trait]
impl Host for SwarmRuntime {
    async fn ping(&self) -> Result<(), RuntimeError> {
        self.node.ping().await
    }

    /// The memory of the Swarm's ready, active nodes together (what its
    /// placement shares out; whether one node holds a sandbox is Swarm's
    /// placement by reservation, which says so when none does). `None`
    /// when no node says.
    async fn host_memory(&self) -> Result<Option<u64>, RuntimeError> {
        let nodes = self
            .docker
            .list_nodes(None)
            .await
            .map_err(api("list nodes", "the swarm"))?;
        let total: u64 = nodes
            .into_iter()
            .filter(takes_tasks)
            .filter_map(|n| n.description?.resources?.memory_bytes)
            .filter_map(|m| u64::try_from(m).ok())
            .sum();
        Ok(Some(total).filter(|t| *t > 0))
    }

    /// None: a Swarm service runs under each node's default runtime.
    async fn oci_runtimes(&self) -> Result<Option<Vec<String>>, RuntimeError> {
        Ok(Some(Vec::new()))
    }

    /// A task's networks, aliases and name are fixed at its service's
    /// creation, and a task may run on a node without a copy made on
    /// another.
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            rejoins: false,
            renames: false,
            local_copies: false,
        }
    }
}

#[async_trait]
impl Containers for SwarmRuntime {
    async fn list(
        &self,
        deployment: &Deployment,
        sandbox: Option<&SandboxId>,
    ) -> Result<Vec<ObservedContainer>, RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::List);
        let (services, names) = self
            .services_with_tasks(labels::filters(deployment, sandbox), deployment)
            .await?;
        let mut observed = Vec::with_capacity(services.len());
        let mut placement = Vec::new();
        for (s, task) in &services {
            let Some(l) = s.spec.as_ref().and_then(|spec| spec.labels.as_ref()) else {
                continue;
            };
            // A claimed pool service carries its sandbox's labels too: the
            // pool reads it (through its recorded claim), not the list.
            if l.contains_key(pool::POOL) {
                continue;
            }
            let Some(parsed) = ContainerLabels::parse(l) else {
                continue;
            };
            if &parsed.deployment != deployment {
                continue;
            }
            let Some(seen) = seen(s, task.as_ref(), &names) else {
                continue;
            };
            placement.push((seen.state, task.as_ref().and_then(|t| t.node_id.clone())));
            observed.push(ObservedContainer {
                id: seen.id,
                name: seen.name,
                labels: parsed,
                state: seen.state,
                created: seen.created,
                host_port: seen.host_port,
                networks: seen.networks,
                // Services are never paused (see `Containers::pause`).
                paused: false,
            });
        }
        if sandbox.is_none() {
            self.record_placement(&placement).await;
            let names: Vec<String> = services
                .iter()
                .filter_map(|(s, _)| s.spec.as_ref()?.name.clone())
                .collect();
            self.collect_orphans(deployment, &names).await;
        }
        Ok(observed)
    }

    async fn create_and_start(&self, spec: &ContainerSpec) -> Result<ContainerId, RuntimeError> {
        if let Some(runtime) = &spec.runtime {
            return Err(RuntimeError::Refused(format!(
                "a Swarm service cannot choose its OCI runtime ({runtime}): isolation gvisor is refused under --backend swarm; ask for isolation 'container' or run the docker backend"
            )));
        }
        if spec.start_from.is_some() {
            return Err(RuntimeError::Refused(
                "forks and data-file seeds are not served under --backend swarm (their volume is on one node): run the docker backend for them".into(),
            ));
        }
        let _timer = metrics::time_docker_call(DockerCall::Create);
        self.node
            .check_image(&spec.image, spec.image_label.as_deref())
            .await?;
        // A persistent sandbox's data volume (capped, as on one host) is
        // made on this node, where sandboxd can run the job that attaches
        // its file system, and its service is held here: on any other node
        // the same name would be a new, empty volume.
        if let Some(volume) = &spec.volume {
            self.node.ensure_volume(volume).await?;
        }
        let service = docker_name(&spec.name);
        if let Some(existing) = self.service_named(&service).await? {
            let theirs = existing
                .spec
                .as_ref()
                .and_then(|s| s.labels.clone())
                .unwrap_or_default();
            if !identity::may_replace(&theirs, &spec.labels) {
                return Err(RuntimeError::Refused(format!(
                    "the service name {service} is taken by a service that is not this sandbox's (its labels name deployment {:?}, sandbox {:?}, state database {:?}); sandboxd leaves it alone: remove it",
                    theirs.get(labels::DEPLOYMENT),
                    theirs.get(labels::SANDBOX),
                    theirs.get(labels::STATE_ID)
                )));
            }
            if let Some(id) = existing.id {
                self.remove(&ContainerId::new(id), Duration::ZERO).await?;
            }
        }
        let nonce: String = (0..4)
            .map(|_| format!("{:02x}", rand::random::<u8>()))
            .collect();
        // Secret names are at most 64 characters too.
        let instance = docker_name(&format!("{}.{nonce}", spec.name));
        let secret = match &spec.stdin {
            None => None,
            Some(s) => {
                let created = self
                    .docker
                    .create_secret(SecretSpec {
                        name: Some(instance.clone()),
                        labels: Some(part_labels(&spec.labels, &service)),
                        data: Some(
                            base64::engine::general_purpose::STANDARD.encode(s.expose().as_bytes()),
                        ),
                        ..Default::default()
                    })
                    .await
                    .map_err(api("create secret for", &service))?;
                Some(created.id)
            }
        };
        let body = service_spec(
            spec,
            &service,
            &instance,
            secret.as_deref().map(|id| (id, instance.as_str())),
            self.publish_on_host,
            self.stop_grace,
            self.placement(spec),
        )?;
        match self.docker.create_service(body, None).await {
            Ok(created) => {
                let id = created.id.ok_or_else(|| {
                    RuntimeError::Refused(format!("docker created {service} without an id"))
                })?;
                tracing::debug!(service, id, "service created");
                Ok(ContainerId::new(id))
            }
            Err(e) => {
                if let Some(id) = &secret {
                    let _ = self.docker.delete_secret(id).await;
                }
                Err(api("create service", &service)(e))
            }
        }
    }

    /// A service cannot be renamed: sandboxd's name for it is the label
    /// [`NAME`], which is changed in place (see [`Containers::claim_as`]).
    /// Rotations under Swarm are in place and never rename.
    async fn rename(&self, id: &ContainerId, name: &str) -> Result<(), RuntimeError> {
        self.claim_as(id, name, &HashMap::new()).await
    }

    /// Moves the sandbox's `labels` and its name `name` (the label
    /// [`NAME`]) onto the claimed pool service's own labels, which change
    /// without restarting its task (its task's labels, networks and
    /// aliases are fixed: its Docker name stays, see `probe_host`, and its
    /// pool label too, so that it is still listed as the claimed pool
    /// service the recorded claim names). `docker service ls --filter
    /// label=io.sandboxd.sandbox=ID` then finds it.
    async fn claim_as(
        &self,
        id: &ContainerId,
        name: &str,
        labels: &HashMap<String, String>,
    ) -> Result<(), RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::Rename);
        let Some(service) = self.service_named(id.as_str()).await? else {
            return Err(RuntimeError::Refused(format!(
                "service {id} is gone: it cannot become {name}"
            )));
        };
        let version = service
            .version
            .and_then(|v| v.index)
            .ok_or_else(|| RuntimeError::Refused(format!("service {id} has no version")))?;
        let mut spec = service.spec.unwrap_or_default();
        let own = spec.labels.get_or_insert_with(HashMap::new);
        own.extend(labels.clone());
        own.insert(NAME.to_owned(), name.to_owned());
        let options = bollard::query_parameters::UpdateServiceOptionsBuilder::default()
            .version(i32::try_from(version).unwrap_or(i32::MAX))
            .build();
        self.docker
            .update_service(id.as_str(), spec, options, None)
            .await
            .map_err(api("label service", name))?;
        Ok(())
    }

    /// The service's Docker name: Swarm's DNS answers it with the task's
    /// address on every overlay the service is on, under whichever name
    /// sandboxd gave it since (a claimed pool service keeps its own).
    async fn probe_host(&self, id: &ContainerId, name: &str) -> Result<String, RuntimeError> {
        Ok(self
            .service_named(id.as_str())
            .await?
            .and_then(|s| s.spec?.name)
            .unwrap_or_else(|| docker_name(name)))
    }

    async fn published_port(&self, id: &ContainerId) -> Result<Option<u16>, RuntimeError> {
        if !self.publish_on_host {
            return Ok(None);
        }
        let _timer = metrics::time_docker_call(DockerCall::Inspect);
        // Host mode: the port is the task's, known once it runs.
        for _ in 0..50 {
            let tasks = self.tasks_of(&[id.as_str()]).await?;
            match current(tasks.iter()) {
                Some(t) if ended(t) => return Ok(None),
                Some(t) => {
                    if let Some(port) = task_port(t) {
                        return Ok(Some(port));
                    }
                }
                None => {}
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(None)
    }

    /// The address of the node that runs the service's task, unless it
    /// is this host's loopback (a single-node Swarm advertised there).
    async fn published_host(&self, id: &ContainerId) -> Result<Option<String>, RuntimeError> {
        if !self.publish_on_host {
            return Ok(None);
        }
        Ok(self
            .task_node(id)
            .await?
            .and_then(|n| n.status)
            .and_then(|s| s.addr)
            .filter(|a| !a.is_empty() && a != "127.0.0.1" && a != "0.0.0.0"))
    }

    async fn node_of(&self, id: &ContainerId) -> Result<Option<String>, RuntimeError> {
        Ok(self
            .task_node(id)
            .await?
            .and_then(|n| n.description)
            .and_then(|d| d.hostname))
    }

    async fn inspect(&self, id: &ContainerId) -> Result<Option<RunState>, RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::Inspect);
        if self.service_named(id.as_str()).await?.is_none() {
            return Ok(None);
        }
        let tasks = self.tasks_of(&[id.as_str()]).await?;
        let task = current(tasks.iter());
        let running = service_state(task) == ContainerState::Running;
        let status = task.and_then(|t| t.status.as_ref());
        let oom_killed = status
            .and_then(|s| s.err.as_deref())
            .is_some_and(|e| e.contains("OOM"));
        Ok(Some(RunState {
            running,
            oom_killed,
            finished_at: if running {
                None
            } else {
                time(status.and_then(|s| s.timestamp))
            },
            exit_code: if running {
                None
            } else {
                status
                    .and_then(|s| s.container_status.as_ref())
                    .and_then(|c| c.exit_code)
            },
        }))
    }

    async fn remove(&self, id: &ContainerId, stop_timeout: Duration) -> Result<(), RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::Remove);
        let Some(service) = self.service_named(id.as_str()).await? else {
            return Ok(());
        };
        let name = service
            .spec
            .and_then(|s| s.name)
            .unwrap_or_else(|| id.to_string());
        match self.docker.delete_service(id.as_str()).await {
            Ok(()) => {}
            Err(e) if is_status(&e, &[404]) => {}
            Err(e) => return Err(api("remove service", &name)(e)),
        }
        // Swarm stops the task on its own time: wait (on this node) until
        // its container is gone, so its host port and name are free and its
        // volumes can go.
        let until = tokio::time::Instant::now() + stop_timeout + Duration::from_secs(10);
        while tokio::time::Instant::now() < until {
            if self.task_containers(id, false).await?.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.remove_parts(&name).await;
        Ok(())
    }

    async fn logs_tail(&self, id: &ContainerId, lines: usize) -> Result<String, RuntimeError> {
        if let Some(container) = self.task_containers(id, false).await?.into_iter().next() {
            return self
                .node
                .logs_tail(&ContainerId::new(container), lines)
                .await;
        }
        // The task runs on another node, or never started: say what Swarm
        // says, and why a service held to its data's node cannot move.
        let tasks = self.tasks_of(&[id.as_str()]).await?;
        let swarm_says = current(tasks.iter())
            .and_then(|t| t.status.as_ref())
            .map(|s| {
                format!(
                    "(task on another node or not started) {} {}",
                    s.message.as_deref().unwrap_or_default(),
                    s.err.as_deref().unwrap_or_default()
                )
            })
            .unwrap_or_default();
        Ok(match self.pinned_node(id).await? {
            Some(node) => match unavailable(&node) {
                Some(why) => format!("{why}\n{swarm_says}"),
                None => swarm_says,
            },
            None => swarm_says,
        })
    }

    /// Refused: Swarm does not know a paused task (it keeps reporting it
    /// running, and a task moved to another node would thaw), so a
    /// sandbox that asks to pause when idle fails with this message.
    async fn pause(&self, id: &ContainerId) -> Result<(), RuntimeError> {
        Err(RuntimeError::Refused(format!(
            "cannot pause service {id}: pausing idle sandboxes needs --backend docker; with --backend swarm set the row's idle_action to 'release'"
        )))
    }

    /// Nothing is ever paused on Swarm (see `pause`).
    async fn unpause(&self, _id: &ContainerId) -> Result<(), RuntimeError> {
        Ok(())
    }

    /// The pool services of `deployment`, each as its newest task runs.
    async fn pool_containers(
        &self,
        deployment: &Deployment,
    ) -> Result<Vec<PooledContainer>, RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::List);
        let filters = vec![
            format!("{}={}", labels::MANAGED_BY, labels::MANAGER),
            labels::deployment_filter(deployment),
            format!("{}=1", pool::POOL),
        ];
        let (services, names) = self.services_with_tasks(filters, deployment).await?;
        Ok(services
            .iter()
            .filter_map(|(s, task)| {
                let labels = s.spec.as_ref()?.labels.as_ref()?;
                PooledContainer::from_labels(labels, deployment, seen(s, task.as_ref(), &names)?)
            })
            .collect())
    }

    /// The container events of this node's tasks, each as its service's:
    /// a task that dies elsewhere is seen at the next relist.
    fn events(&self, deployment: &Deployment, since: Option<i64>) -> EventStream {
        self.node.container_events(deployment, since, |actor| {
            actor.attributes.as_ref()?.get(TASK_SERVICE_ID).cloned()
        })
    }
}

#[async_trait]
impl Networks for SwarmRuntime {
    /// An attachable overlay under its Docker name ([`docker_name`]),
    /// labelled with sandboxd's.
    async fn ensure_network(&self, spec: &NetworkSpec) -> Result<bool, RuntimeError> {
        let mut overlay = spec.clone();
        overlay.name = docker_name(&spec.name);
        overlay.labels.insert(NAME.to_owned(), spec.name.clone());
        self.remember(overlay.name.clone(), spec.name.clone());
        self.node.ensure_network(&overlay).await
    }

    async fn networks(
        &self,
        deployment: &Deployment,
    ) -> Result<Vec<ObservedResource>, RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::Network);
        let filters = HashMap::from([("label", vec![labels::deployment_filter(deployment)])]);
        let networks = self
            .docker
            .list_networks(Some(
                ListNetworksOptionsBuilder::default()
                    .filters(&filters)
                    .build(),
            ))
            .await
            .map_err(api("list networks", deployment.as_str()))?;
        Ok(networks
            .into_iter()
            .filter_map(|n| {
                let labels = n.labels.unwrap_or_default();
                let docker = n.name?;
                let name = labels.get(NAME).cloned().unwrap_or_else(|| docker.clone());
                self.remember(docker, name.clone());
                ObservedResource::of(name, &labels, deployment)
            })
            .collect())
    }

    async fn remove_network(
        &self,
        name: &str,
        deployment: &Deployment,
    ) -> Result<(), RuntimeError> {
        self.node
            .remove_network(&docker_name(name), deployment)
            .await
    }

    /// The containers on the overlay on this node, a task's under the
    /// container name sandboxd gave its service, and the services attached
    /// to it wherever their tasks run.
    async fn network_members(&self, network: &str) -> Result<Option<Vec<String>>, RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::Network);
        let info = match self
            .docker
            .inspect_network(
                &docker_name(network),
                None::<bollard::query_parameters::InspectNetworkOptions>,
            )
            .await
        {
            Ok(info) => info,
            Err(e) if is_status(&e, &[404]) => return Ok(None),
            Err(e) => return Err(api("inspect network", network)(e)),
        };
        let Some(id) = info.id else {
            return Ok(None);
        };
        let filters = HashMap::from([("network", vec![id.clone()])]);
        let local = self
            .docker
            .list_containers(Some(
                ListContainersOptionsBuilder::default()
                    .filters(&filters)
                    .build(),
            ))
            .await
            .map_err(api("list containers on", network))?;
        let services = self
            .docker
            .list_services(Some(
                ListServicesOptionsBuilder::default()
                    .filters(&HashMap::from([("label", vec![NAME.to_owned()])]))
                    .build(),
            ))
            .await
            .map_err(api("list services on", network))?;
        // A task of sandboxd's services is named below by its service,
        // whose name a pool claim moves (its container's labels keep the
        // pool's).
        let ours = |c: &bollard::models::ContainerSummary| {
            let service = c.labels.as_ref().and_then(|l| l.get(TASK_SERVICE_ID));
            services
                .iter()
                .any(|s| s.id.is_some() && s.id.as_ref() == service)
        };
        let mut members: Vec<String> = local
            .into_iter()
            .filter(|c| !ours(c))
            .filter_map(|c| {
                c.labels
                    .as_ref()
                    .and_then(|l| l.get(NAME).cloned())
                    .or_else(|| Some(c.names?.first()?.trim_start_matches('/').to_owned()))
            })
            .collect();
        for s in services {
            let Some(spec) = s.spec else { continue };
            let attached = spec
                .task_template
                .as_ref()
                .and_then(|t| t.networks.as_ref())
                .is_some_and(|n| {
                    n.iter()
                        .any(|a| a.target.as_deref().is_some_and(|t| t == id))
                });
            if let Some(name) = spec.labels.and_then(|mut l| l.remove(NAME)) {
                if attached && !members.contains(&name) {
                    members.push(name);
                }
            }
        }
        Ok(Some(members))
    }

    /// The container on the node sandboxd talks to, as the container
    /// adapter sees it: an agent is attached to an overlay from that node,
    /// judged by the same rule.
    async fn attach_candidate(&self, name: &str) -> Result<Option<Candidate>, RuntimeError> {
        self.node.attach_candidate(name).await
    }

    async fn connect(&self, network: &str, container: &str) -> Result<(), RuntimeError> {
        self.node.connect(&docker_name(network), container).await
    }

    async fn disconnect(&self, network: &str, container: &str) -> Result<(), RuntimeError> {
        self.node.disconnect(&docker_name(network), container).await
    }

    async fn rejoin(
        &self,
        _network: &str,
        _id: &ContainerId,
        _aliases: &[String],
    ) -> Result<(), RuntimeError> {
        Err(Self::refuse("changing a running service's aliases"))
    }

    /// Removed overlays under sandboxd's names for them, as far as this
    /// process has seen them created or listed.
    fn removed_networks(&self) -> NetworkStream {
        let overlays = self.overlays.clone();
        self.node
            .removed_networks()
            .map(move |item| {
                item.map(|docker| {
                    overlays
                        .lock()
                        .ok()
                        .and_then(|m| m.get(&docker).cloned())
                        .unwrap_or(docker)
                })
            })
            .boxed()
    }
}

#[async_trait]
impl Volumes for SwarmRuntime {
    async fn volumes(
        &self,
        deployment: &Deployment,
    ) -> Result<Vec<ObservedResource>, RuntimeError> {
        self.node.volumes(deployment).await
    }

    async fn remove_volume(
        &self,
        name: &str,
        deployment: &Deployment,
        disks: Option<&DiskStore>,
    ) -> Result<(), RuntimeError> {
        self.node.remove_volume(name, deployment, disks).await
    }

    /// One template per node: a global job (see [`template_job`]).
    async fn run_template_job(&self, job: &TemplateJob) -> Result<(), RuntimeError> {
        self.run_global_template_job(job).await
    }
}

#[async_trait]
impl Images for SwarmRuntime {
    async fn image_labels(
        &self,
        image: &str,
    ) -> Result<Option<HashMap<String, String>>, RuntimeError> {
        self.node.image_labels(image).await
    }

    async fn image_id(&self, image: &str) -> Result<Option<String>, RuntimeError> {
        self.node.image_id(image).await
    }

    async fn pull(&self, image: &str) -> Result<(), RuntimeError> {
        self.node.pull(image).await
    }
}

#[async_trait]
impl Commands for SwarmRuntime {
    /// On this node, `docker exec` in the task's container; on another,
    /// through the node-exec helper (see `node_exec`).
    async fn filter(
        &self,
        id: &ContainerId,
        cmd: &[&str],
        env: Vec<String>,
        input: ByteStream<'_>,
        keep: usize,
    ) -> Result<FilterOutput, RuntimeError> {
        // Only on this node: the helper that reaches another node's tasks
        // takes no input.
        match self.task_containers(id, true).await?.into_iter().next() {
            Some(container) => {
                self.node
                    .filter(&ContainerId::new(container), cmd, env, input, keep)
                    .await
            }
            None => Err(RuntimeError::Refused(format!(
                "service {id}: `{}` with input runs only in a task on the controller's own node, and this one has none there",
                cmd.first().unwrap_or(&"")
            ))),
        }
    }

    async fn exec(
        &self,
        id: &ContainerId,
        cmd: &[&str],
        env: Vec<String>,
    ) -> Result<ExecOutput, RuntimeError> {
        if let Some(container) = self.task_containers(id, true).await?.into_iter().next() {
            return self.node.exec(&ContainerId::new(container), cmd, env).await;
        }
        // On another node: through the helper (see `node_exec`), which
        // takes no environment (its spec would show it).
        let tasks = self.tasks_of(&[id.as_str()]).await?;
        let task = current(tasks.iter()).filter(|t| !ended(t));
        let placed = task.and_then(|t| {
            let status = t.status.as_ref()?;
            let container = status.container_status.as_ref()?.container_id.clone()?;
            (status.state == Some(TaskState::RUNNING)).then_some((t, container))
        });
        let Some((task, container)) = placed else {
            return Err(RuntimeError::Refused(format!(
                "service {id} has no running task: ask again once the sandbox is ready"
            )));
        };
        if !env.is_empty() {
            return Err(RuntimeError::Refused(format!(
                "service {id}: a command with environment cannot run on another node (the helper job's spec would show it)"
            )));
        }
        let node_id = task.node_id.clone().unwrap_or_default();
        // The hostname, for messages; the id when the node cannot say.
        let node = self
            .node_by_id(&node_id)
            .await
            .ok()
            .flatten()
            .and_then(|n| n.description?.hostname)
            .unwrap_or_else(|| node_id.clone());
        let deployment = task
            .spec
            .as_ref()
            .and_then(|s| s.container_spec.as_ref())
            .and_then(|c| c.labels.as_ref())
            .and_then(|l| l.get(labels::DEPLOYMENT))
            .cloned()
            .unwrap_or_default();
        let call = node_exec::Call {
            node: &node_id,
            container: &container,
            cmd,
            service: id.as_str(),
            deployment: &deployment,
        };
        self.exec_on_node(&call, &node).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bollard::models::{NodeDescription, NodeSpec, NodeStatus};

    #[test]
    fn a_node_that_holds_a_persistent_sandboxs_data_and_cannot_run_it_is_named_with_what_to_do() {
        let node = |state: Option<NodeState>, availability| Node {
            id: Some("n1".into()),
            description: Some(NodeDescription {
                hostname: Some("box-a".into()),
                ..Default::default()
            }),
            status: state.map(|state| NodeStatus {
                state: Some(state),
                ..Default::default()
            }),
            spec: Some(NodeSpec {
                availability: Some(availability),
                ..Default::default()
            }),
            ..Default::default()
        };
        use NodeSpecAvailabilityEnum::{ACTIVE, DRAIN, PAUSE};
        for (n, says) in [
            (node(Some(NodeState::READY), ACTIVE), None),
            (
                node(Some(NodeState::READY), DRAIN),
                Some("box-a, which is set to drain (make it active again: docker node update --availability active box-a)"),
            ),
            (node(Some(NodeState::READY), PAUSE), Some("which is set to pause")),
            (node(Some(NodeState::DOWN), ACTIVE), Some("box-a, which is down")),
            (
                Node {
                    id: Some("n1".into()),
                    ..Default::default()
                },
                Some("node n1, which is no longer in the Swarm"),
            ),
        ] {
            let said = unavailable(&n);
            match says {
                None => assert_eq!(said, None),
                Some(part) => {
                    let said = said.expect("a reason");
                    assert!(said.contains(part), "{part:?} in {said}");
                    assert!(said.contains("release the sandbox"), "{said}");
                }
            }
        }
    }

    #[test]
    fn service_names_are_short_dotless_and_distinct_for_distinct_containers() {
        let long = format!("sandboxd.{}.{}.postgres", "d".repeat(63), "s".repeat(63));
        for name in [
            "sandboxd.default.agent-7.postgres",
            "sandboxd.a-b.c.redis",
            long.as_str(),
        ] {
            let s = docker_name(name);
            assert!(s.len() <= 63, "{s}");
            assert!(!s.contains('.'), "{s}");
            assert!(s.chars().next().unwrap().is_ascii_alphanumeric(), "{s}");
        }
        assert_ne!(
            docker_name("sandboxd.a-b.c.redis"),
            docker_name("sandboxd.a.b-c.redis")
        );
        assert_eq!(
            docker_name("sandboxd.default.agent-7.postgres"),
            docker_name("sandboxd.default.agent-7.postgres")
        );
        assert!(docker_name("sandboxd.default.agent-7.postgres")
            .starts_with("sandboxd-default-agent-7-postgres-"));
    }
}
