//! The Docker adapter: [`Runtime`] over bollard, speaking in sandboxd's
//! terms (managed containers, specs, teardown) and turning Docker's errors
//! into messages an operator can act on.

use crate::domain::container::{ContainerState, ExecOutput, ObservedContainer, RunState};
use crate::domain::id::{ContainerId, Deployment, SandboxId};
use crate::domain::labels::{self, ContainerLabels};
use crate::metrics::{self, DockerCall};
use crate::ports::runtime::{
    ContainerAction, ContainerSpec, EventStream, Runtime, RuntimeError, RuntimeEvent,
};
use async_trait::async_trait;
use bollard::errors::Error as DockerError;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::models::{
    ContainerCreateBody, ContainerSummaryStateEnum, HostConfig, NetworkCreateRequest, PortBinding,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, CreateImageOptionsBuilder, EventsOptionsBuilder,
    InspectContainerOptions, ListContainersOptionsBuilder, ListNetworksOptionsBuilder,
    LogsOptionsBuilder, RemoveContainerOptionsBuilder, StopContainerOptionsBuilder,
};
use bollard::Docker;
use chrono::{TimeZone, Utc};
use futures::StreamExt;
use std::collections::HashMap;
use std::time::Duration;

fn api<'a>(op: &'static str, target: &'a str) -> impl FnOnce(DockerError) -> RuntimeError + 'a {
    move |source| RuntimeError::Api {
        op,
        target: target.to_owned(),
        source: Box::new(source),
    }
}

fn is_status(e: &DockerError, codes: &[u16]) -> bool {
    matches!(e, DockerError::DockerResponseServerError { status_code, .. } if codes.contains(status_code))
}

/// The local Docker daemon as a [`Runtime`].
#[derive(Debug, Clone)]
pub struct DockerRuntime {
    docker: Docker,
}

impl DockerRuntime {
    /// Connects to the local Docker daemon and negotiates the API version
    /// (the engine may be older than bollard's default, e.g. 20.10 = API 1.41).
    pub async fn connect() -> Result<Self, RuntimeError> {
        let connect = |e: DockerError| RuntimeError::Connect(Box::new(e));
        let docker = Docker::connect_with_local_defaults().map_err(connect)?;
        let docker = docker.negotiate_version().await.map_err(connect)?;
        docker.ping().await.map_err(connect)?;
        Ok(Self { docker })
    }

    /// Ids of the networks called exactly `name`.
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
    let state = match summary.state? {
        ContainerSummaryStateEnum::CREATED => ContainerState::Created,
        ContainerSummaryStateEnum::RUNNING
        | ContainerSummaryStateEnum::PAUSED
        | ContainerSummaryStateEnum::RESTARTING => ContainerState::Running,
        ContainerSummaryStateEnum::REMOVING => ContainerState::Removing,
        _ => ContainerState::Exited,
    };
    let host_port = summary
        .ports
        .unwrap_or_default()
        .iter()
        .find_map(|p| p.public_port);
    Some(ObservedContainer {
        id: ContainerId::new(summary.id?),
        name: summary.names?.first()?.trim_start_matches('/').to_owned(),
        labels,
        state,
        created: Utc.timestamp_opt(summary.created?, 0).single()?,
        host_port,
    })
}

#[async_trait]
impl Runtime for DockerRuntime {
    async fn ping(&self) -> Result<(), RuntimeError> {
        self.docker
            .ping()
            .await
            .map(|_| ())
            .map_err(|e| RuntimeError::Connect(Box::new(e)))
    }

