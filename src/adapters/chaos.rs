//! The faults `sandboxd chaos` and the chaos tests inject into sandbox
//! containers, through the Docker API, each with a deadline: kill, stop,
//! remove, and a real out-of-memory kill (the engine's tmpfs data directory
//! filled until the container's memory cap is hit).

use super::docker::DockerRuntime;
use crate::domain::id::ContainerId;
use crate::ports::runtime::{Commands, RuntimeError};
use bollard::models::ContainerSummaryStateEnum;
use bollard::query_parameters::{
    KillContainerOptionsBuilder, ListContainersOptionsBuilder, RemoveContainerOptionsBuilder,
    StopContainerOptionsBuilder,
};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::time::Duration;

/// Bound on one fault.
const FAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// A fault injected into one container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    /// `docker kill` (SIGKILL).
    Kill,
    /// `docker stop` (SIGTERM, SIGKILL after a second).
    Stop,
    /// `docker rm -f`.
    Remove,
    /// The data tmpfs filled until the kernel OOM-kills the engine.
    Oom,
}

impl Fault {
    /// Every fault.
    pub const ALL: [Fault; 4] = [Fault::Kill, Fault::Stop, Fault::Remove, Fault::Oom];

    /// Its name (`kill`, `stop`, `remove`, `oom`).
    pub fn as_str(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Stop => "stop",
            Fault::Remove => "remove",
            Fault::Oom => "oom",
        }
    }

    /// Parses a name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.as_str() == s)
    }
}

/// A container a name filter found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    /// Its id.
    pub id: ContainerId,
    /// Its name, without the leading slash.
    pub name: String,
    /// Whether it runs.
    pub running: bool,
}

/// Injects faults through a Docker connection.
pub struct Injector {
    docker: DockerRuntime,
}

async fn bounded<T>(
    what: &'static str,
    target: &str,
    f: impl Future<Output = Result<T, bollard::errors::Error>>,
) -> Result<T, RuntimeError> {
    match tokio::time::timeout(FAULT_TIMEOUT, f).await {
        Ok(r) => r.map_err(|e| RuntimeError::Api {
            op: what,
            target: target.to_owned(),
            source: Box::new(e),
        }),
        Err(_) => Err(RuntimeError::Timeout {
            op: what,
            target: target.to_owned(),
            after: FAULT_TIMEOUT,
        }),
    }
}

impl Injector {
    /// An injector over `docker`.
    pub fn new(docker: DockerRuntime) -> Self {
        Self { docker }
    }

    /// Injects `fault` into the container `name`; `data_path` is the
    /// engine's data directory (for [`Fault::Oom`]).
    pub async fn inject(
        &self,
        fault: Fault,
        name: &str,
        data_path: &str,
    ) -> Result<(), RuntimeError> {
        let docker = self.docker.client();
        match fault {
            Fault::Kill => {
                let opts = KillContainerOptionsBuilder::default()
                    .signal("KILL")
                    .build();
                bounded("kill", name, docker.kill_container(name, Some(opts))).await
            }
            Fault::Stop => {
                let opts = StopContainerOptionsBuilder::default().t(1).build();
                bounded("stop", name, docker.stop_container(name, Some(opts))).await
            }
            Fault::Remove => {
                let opts = RemoveContainerOptionsBuilder::default()
                    .force(true)
                    .v(true)
                    .build();
                bounded("remove", name, docker.remove_container(name, Some(opts))).await
            }
            Fault::Oom => {
                // The fill is killed with the engine: its exit code says
                // nothing, the container's state does.
                let fill = format!("cat /dev/zero > {data_path}/.chaos-fill");
                let id = ContainerId::new(name);
                let cmd = ["sh", "-c", fill.as_str()];
                let exec = self.docker.exec(&id, &cmd, Vec::new());
                match tokio::time::timeout(FAULT_TIMEOUT, exec).await {
                    Ok(r) => r.map(drop),
                    Err(_) => Err(RuntimeError::Timeout {
                        op: "oom fill",
                        target: name.to_owned(),
                        after: FAULT_TIMEOUT,
                    }),
                }
            }
        }
    }

    /// The containers Docker's name filter `selector` finds (see
    /// `domain::network::container_selector`), any state, as (id, name
    /// without the leading slash, state).
    pub async fn named(&self, selector: &str) -> Result<Vec<Named>, RuntimeError> {
        let filters = HashMap::from([("name", vec![selector.to_owned()])]);
        let opts = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        let listed = bounded(
            "list",
            selector,
            self.docker.client().list_containers(Some(opts)),
        )
        .await?;
        Ok(listed
            .into_iter()
            .filter_map(|c| {
                Some(Named {
                    name: c.names?.first()?.trim_start_matches('/').to_owned(),
                    id: ContainerId::new(c.id?),
                    running: c.state == Some(ContainerSummaryStateEnum::RUNNING),
                })
            })
            .collect())
    }

    /// Every container on the host that `deployment` does not own, as
    /// name → (id, state): what chaos must leave as it was.
    pub async fn others(
        &self,
        deployment: &str,
    ) -> Result<BTreeMap<String, (String, String)>, RuntimeError> {
        let opts = ListContainersOptionsBuilder::default().all(true).build();
        let listed = bounded(
            "list",
            "every container",
            self.docker.client().list_containers(Some(opts)),
        )
        .await?;
        Ok(listed
            .into_iter()
            .filter(|c| {
                c.labels
                    .as_ref()
                    .and_then(|l| l.get(crate::domain::labels::DEPLOYMENT))
                    .map(String::as_str)
                    != Some(deployment)
            })
            .filter_map(|c| {
                let name = c.names?.first()?.trim_start_matches('/').to_owned();
                Some((
                    name,
                    (
                        c.id.unwrap_or_default(),
                        c.state.map(|s| s.to_string()).unwrap_or_default(),
                    ),
                ))
            })
            .collect())
    }
}