    async fn list(
        &self,
        deployment: &Deployment,
        sandbox: Option<&SandboxId>,
    ) -> Result<Vec<ObservedContainer>, RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::List);
        let filters = HashMap::from([("label", labels::filters(deployment, sandbox))]);
        let options = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        let summaries = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(api("list", deployment.as_str()))?;
        Ok(summaries
            .into_iter()
            .filter_map(|s| observed(s, deployment))
            .collect())
    }

    /// Creates the network if it does not exist (a user-defined bridge, so
    /// containers resolve each other by name).
    ///
    /// Docker allows two networks with one name, so concurrent creators may
    /// race: afterwards every creator keeps the network with the smallest id
    /// and removes the others, so all converge on the same one.
    async fn ensure_network(&self, name: &str) -> Result<(), RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::Network);
        let mut ids = self.networks_named(name).await?;
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
            self.docker
                .create_network(request)
                .await
                .map_err(api("create network", name))?;
            ids = self.networks_named(name).await?;
        }
        ids.sort();
        for duplicate in ids.iter().skip(1) {
            match self.docker.remove_network(duplicate).await {
                Ok(()) => {}
                Err(e) if is_status(&e, &[404]) => {}
                Err(e) => return Err(api("remove duplicate network", name)(e)),
            }
        }
        Ok(())
    }

    async fn image_exists(&self, image: &str) -> Result<bool, RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::InspectImage);
        match self.docker.inspect_image(image).await {
            Ok(_) => Ok(true),
            Err(e) if is_status(&e, &[404]) => Ok(false),
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
        while let Some(item) = stream.next().await {
            item.map_err(|e| RuntimeError::ImageUnavailable {
                image: image.to_owned(),
                reason: e.to_string(),
            })?;
        }
        Ok(())
    }

    async fn create_and_start(&self, spec: &ContainerSpec) -> Result<ContainerId, RuntimeError> {
        self.remove_any(&spec.name, Duration::ZERO).await?;
        let _timer = metrics::time_docker_call(DockerCall::Create);
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
        let created = self
            .docker
            .create_container(Some(options), body)
            .await
            .map_err(api("create", &spec.name))?;
        if let Err(e) = self.docker.start_container(&created.id, None).await {
            // Do not leave a created-but-never-started container behind.
            let _ = self.remove_any(&created.id, Duration::ZERO).await;
            return Err(api("start", &spec.name)(e));
        }
        Ok(ContainerId::new(created.id))
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
                Ok(Some(RunState {
                    running: state.running.unwrap_or(false),
                    oom_killed: state.oom_killed.unwrap_or(false),
                }))
            }
            Err(e) if is_status(&e, &[404]) => Ok(None),
            Err(e) => Err(api("inspect", id.as_str())(e)),
        }
    }

    async fn remove(&self, id: &ContainerId, stop_timeout: Duration) -> Result<(), RuntimeError> {
        self.remove_any(id.as_str(), stop_timeout).await
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
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(api("logs", id.as_str()))?;
            out.push_str(&String::from_utf8_lossy(&chunk.into_bytes()));
        }
        Ok(out.trim_end().to_owned())
    }

    async fn exec(
        &self,
        id: &ContainerId,
        cmd: &[&str],
        env: Vec<String>,
    ) -> Result<ExecOutput, RuntimeError> {
        let _timer = metrics::time_docker_call(DockerCall::Exec);
        let created = self
            .docker
            .create_exec(
                id.as_str(),
                CreateExecOptions {
                    cmd: Some(cmd.iter().map(|s| s.to_string()).collect()),
                    env: Some(env),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    ..Default::default()
                },
            )
            .await
            .map_err(api("exec", id.as_str()))?;
        let mut output = String::new();
        if let StartExecResults::Attached {
            output: mut stream, ..
        } = self
            .docker
            .start_exec(&created.id, None::<StartExecOptions>)
            .await
            .map_err(api("exec", id.as_str()))?
        {
            while let Some(Ok(chunk)) = stream.next().await {
                output.push_str(&String::from_utf8_lossy(&chunk.into_bytes()));
            }
        }
        let exit_code = self
            .docker
            .inspect_exec(&created.id)
            .await
            .map_err(api("exec inspect", id.as_str()))?
            .exit_code
            .unwrap_or(-1);
        Ok(ExecOutput { exit_code, output })
    }

    fn events(&self, deployment: &Deployment, since: Option<i64>) -> EventStream {
        let filters = HashMap::from([
            ("type", vec!["container".to_owned()]),
            (
                "label",
                vec![format!("{}={deployment}", labels::DEPLOYMENT)],
            ),
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
        self.docker
            .events(Some(options.build()))
            .filter_map(|item| async move {
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
                            container: ContainerId::new(actor.id?),
                            action,
                            sandbox,
                            time: event.time,
                        }))
                    }
                }
            })
            .boxed()
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
